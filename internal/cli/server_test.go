package cli

// The sandbox commands against a real `harness serve` on loopback
// (--server), beside the same commands on local sandboxes: the same
// output and exit codes.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// hermeticConfig points the config file at a temp directory, so no test
// reads the user's own contexts, and clears the variables that would
// choose a server or state directory.
func hermeticConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv(configEnv, "")
	for _, v := range []string{serverEnv, tokenEnv, stateDirEnv, "KUBECONFIG"} {
		t.Setenv(v, "")
	}
	return filepath.Join(dir, "bulkhead", "config.yaml")
}

// writeToken writes a token file of the given mode.
func writeToken(t *testing.T, token string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// serverRun runs the command line against a service.
func serverRun(ctx context.Context, url, tokenFile string) cliRun {
	return func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		base := []string{"--server", url, "--server-token-file", tokenFile}
		code := Execute(ctx, append(base, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		return code, out.String(), errb.String()
	}
}

// TestSandboxServerMatchesLocal runs create, exec, cp (files and
// directories, both ways), ls and rm on local sandboxes and through a
// real service, and wants the same output and exit codes: a failing
// command's exit code, a missing sandbox's, and what cp moves.
func TestSandboxServerMatchesLocal(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	hermeticConfig(t)
	s := launchServe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	modes := map[string]cliRun{
		"local":  newCLIRun(ctx, testenv.SearchableTempDir(t), agentdtest.Binaries(t).Agentd),
		"server": serverRun(ctx, s.url, writeToken(t, s.token, 0o600)),
	}
	src := t.TempDir()
	writeTree(t, src, map[string]string{"tree/a.txt": "alpha\n", "tree/sub/b.txt": "beta\n", "note.txt": "a note\n"})
	type result struct {
		code           int
		stdout, stderr string
	}
	got := map[string]map[string]result{}
	for mode, run := range modes {
		got[mode] = map[string]result{}
		record := func(step string, args ...string) result {
			code, out, errs := run(args...)
			got[mode][step] = result{code, out, errs}
			return got[mode][step]
		}
		id := strings.TrimSpace(mustRun(t, run, "sandbox", "create", "--ttl", "10m"))
		if id == "" || strings.Contains(id, "\n") {
			t.Fatalf("%s: create printed %q", mode, id)
		}
		record("exec-fails", "sandbox", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
		record("exec-workdir", "sandbox", "exec", id, "--", "sh", "-c", "mkdir -p w && cd w && pwd | sed 's|.*/||'")
		// --tty: through the service, the OpenTerminal stream (h2c).
		record("exec-tty", "sandbox", "exec", id, "--tty", "--", "sh", "-c", "test -t 1 && echo on-a-tty; exit 4")
		record("missing", "sandbox", "exec", "sbx-0123456789abcdef01234567", "--", "true")
		record("bad-id", "sandbox", "exec", "no/such", "--", "true")
		record("cp-file-in", "sandbox", "cp", filepath.Join(src, "note.txt"), id+":")
		record("cp-dir-in", "sandbox", "cp", filepath.Join(src, "tree"), id+":copied")
		record("cat", "sandbox", "exec", id, "--", "sh", "-c", "cat note.txt copied/a.txt copied/sub/b.txt")
		out := t.TempDir()
		record("cp-dir-out", "sandbox", "cp", id+":copied", filepath.Join(out, "tree"))
		sameTree(t, mode+": the directory copied out", readTree(t, filepath.Join(out, "tree")),
			map[string]string{"a.txt": "alpha\n", "sub/": "", "sub/b.txt": "beta\n"})
		record("cp-file-out", "sandbox", "cp", id+":copied/sub/b.txt", out+"/")
		if b, err := os.ReadFile(filepath.Join(out, "b.txt")); err != nil || string(b) != "beta\n" {
			t.Errorf("%s: the file copied out: %q, %v", mode, b, err)
		}
		record("cp-missing-out", "sandbox", "cp", id+":nothing-here", filepath.Join(out, "x"))
		if ls := record("ls", "sandbox", "ls"); !strings.Contains(ls.stdout, id) || !strings.HasPrefix(ls.stdout, "SESSION") {
			t.Errorf("%s: ls lacks %s:\n%s", mode, id, ls.stdout)
		}
		if rm := record("rm", "sandbox", "rm", id); rm.stdout != "removed session "+id+"\n" {
			t.Errorf("%s: rm printed %q", mode, rm.stdout)
		}
		got[mode]["rm"] = result{got[mode]["rm"].code, "", ""}
		record("exec-after-rm", "sandbox", "exec", id, "--", "true")
	}
	for step, l := range got["local"] {
		r := got["server"][step]
		if l.code != r.code {
			t.Errorf("%s: exit %d locally, %d through the server (stderr %q / %q)", step, l.code, r.code, l.stderr, r.stderr)
		}
		if step != "ls" && l.stdout != r.stdout {
			t.Errorf("%s: stdout %q locally, %q through the server", step, l.stdout, r.stdout)
		}
	}
	want := map[string]result{
		"exec-fails":   {3, "out\n", "err\n"},
		"exec-workdir": {0, "w\n", ""},
		"exec-tty":     {4, "on-a-tty\r\n", ""},
		"cat":          {0, "a note\nalpha\nbeta\n", ""},
	}
	for step, w := range want {
		if r := got["server"][step]; r != w {
			t.Errorf("%s through the server: %+v, want %+v", step, r, w)
		}
	}
	for _, step := range []string{"missing", "exec-after-rm"} {
		if r := got["server"][step]; r.code != 1 || !strings.Contains(r.stderr, "no sandbox") || !strings.Contains(r.stderr, "harness sandbox ls") {
			t.Errorf("%s through the server: exit %d, %q", step, r.code, r.stderr)
		}
	}
	if r := got["server"]["bad-id"]; r.code != 1 || !strings.Contains(r.stderr, "is not a sandbox id") {
		t.Errorf("a malformed id through the server: exit %d, %q", r.code, r.stderr)
	}
	if r := got["server"]["cp-missing-out"]; r.code != 1 || !strings.Contains(r.stderr, "nothing-here") {
		t.Errorf("copying a missing path out: exit %d, %q", r.code, r.stderr)
	}
}

// TestSandboxServerToken: a wrong token is refused with the flag to fix,
// and never printed; a token file others may read is refused before any
// request; the token reaches the server from $BULKHEAD_TOKEN too.
func TestSandboxServerToken(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	hermeticConfig(t)
	s := launchServe(t)
	ctx := s.ctx
	const wrong = "tok-wrong-0123456789-secret"
	code, out, errs := serverRun(ctx, s.url, writeToken(t, wrong, 0o600))("sandbox", "ls")
	if code != 1 || !strings.Contains(errs, "refused the token") || !strings.Contains(errs, "--server-token-file") {
		t.Errorf("a wrong token: exit %d, %q %q", code, out, errs)
	}
	if strings.Contains(out+errs, wrong) {
		t.Errorf("the token was printed: %q %q", out, errs)
	}
	code, _, errs = serverRun(ctx, s.url, writeToken(t, s.token, 0o644))("sandbox", "ls")
	if code != 1 || !strings.Contains(errs, "readable by group or others") || !strings.Contains(errs, "chmod 600") || strings.Contains(errs, s.token) {
		t.Errorf("a token file of mode 0644: exit %d, %q", code, errs)
	}
	t.Setenv(tokenEnv, s.token)
	var o, e bytes.Buffer
	if code := Execute(ctx, []string{"--server", s.url, "sandbox", "ls", "--json"}, Streams{In: strings.NewReader(""), Out: &o, Err: &e}); code != 0 || strings.TrimSpace(o.String()) != "[]" {
		t.Errorf("$%s: exit %d, %q %q", tokenEnv, code, o.String(), e.String())
	}
}

// TestSandboxServerPauseSnapshotFork: pause, resume, snapshot and fork
// through the service's calls; fork without a server says what it needs.
func TestSandboxServerPauseSnapshotFork(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	hermeticConfig(t)
	s := launchServe(t)
	run := serverRun(s.ctx, s.url, writeToken(t, s.token, 0o600))
	id := strings.TrimSpace(mustRun(t, run, "sandbox", "create"))
	mustRun(t, run, "sandbox", "exec", id, "--", "sh", "-c", "echo kept > kept.txt")
	snap := strings.TrimSpace(mustRun(t, run, "sandbox", "snapshot", id))
	if snap == "" || strings.Contains(snap, " ") {
		t.Errorf("snapshot printed %q", snap)
	}
	// The service's snapshots, not a local store's: listed, removed, gc
	// refused (the service keeps them under a quota).
	if out := mustRun(t, run, "sandbox", "snapshot", "ls"); !strings.Contains(out, "SNAPSHOT") || !strings.Contains(out, snap) {
		t.Errorf("snapshot ls through the server: %q, want %s", out, snap)
	}
	if out := mustRun(t, run, "sandbox", "snapshot", "rm", snap); out != "removed snapshot "+snap+"\n" {
		t.Errorf("snapshot rm through the server: %q", out)
	}
	if out := mustRun(t, run, "sandbox", "snapshot", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("snapshot ls --json after rm: %q", out)
	}
	if code, _, errs := run("sandbox", "snapshot", "rm", snap); code != 1 || !strings.Contains(errs, "no snapshot "+snap) {
		t.Errorf("rm of a removed snapshot: exit %d, %q", code, errs)
	}
	if code, _, errs := run("sandbox", "snapshot", "gc"); code == 0 || !strings.Contains(errs, "not through a server") {
		t.Errorf("gc through a server: exit %d, %q", code, errs)
	}
	forks := strings.Fields(mustRun(t, run, "sandbox", "fork", id, "--count", "2"))
	if len(forks) != 2 || forks[0] == forks[1] {
		t.Fatalf("fork --count 2 printed %v", forks)
	}
	for _, f := range forks {
		if out := mustRun(t, run, "sandbox", "exec", f, "--", "cat", "kept.txt"); out != "kept\n" {
			t.Errorf("fork %s: kept.txt %q", f, out)
		}
	}
	if out := mustRun(t, run, "sandbox", "pause", id); !strings.Contains(out, "session "+id+": paused with") {
		t.Errorf("pause printed %q", out)
	}
	if out := mustRun(t, run, "sandbox", "resume", id); !strings.Contains(out, "session "+id+": ") {
		t.Errorf("resume printed %q", out)
	}
	if out := mustRun(t, run, "sandbox", "exec", id, "--", "cat", "kept.txt"); out != "kept\n" {
		t.Errorf("after resume: kept.txt %q", out)
	}
	if code, _, errs := run("sandbox", "pause", "sbx-0123456789abcdef01234567"); code != 1 || !strings.Contains(errs, "no sandbox") {
		t.Errorf("pause of a missing sandbox: exit %d, %q", code, errs)
	}
	if _, errs, code := runCLI(t, "sandbox", "fork", "x"); code != 1 || !strings.Contains(errs, "fork needs a server") {
		t.Errorf("fork without a server: exit %d, %q", code, errs)
	}
}

// TestServerURLChecks: a token never crosses the network in the clear
// unless asked: http is for loopback, or --insecure-server.
func TestServerURLChecks(t *testing.T) {
	for _, c := range []struct {
		url      string
		insecure bool
		ok       bool
	}{
		{"https://bulkhead.example.com", false, true},
		{"http://127.0.0.1:8080/", false, true},
		{"http://[::1]:8080", false, true},
		{"http://localhost:1", false, true},
		{"http://bulkhead.example.com", false, false},
		{"http://bulkhead.example.com", true, true},
		{"ftp://bulkhead.example.com", false, false},
		{"bulkhead.example.com:443", false, false},
		{"https://user:pw@bulkhead.example.com", false, false},
	} {
		_, err := checkServerURL(c.url, c.insecure)
		if (err == nil) != c.ok {
			t.Errorf("%s (insecure %v): %v", c.url, c.insecure, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
	hermeticConfig(t)
	_, errs, code := runCLI(t, "--server", "http://bulkhead.example.com", "--server-token-file", writeToken(t, "tok-0123456789", 0o600), "sandbox", "ls")
	if code != 1 || !strings.Contains(errs, "--insecure-server") {
		t.Errorf("plain http off loopback: exit %d, %q", code, errs)
	}
}
