package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// stateDirOf runs a command that fails on a missing session and returns
// the state directory its message names (where the CLI looked).
func stateDirOf(t *testing.T, args ...string) string {
	t.Helper()
	_, errs, code := runCLI(t, append(args, "sandbox", "exec", "no-such-session", "--", "true")...)
	_, rest, ok := strings.Cut(errs, "no saved state in ")
	if code != 1 || !ok {
		t.Fatalf("%v: exit %d, %q", args, code, errs)
	}
	dir, _, _ := strings.Cut(rest, ";")
	return filepath.Dir(dir) // .../sessions
}

// TestContextsUseListAndPrecedence: contexts are made, listed and chosen,
// the file is its owner's only, and a setting comes from its flag, else
// its variable, else --context, else the current context.
func TestContextsUseListAndPrecedence(t *testing.T) {
	cfgFile := hermeticConfig(t)
	base := t.TempDir()
	dirA, dirB, dirEnv, dirFlag := filepath.Join(base, "a"), filepath.Join(base, "b"), filepath.Join(base, "env"), filepath.Join(base, "flag")
	for _, args := range [][]string{
		{"context", "set", "alpha", "--provider", "local", "--state-dir", dirA},
		{"context", "set", "beta", "--state-dir", dirB, "--namespace", "team"},
		{"context", "use", "beta"},
	} {
		if out, errs, code := runCLI(t, args...); code != 0 {
			t.Fatalf("%v: exit %d, %q %q", args, code, out, errs)
		}
	}
	fi, err := os.Stat(cfgFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the config file under $XDG_CONFIG_HOME: %v, %v; want mode 0600", fi, err)
	}
	out, _, _ := runCLI(t, "context", "list")
	if !strings.Contains(out, "*        beta") || !strings.Contains(out, "alpha") {
		t.Errorf("context list:\n%s", out)
	}
	if out, _, _ := runCLI(t, "context", "show"); !strings.Contains(out, "context: beta") || !strings.Contains(out, "namespace: team") {
		t.Errorf("context show:\n%s", out)
	}
	if got := stateDirOf(t); got != dirB {
		t.Errorf("the current context's state dir: %s, want %s", got, dirB)
	}
	if got := stateDirOf(t, "--context", "alpha"); got != dirA {
		t.Errorf("--context alpha: %s, want %s", got, dirA)
	}
	t.Setenv(stateDirEnv, dirEnv)
	if got := stateDirOf(t, "--context", "alpha"); got != dirEnv {
		t.Errorf("$%s over the context: %s, want %s", stateDirEnv, got, dirEnv)
	}
	if got := stateDirOf(t, "--state-dir", dirFlag); got != dirFlag {
		t.Errorf("--state-dir over the variable: %s, want %s", got, dirFlag)
	}
	t.Setenv(stateDirEnv, "")

	// $BULKHEAD_CONFIG names another file.
	other := filepath.Join(t.TempDir(), "other.yaml")
	t.Setenv(configEnv, other)
	if out, _, code := runCLI(t, "context", "list"); code != 0 || strings.Contains(out, "beta") {
		t.Errorf("$%s: exit %d\n%s", configEnv, code, out)
	}
	t.Setenv(configEnv, "")

	// An unknown name fails, with the nearest; delete clears the current.
	if _, errs, code := runCLI(t, "context", "use", "bta"); code != 1 || !strings.Contains(errs, `did you mean "beta"`) {
		t.Errorf("use of an unknown context: exit %d, %q", code, errs)
	}
	if _, errs, code := runCLI(t, "--context", "gamma", "sandbox", "ls"); code != 1 || !strings.Contains(errs, `no context "gamma"`) {
		t.Errorf("--context gamma: exit %d, %q", code, errs)
	}
	runCLI(t, "context", "delete", "beta")
	if out, _, _ := runCLI(t, "context", "list"); strings.Contains(out, "beta") || strings.Contains(out, "*") {
		t.Errorf("after delete:\n%s", out)
	}
}

// TestContextServer: a context's server and token file are used by the
// sandbox commands, and its token goes to that server only.
func TestContextServer(t *testing.T) {
	hermeticConfig(t)
	tok := writeToken(t, "tok-context-0123456789", 0o644)
	if _, errs, code := runCLI(t, "context", "set", "svc", "--server", "http://127.0.0.1:9", "--server-token-file", tok); code != 0 {
		t.Fatal(errs)
	}
	runCLI(t, "context", "use", "svc")
	// The token file comes from the context (and is refused: mode 0644).
	if _, errs, code := runCLI(t, "sandbox", "ls"); code != 1 || !strings.Contains(errs, "the context's server-token-file") || !strings.Contains(errs, "chmod 600") {
		t.Errorf("the context's token file: exit %d, %q", code, errs)
	}
	// Another server given by flag does not get the context's token.
	if _, errs, code := runCLI(t, "--server", "http://127.0.0.1:10", "sandbox", "ls"); code != 1 || !strings.Contains(errs, "needs a token") {
		t.Errorf("--server with a context's token file: exit %d, %q", code, errs)
	}
}

// TestContextConfigErrors: a malformed config file is refused with the
// line of the fault, by every command that reads it.
func TestContextConfigErrors(t *testing.T) {
	cfgFile := hermeticConfig(t)
	if err := os.MkdirAll(filepath.Dir(cfgFile), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ doc, want string }{
		{"current-context: a\ncontexts:\n  - name: a\n    provider: local\n   state-dir: /x\n", ":5: invalid YAML"},
		{"contexts:\n  - name: a\n    provder: local\n", `:3: unknown key "provder"`},
		{"contexts:\n  - name: a\n  - name: a\n", `:3: context "a" given twice`},
		{"current-context: b\ncontexts:\n  - name: a\n", `:1: current-context "b" names no context`},
		{"contexts:\n  - name: a\n    server: [x]\n", ":3: server: want a string"},
		{"contexts:\n  - name: a b\n", `:2: context name "a b"`},
		{"context: a\n", `:1: unknown key "context"`},
	} {
		if err := os.WriteFile(cfgFile, []byte(c.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"context", "list"}, {"sandbox", "ls"}} {
			_, errs, code := runCLI(t, args...)
			if code != 1 || !strings.Contains(errs, cfgFile+c.want) {
				t.Errorf("%q, %v: exit %d, %q; want %q", c.doc, args, code, errs, c.want)
			}
		}
	}
}

// TestHelpGroupsFlags: a subcommand's help shows its own flags first,
// then the shared ones under their headings; every shared flag has one.
func TestHelpGroupsFlags(t *testing.T) {
	hermeticConfig(t)
	out, _, code := runCLI(t, "sandbox", "exec", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	order := []string{"Flags:", "--workdir", "Provider flags:", "--provider", "Docker flags:", "--image", "Kubernetes flags:", "--kubeconfig", "Service flags:", "--server"}
	_, out, _ = strings.Cut(out, "\nFlags:")
	out = "Flags:" + out
	at := -1
	for _, w := range order {
		i := strings.Index(out, w)
		if i < at {
			t.Errorf("%q is not after %q in:\n%s", w, order, out)
		}
		at = i
	}
	if own, _, _ := strings.Cut(out, "Provider flags:"); strings.Contains(own, "--provider") || strings.Contains(own, "--image") {
		t.Errorf("shared flags among the command's own:\n%s", own)
	}
	root := newRoot(Streams{})
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if flagGroupOf(f) == "" {
			t.Errorf("--%s has no heading in flagGroups", f.Name)
		}
	})
}
