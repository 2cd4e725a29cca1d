package cli

// The sandbox commands against real local sandboxes: the tests build
// sandbox-agentd once (agentdtest) and drive `harness sandbox ...` through Execute.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// TestMain points the config file of contexts at an empty directory of
// its own, so no test reads the user's own contexts.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "harness-cli-config-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	os.Unsetenv(configEnv)
	code := agentdtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// cliRun runs the harness command line with a state directory and the
// local provider, and returns the exit code, stdout and stderr.
type cliRun func(args ...string) (int, string, string)

func newCLIRun(ctx context.Context, state, agentd string) cliRun {
	return func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		base := []string{"--state-dir", state, "--provider", "local", "--isolation", "none"}
		if agentd != "" {
			base = append(base, "--agentd", agentd)
		}
		code := Execute(ctx, append(base, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		return code, out.String(), errb.String()
	}
}

// mustRun runs a command that must succeed and returns its stdout.
func mustRun(t *testing.T, run cliRun, args ...string) string {
	t.Helper()
	code, out, errs := run(args...)
	if code != 0 {
		t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return out
}

// writeTree writes files (slash paths -> content) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readTree returns the files under dir (slash paths -> content) and its
// directories as "path/" -> "".
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
		case d.IsDir():
			got[rel+"/"] = ""
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			got[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d entries %v, want %d %v", what, len(got), keys(got), len(want), keys(want))
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: %s = %q (present %v), want %q", what, k, g, ok, v)
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestSandboxLifecycle(t *testing.T) {
	testenv.Require(t, testenv.Linux) // local sandboxes
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	run := newCLIRun(t.Context(), state, bin)
	t.Cleanup(func() {
		// t.Context is done by now: remove whatever a failure left running.
		newCLIRun(context.Background(), state, bin)("sandbox", "rm", "t1")
	})
	local := t.TempDir()

	// create
	if out := mustRun(t, run, "sandbox", "create", "--id", "t1", "--ttl", "1h"); out != "t1\n" {
		t.Fatalf("create printed %q, want the session id", out)
	}
	if _, err := os.Stat(filepath.Join(state, "sessions", "t1.json")); err != nil {
		t.Fatalf("create saved no state: %v", err)
	}
	code, _, errs := run("sandbox", "create", "--id", "t1")
	if code == 0 || !strings.Contains(errs, "exists already") {
		t.Fatalf("create of an existing id: exit %d, stderr %q", code, errs)
	}

	// exec: output kept apart, the exit code propagated
	code, out, errs := run("sandbox", "exec", "t1", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if code != 7 || out != "out\n" || errs != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q; want 7, out, err", code, out, errs)
	}
	if out := mustRun(t, run, "sandbox", "exec", "t1", "--workdir", ".", "--", "echo", "hello", "world"); out != "hello world\n" {
		t.Fatalf("exec echo: %q", out)
	}
	if out := mustRun(t, run, "sandbox", "exec", "--tty", "t1", "--", "sh", "-c", "test -t 1 && echo tty"); !strings.Contains(out, "tty") {
		t.Fatalf("exec --tty: not run under a terminal: %q", out)
	}

	// cp in and out: a file and a directory
	file := filepath.Join(local, "note.txt")
	writeTree(t, local, map[string]string{"note.txt": "a note\n"})
	tree := map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/deeper/c.txt": strings.Repeat("c", 70000), "empty/": ""}
	src := filepath.Join(local, "proj")
	writeTree(t, src, map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/deeper/c.txt": tree["sub/deeper/c.txt"]})
	if err := os.Mkdir(filepath.Join(src, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, run, "sandbox", "cp", file, "t1:docs/note.txt")
	mustRun(t, run, "sandbox", "cp", src, "t1:work")
	mustRun(t, run, "sandbox", "exec", "t1", "--", "mkdir", "into")
	mustRun(t, run, "sandbox", "cp", src, "t1:into") // an existing directory: copied inside
	if out := mustRun(t, run, "sandbox", "exec", "t1", "--", "cat", "docs/note.txt", "work/sub/b.txt", "into/proj/a.txt"); out != "a note\nbeta\nalpha\n" {
		t.Fatalf("files copied in: %q", out)
	}
	back := filepath.Join(local, "back.txt")
	mustRun(t, run, "sandbox", "cp", "t1:docs/note.txt", back)
	if b, err := os.ReadFile(back); err != nil || string(b) != "a note\n" {
		t.Fatalf("file copied out: %q, %v", b, err)
	}
	out1 := filepath.Join(local, "out1")
	mustRun(t, run, "sandbox", "cp", "t1:work", out1)
	sameTree(t, "directory copied out", readTree(t, out1), withDirs(tree))
	mustRun(t, run, "sandbox", "cp", "t1:work", out1) // an existing directory: copied inside
	sameTree(t, "directory copied into a directory", readTree(t, filepath.Join(out1, "work")), withDirs(tree))
	code, _, errs = run("sandbox", "cp", "t1:work", out1) // out1/work is not empty now
	if code == 0 || !strings.Contains(errs, "not empty") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("cp into a non-empty directory: exit %d, stderr %q", code, errs)
	}
	sameTree(t, "directory left alone", readTree(t, filepath.Join(out1, "work")), withDirs(tree))

	// shell needs a terminal
	code, _, errs = run("sandbox", "shell", "t1")
	if code == 0 || !strings.Contains(errs, "stdin is not one") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("shell without a terminal: exit %d, stderr %q", code, errs)
	}

	// ls
	var listed []lsEntry
	if err := json.Unmarshal([]byte(mustRun(t, run, "sandbox", "ls", "--json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].SessionID != "t1" || !listed[0].Running || listed[0].Expired || listed[0].StateFile == "" || listed[0].Snapshot || listed[0].TTL != time.Hour {
		t.Fatalf("ls: %+v", listed)
	}

	// snapshot, then remove the sandbox keeping the snapshot
	if out := mustRun(t, run, "sandbox", "snapshot", "t1"); out != "t1\n" {
		t.Fatalf("snapshot printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(state, "snapshots")); err != nil {
		t.Fatal(err)
	}
	mustRun(t, run, "sandbox", "exec", "t1", "--", "sh", "-c", "echo after > after-snapshot.txt")
	mustRun(t, run, "sandbox", "rm", "t1", "--keep-snapshot")
	if _, err := os.Stat(filepath.Join(state, "local", "t1")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rm left the sandbox directory: %v", err)
	}
	out = mustRun(t, run, "sandbox", "ls")
	if !strings.Contains(out, "gone") || !strings.Contains(out, "t1") {
		t.Fatalf("ls after rm --keep-snapshot:\n%s", out)
	}

	// resume rebuilds from the snapshot, files intact
	if out := mustRun(t, run, "sandbox", "resume", "t1"); !strings.Contains(out, "rebuilt") || !strings.Contains(out, "snapshot t1") {
		t.Fatalf("resume: %q", out)
	}
	if out := mustRun(t, run, "sandbox", "resume", "t1"); !strings.Contains(out, "reattached") {
		t.Fatalf("second resume: %q", out)
	}
	if out := mustRun(t, run, "sandbox", "exec", "t1", "--", "cat", "docs/note.txt"); out != "a note\n" {
		t.Fatalf("after resume: %q", out)
	}
	code, _, _ = run("sandbox", "exec", "t1", "--", "test", "-e", "after-snapshot.txt")
	if code != 1 {
		t.Fatalf("a file written after the snapshot survived the rebuild (exit %d)", code)
	}
	out2 := filepath.Join(local, "out2")
	mustRun(t, run, "sandbox", "cp", "t1:work", out2)
	sameTree(t, "directory after resume", readTree(t, out2), withDirs(tree))

	// rm removes the sandbox, the state and the snapshot
	mustRun(t, run, "sandbox", "rm", "t1")
	for _, p := range []string{"sessions/t1.json", "local/t1", "snapshots/t1.snapshot"} {
		if _, err := os.Stat(filepath.Join(state, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after rm, %s: %v", p, err)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(state, "snapshots")); len(entries) != 0 {
		t.Errorf("after rm, snapshots left: %v", entries)
	}
	if out := mustRun(t, run, "sandbox", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("ls after rm: %s", out)
	}
	code, _, errs = run("sandbox", "exec", "t1", "--", "true")
	if code != 1 || !strings.Contains(errs, `no sandbox session "t1"`) {
		t.Fatalf("exec after rm: exit %d, stderr %q", code, errs)
	}
}

// withDirs adds the parent directories of a tree's files as "dir/" keys.
func withDirs(tree map[string]string) map[string]string {
	out := map[string]string{}
	for p, v := range tree {
		if !strings.HasSuffix(p, "/") {
			out[p] = v
		}
		for d := filepath.ToSlash(filepath.Dir(strings.TrimSuffix(p, "/"))); d != "."; d = filepath.ToSlash(filepath.Dir(d)) {
			out[d+"/"] = ""
		}
		if strings.HasSuffix(p, "/") {
			out[p] = ""
		}
	}
	return out
}

func TestSandboxUnknownSessionAndBadInput(t *testing.T) {
	state := testenv.SearchableTempDir(t)
	run := newCLIRun(t.Context(), state, filepath.Join(t.TempDir(), "no-agentd"))
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "exec", "nope", "--", "ls"}, `no sandbox session "nope"`},
		{[]string{"sandbox", "exec", "../etc", "--", "ls"}, "is not a session id"},
		{[]string{"sandbox", "exec", "nope"}, "no command given"},
		{[]string{"sandbox", "exec", "nope", "extra", "--", "ls"}, "one session id before --"},
		{[]string{"sandbox", "snapshot", "nope"}, `no sandbox session "nope"`},
		{[]string{"sandbox", "resume", "nope"}, `no sandbox session "nope"`},
		{[]string{"sandbox", "shell", "nope"}, "stdin is not one"},
		{[]string{"sandbox", "cp", "a", "b"}, "neither a nor b is a sandbox path"},
		{[]string{"sandbox", "cp", "x:a", "y:b"}, "both x:a and y:b are sandbox paths"},
		{[]string{"sandbox", "cp", filepath.Join(state, "missing"), "nope:x"}, "no such file or directory"},
		{[]string{"sandbox", "cp", "nope:x", filepath.Join(state, "out")}, `no sandbox session "nope"`},
		{[]string{"sandbox", "create", "--ttl", "-1h"}, "must not be negative"},
	}
	for _, c := range cases {
		code, out, errs := run(c.args...)
		if code != 1 || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and one line with %q", c.args, code, out, errs, c.want)
		}
	}
	for _, p := range []string{"local", "snapshots", "out"} {
		if entries, _ := os.ReadDir(filepath.Join(state, p)); len(entries) != 0 {
			t.Errorf("bad input left %s/%v", p, entries)
		}
	}
}

func TestParseCpPath(t *testing.T) {
	cases := []struct {
		in   string
		want cpPath
	}{
		{"s1:work/a.txt", cpPath{id: "s1", path: "work/a.txt", remote: true}},
		{"s1:", cpPath{id: "s1", path: ".", remote: true}},
		{"s1:/abs/p", cpPath{id: "s1", path: "/abs/p", remote: true}},
		{"./a:b", cpPath{path: "./a:b"}},
		{"dir/a:b", cpPath{path: "dir/a:b"}},
		{":x", cpPath{path: ":x"}},
		{"plain", cpPath{path: "plain"}},
	}
	for _, c := range cases {
		if got := parseCpPath(c.in); got != c.want {
			t.Errorf("parseCpPath(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// tarOf builds a tar stream of members (a name ending in / is a directory;
// "->" in the content makes a symlink, "=>" a hard link).
func tarOf(t *testing.T, members [][2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		hdr := &tar.Header{Name: m[0], Mode: 0o644, Format: tar.FormatPAX}
		switch {
		case strings.HasSuffix(m[0], "/"):
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		case strings.HasPrefix(m[1], "->"):
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, m[1][2:]
		case strings.HasPrefix(m[1], "=>"):
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, m[1][2:]
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(m[1]))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(m[1])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSubtree(t *testing.T) {
	in := tarOf(t, [][2]string{
		{"./", ""}, {"a/", ""}, {"a/b/", ""}, {"a/b/f.txt", "f"}, {"a/b/in", "->f.txt"}, {"a/b/out", "->../x.txt"},
		{"a/b/abs", "->/etc/passwd"}, {"a/b/hard", "=>a/b/f.txt"}, {"a/b/hardout", "=>a/x.txt"}, {"a/bc.txt", "not me"},
		{"a/x.txt", "x"}, {"a/b/sub/", ""}, {"a/b/sub/g.txt", "g"},
	})
	var out bytes.Buffer
	matched, skipped, err := subtree(bytes.NewReader(in), &out, "a/b")
	if err != nil {
		t.Fatal(err)
	}
	if matched != 9 || skipped != 3 {
		t.Errorf("matched %d, skipped %d; want 9 and 3", matched, skipped)
	}
	tr := tar.NewReader(&out)
	var got []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got = append(got, hdr.Name+"|"+hdr.Linkname+"|"+string(b))
	}
	want := []string{"f.txt||f", "in|f.txt|", "hard|f.txt|", "sub/||", "sub/g.txt||g"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("subtree members:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The whole workspace: everything but links leading out of it.
	out.Reset()
	matched, skipped, err = subtree(bytes.NewReader(in), &out, ".")
	if err != nil || matched != 13 || skipped != 1 {
		t.Errorf("whole workspace: matched %d, skipped %d, %v; want 13, 1", matched, skipped, err)
	}
}

func TestWorkspaceRel(t *testing.T) {
	const root = "/sandbox/workspace"
	for in, want := range map[string]string{"work": "work", "./work/": "work", ".": ".", root: ".", root + "/a/b": "a/b", "a/../b": "b"} {
		if got, err := workspaceRel(root, in); err != nil || got != want {
			t.Errorf("workspaceRel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../x", "/etc", "/sandbox/workspace2/x"} {
		if got, err := workspaceRel(root, in); err == nil {
			t.Errorf("workspaceRel(%q) = %q, want an error", in, got)
		}
	}
}

func TestProgress(t *testing.T) {
	// Not a terminal: nothing at all, and a nil bar is safe to use.
	var buf bytes.Buffer
	p := newProgress(&buf, "cp x", 10<<20)
	if p != nil {
		t.Fatal("progress on a buffer, want none (not a terminal)")
	}
	p.add(5 << 20)
	p.finish()

	// A terminal (forced), with a clock moved by hand.
	clock := time.Unix(1000, 0)
	now := func() time.Time { return clock }
	p = startProgress(&buf, "cp big", 4<<20, now)
	clock = clock.Add(time.Second)
	p.add(1 << 20)
	first := buf.String()
	if !strings.Contains(first, "cp big") || !strings.Contains(first, "1.0 MiB / 4.0 MiB") || !strings.Contains(first, " 25%") || !strings.Contains(first, "1.0 MiB/s") {
		t.Fatalf("first draw %q", first)
	}
	p.add(1 << 20) // same instant: not redrawn
	if buf.String() != first {
		t.Fatalf("redrawn within %v: %q", progressEvery, buf.String())
	}
	clock = clock.Add(time.Second)
	p.add(2 << 20)
	p.finish()
	if s := buf.String(); !strings.Contains(s, "4.0 MiB / 4.0 MiB 100%") || !strings.Contains(s, "2.0 MiB/s") || !strings.HasSuffix(s, "\n") {
		t.Fatalf("final draw %q", s)
	}

	// Small transfers show nothing; unknown totals show once past 1 MiB.
	buf.Reset()
	p = startProgress(&buf, "cp small", 1000, now)
	p.add(1000)
	p.finish()
	if buf.Len() != 0 {
		t.Fatalf("small transfer drew %q", buf.String())
	}
	p = startProgress(&buf, "cp dir", -1, now)
	p.add(1 << 19)
	if buf.Len() != 0 {
		t.Fatalf("unknown total drew before 1 MiB: %q", buf.String())
	}
	clock = clock.Add(time.Second)
	p.add(1 << 20)
	p.finish()
	if s := buf.String(); !strings.Contains(s, "cp dir 1.5 MiB") || strings.Contains(s, "%") {
		t.Fatalf("unknown total drew %q", s)
	}
}

// TestSandboxExecRunsAsManifestUser checks exec runs as the manifest's
// run_as user unless --user says otherwise (it used to run as the daemon's
// own user, root, whatever the manifest said).
func TestSandboxExecRunsAsManifestUser(t *testing.T) {
	testenv.Require(t, testenv.Linux) // local sandboxes
	testenv.Require(t, testenv.Root)  // the daemon runs commands as another user
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	// Plain local sandboxes keep the workspace below the state directory:
	// the run_as user must be able to pass through it (t.TempDir is 0700).
	for d := state; d != filepath.Dir(d) && strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	run := newCLIRun(t.Context(), state, bin)
	t.Cleanup(func() { newCLIRun(context.Background(), state, bin)("sandbox", "rm", "u1") })
	dir := t.TempDir()
	m := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(m, []byte("version: 1\nrun_as: agent\nusers:\n  - name: agent\nentries:\n  notes.txt:\n    type: file\n    content: \"hi\\n\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, run, "sandbox", "create", "--id", "u1", "--manifest", m)
	// notes.txt belongs to run_as; the command must run as the same uid.
	owner := strings.TrimSpace(mustRun(t, run, "sandbox", "exec", "u1", "--user", "root", "--", "stat", "-c", "%u", "notes.txt"))
	if owner == "0" || owner == "" {
		t.Fatalf("notes.txt owned by %q, want the run_as user's uid", owner)
	}
	if got := strings.TrimSpace(mustRun(t, run, "sandbox", "exec", "u1", "--", "id", "-u")); got != owner {
		t.Fatalf("exec ran as uid %s, want the run_as user's %s", got, owner)
	}
	if got := strings.TrimSpace(mustRun(t, run, "sandbox", "exec", "u1", "--user", "root", "--", "id", "-u")); got != "0" {
		t.Fatalf("exec --user root ran as uid %s", got)
	}
	// A file the command creates belongs to run_as too.
	mustRun(t, run, "sandbox", "exec", "u1", "--", "sh", "-c", "echo x > made.txt")
	if got := strings.TrimSpace(mustRun(t, run, "sandbox", "exec", "u1", "--", "stat", "-c", "%u", "made.txt")); got != owner {
		t.Fatalf("made.txt owned by %s, want %s", got, owner)
	}
	// So do files and directories copied in, unless --user says otherwise.
	local := t.TempDir()
	writeTree(t, local, map[string]string{"in.txt": "in\n", "tree/sub/deep.txt": "deep\n"})
	mustRun(t, run, "sandbox", "cp", filepath.Join(local, "in.txt"), "u1:in.txt")
	mustRun(t, run, "sandbox", "cp", filepath.Join(local, "tree"), "u1:")
	mustRun(t, run, "sandbox", "cp", "--user", "root", filepath.Join(local, "in.txt"), "u1:root.txt")
	got := mustRun(t, run, "sandbox", "exec", "u1", "--", "stat", "-c", "%n %u", "in.txt", "tree", "tree/sub", "tree/sub/deep.txt", "root.txt")
	want := fmt.Sprintf("in.txt %[1]s\ntree %[1]s\ntree/sub %[1]s\ntree/sub/deep.txt %[1]s\nroot.txt 0\n", owner)
	if got != want {
		t.Fatalf("owners of copied files:\n%s\nwant\n%s", got, want)
	}
}

// TestSandboxHostGrant checks an absolute host source is read only inside
// a --host-grant directory.
func TestSandboxHostGrant(t *testing.T) {
	testenv.Require(t, testenv.Linux) // local sandboxes
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	run := newCLIRun(t.Context(), state, bin)
	t.Cleanup(func() { newCLIRun(context.Background(), state, bin)("sandbox", "rm", "g1") })
	data := t.TempDir()
	writeTree(t, data, map[string]string{"q3.csv": "q,rev\n3,10\n"})
	m := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(m, []byte(fmt.Sprintf("version: 1\nentries:\n  q3.csv:\n    type: local_file\n    src: %s\n", filepath.Join(data, "q3.csv"))), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run("sandbox", "create", "--id", "g1", "--manifest", m)
	if code == 0 || !strings.Contains(errs, "host grants") || strings.Contains(errs, data) {
		t.Fatalf("create without a grant: exit %d, stderr %q (want a refusal naming no host path)", code, errs)
	}
	run("sandbox", "rm", "g1")
	mustRun(t, run, "--host-grant", data, "sandbox", "create", "--id", "g1", "--manifest", m)
	if out := mustRun(t, run, "sandbox", "exec", "g1", "--", "cat", "q3.csv"); out != "q,rev\n3,10\n" {
		t.Fatalf("q3.csv = %q", out)
	}
}

// TestDockerLabelFlag: --label must be KEY=VALUE; a malformed one is
// refused before any Docker call (so this needs no Docker).
func TestDockerLabelFlag(t *testing.T) {
	state := testenv.SearchableTempDir(t)
	for _, bad := range []string{"novalue", "=v"} {
		var out, errb bytes.Buffer
		code := Execute(t.Context(), []string{"--state-dir", state, "--provider", "docker", "--label", bad, "sandbox", "ls"},
			Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		if code != 1 || !strings.Contains(errb.String(), "--label") || !strings.Contains(errb.String(), "KEY=VALUE") {
			t.Errorf("--label %q: exit %d, stderr %q; want exit 1 naming --label and KEY=VALUE", bad, code, errb.String())
		}
	}
}
