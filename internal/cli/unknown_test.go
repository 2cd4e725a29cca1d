package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestUnknownSubcommand: a word that names no subcommand fails with exit 2,
// "unknown command" and the nearest name, and nothing on stdout; the group
// alone still prints its help and succeeds.
func TestUnknownSubcommand(t *testing.T) {
	state := t.TempDir()
	cases := []struct {
		args      []string
		near      string // "" when no name is near
		wantInMsg string
	}{
		{[]string{"sandbox", "exce"}, `"exec"`, `unknown command "exce"`},
		{[]string{"sandbox", "rmm"}, `"rm"`, `unknown command "rmm"`},
		{[]string{"sandbox", "frobnicate"}, "", `unknown command "frobnicate"`},
		{[]string{"snadbox"}, `"sandbox"`, `unknown command "snadbox"`},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := Execute(t.Context(), append([]string{"--state-dir", state}, c.args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		msg := errb.String()
		if code != 2 || !strings.Contains(msg, c.wantInMsg) || out.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 with %q and no output", c.args, code, out.String(), msg, c.wantInMsg)
		}
		if c.near != "" && !strings.Contains(msg, "did you mean "+c.near) {
			t.Errorf("%v: stderr %q does not suggest %s", c.args, msg, c.near)
		}
		if c.near == "" && strings.Contains(msg, "did you mean") {
			t.Errorf("%v: stderr %q suggests a name that is not near", c.args, msg)
		}
	}
	var out, errb bytes.Buffer
	if code := Execute(t.Context(), []string{"--state-dir", state, "sandbox"}, Streams{In: strings.NewReader(""), Out: &out, Err: &errb}); code != 0 || !strings.Contains(out.String(), "Available Commands") {
		t.Errorf("harness sandbox: exit %d, stdout %q; want its help and exit 0", code, out.String())
	}
}

func TestNearestName(t *testing.T) {
	names := []string{"create", "ls", "exec", "shell", "cp", "snapshot", "resume", "rm", "sync"}
	for word, want := range map[string]string{"crate": "create", "exex": "exec", "resum": "resume", "x": "", "snap": "snapshot", "zzzzzz": ""} {
		if got := nearestName(word, names); got != want {
			t.Errorf("nearestName(%q) = %q, want %q", word, got, want)
		}
	}
}

// TestStateDirFromEnvironment: BULKHEAD_STATE_DIR is the state directory
// when --state-dir is not given, and the flag still wins.
func TestStateDirFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(stateDirEnv, dir)
	root := newRoot(Streams{In: strings.NewReader(""), Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	if f := root.PersistentFlags().Lookup("state-dir"); f == nil || f.Value.String() != dir {
		t.Fatalf("--state-dir defaults to %v, want %s from %s", f, dir, stateDirEnv)
	}
	other := t.TempDir()
	if err := root.PersistentFlags().Parse([]string{"--state-dir", other}); err != nil {
		t.Fatal(err)
	}
	if got := root.PersistentFlags().Lookup("state-dir").Value.String(); got != other {
		t.Errorf("--state-dir %s gave %s", other, got)
	}
}
