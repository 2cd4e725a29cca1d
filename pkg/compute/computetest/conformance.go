// Package computetest is the conformance suite every compute provider
// passes: the same sessions, files, patches, snapshots and resumes,
// whatever runs the sandbox. A provider's tests call Run with a way to make
// clients and a way to find what a sandbox leaked.
package computetest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Env describes the provider under test.
type Env struct {
	// NewClient returns a client over the provider with the given
	// snapshot store. Called several times per test: clients made by two
	// calls stand for two harness processes.
	NewClient func(t *testing.T, store snapshot.Store) *compute.Client
	// Users reports whether the sandboxes can create accounts and run
	// processes as them (the daemon runs as root inside).
	Users bool
	// Leaked lists what the provider left behind for a session after
	// Delete (processes, directories, containers); empty means clean.
	Leaked func(t *testing.T, sessionID string) []string
	// DeleteKeepsSandbox says the provider cannot delete sandboxes: its
	// Delete only forgets one, which keeps running with its workspace (the
	// remote provider). ResumeAfterDelete then checks that a resume
	// reattaches to the sandbox as it was left, instead of restoring the
	// snapshot into a replacement. The zero value is the usual provider.
	DeleteKeepsSandbox bool
}

// Run runs the conformance suite.
func Run(t *testing.T, env Env) {
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, env) })
	t.Run("ResumeAfterDelete", func(t *testing.T) { testResumeAfterDelete(t, env) })
	t.Run("RunAs", func(t *testing.T) {
		testenv.Require(t, testenv.Condition(env.Users, "this provider's sandboxes cannot create accounts here"))
		testRunAs(t, env)
	})
	t.Run("StateIsRedacted", func(t *testing.T) { testStateRedacted(t, env) })
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testManifest() *manifest.Manifest {
	return &manifest.Manifest{
		Entries: map[string]*manifest.Entry{
			"repo/task.md": {Type: manifest.TypeFile, Content: []byte("fix the bug\n")},
			"repo/calc.py": {Type: manifest.TypeFile, Content: []byte("def add(a, b):\n    return a - b\n")},
			"scratch":      {Type: manifest.TypeDir, Ephemeral: true},
		},
		Environment: map[string]manifest.EnvValue{"BULKHEAD_CONFORMANCE": manifest.Literal("env-ok")},
	}
}

// checkEnvironment checks that the processes of s see testManifest's
// environment, below the request's own env.
func checkEnvironment(t *testing.T, ctx context.Context, s *compute.Session) {
	t.Helper()
	res, err := s.Exec(ctx, compute.ProcessSpec{
		Command: `echo "$BULKHEAD_CONFORMANCE $BULKHEAD_CONFORMANCE_REQ"`,
		Env:     map[string]string{"BULKHEAD_CONFORMANCE_REQ": "req-ok"},
	}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "env-ok req-ok" {
		t.Fatalf("the manifest's environment is not in the sandbox's processes: %q", got)
	}
}

// run executes a shell command in the session and returns its output.
func run(t *testing.T, ctx context.Context, s *compute.Session, cmd string) (string, int) {
	t.Helper()
	res, err := s.Exec(ctx, compute.ProcessSpec{Command: cmd}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return string(res.Stdout) + string(res.Stderr), res.Exit.ExitCode
}

func readFile(t *testing.T, ctx context.Context, s *compute.Session, p string) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := s.ReadFile(ctx, p, compute.ReadFileOptions{}, &b); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return b.String()
}

func cleanup(t *testing.T, env Env, c *compute.Client, s *compute.Session) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Delete(ctx, s); err != nil {
			t.Errorf("delete: %v", err)
		}
		if env.Leaked != nil {
			if left := env.Leaked(t, s.ID()); len(left) > 0 {
				t.Errorf("session %s leaked: %v", s.ID(), left)
			}
		}
	})
}

func testLifecycle(t *testing.T, env Env) {
	ctx := ctxT(t)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := env.NewClient(t, store)
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: testManifest()})
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, env, c, s)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, ctx, s, "repo/task.md"); got != "fix the bug\n" {
		t.Fatalf("task.md = %q", got)
	}
	if n := len(s.Materialized().Files); n != 2 {
		t.Errorf("materialized %d files, want 2", n)
	}
	checkEnvironment(t, ctx, s)
	out, code := run(t, ctx, s, "cat repo/calc.py | wc -l; exit 3")
	if strings.TrimSpace(out) != "2" || code != 3 {
		t.Fatalf("exec: %q exit %d", out, code)
	}
	patch := "*** Begin Patch\n*** Update File: repo/calc.py\n@@ def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"
	if _, err := s.ApplyPatch(ctx, patch, compute.ApplyPatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteFile(ctx, "scratch/tmp.txt", compute.WriteFileOptions{CreateParents: true}, strings.NewReader("ephemeral")); err != nil {
		t.Fatal(err)
	}
	// Stop persists; the sandbox keeps running.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := store.Exists(ctx, s.ID()); !ok {
		t.Fatal("no snapshot after Stop")
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	if st.Fingerprint == "" || !st.Started {
		t.Fatalf("state after stop: %+v", st)
	}
	data, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// Another harness process resumes the live sandbox from the state.
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	c2 := env.NewClient(t, store)
	st2, err := c2.DecodeState(data)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c2.Resume(ctx, st2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, ctx, s2, "repo/calc.py"); !strings.Contains(got, "a + b") {
		t.Fatalf("resumed live sandbox lost the patch: %q", got)
	}
	if got := readFile(t, ctx, s2, "scratch/tmp.txt"); got != "ephemeral" {
		t.Fatalf("resumed live sandbox lost a file: %q", got)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func testResumeAfterDelete(t *testing.T, env Env) {
	ctx := ctxT(t)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := env.NewClient(t, store)
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: testManifest()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, code := run(t, ctx, s, "echo learned > repo/notes.txt && echo junk > scratch/junk && rm repo/task.md"); code != 0 {
		t.Fatal("setup command failed")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if env.Leaked != nil {
		if left := env.Leaked(t, s.ID()); len(left) > 0 {
			t.Fatalf("delete leaked: %v", left)
		}
	}
	if env.DeleteKeepsSandbox {
		resumeAfterForget(t, ctx, env, c, store, st)
		return
	}
	// The sandbox is gone: resume builds a replacement from the snapshot.
	s2, err := env.NewClient(t, store).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, env, c, s2)
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, ctx, s2, "repo/notes.txt"); got != "learned\n" {
		t.Fatalf("notes.txt after restore = %q", got)
	}
	// The daemon keeps the environment in memory: the replacement gets it
	// from the plan applied after the restore.
	checkEnvironment(t, ctx, s2)
	if _, err := s2.Stat(ctx, "repo/task.md", compute.StatOptions{}); !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("deleted task.md came back: %v", err)
	}
	// Ephemeral entries are made again, empty; their old content is gone.
	if _, err := s2.Stat(ctx, "scratch", compute.StatOptions{}); err != nil {
		t.Fatalf("ephemeral dir not recreated: %v", err)
	}
	if _, err := s2.Stat(ctx, "scratch/junk", compute.StatOptions{}); !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("ephemeral content was persisted: %v", err)
	}
}

// resumeAfterForget is ResumeAfterDelete's end for a provider whose Delete
// only forgets: the sandbox still runs, and a resume reattaches to it with
// the workspace exactly as it was left (ephemeral content included, since
// nothing was restored).
func resumeAfterForget(t *testing.T, ctx context.Context, env Env, c *compute.Client, store snapshot.Store, st *compute.State) {
	s2, err := env.NewClient(t, store).Resume(ctx, st)
	if err != nil {
		t.Fatalf("resume after a delete that only forgets: %v", err)
	}
	cleanup(t, env, c, s2)
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, ctx, s2, "repo/notes.txt"); got != "learned\n" {
		t.Fatalf("notes.txt after reattach = %q", got)
	}
	checkEnvironment(t, ctx, s2)
	if _, err := s2.Stat(ctx, "repo/task.md", compute.StatOptions{}); !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("deleted task.md came back: %v", err)
	}
	if got := readFile(t, ctx, s2, "scratch/junk"); got != "junk\n" {
		t.Fatalf("the kept sandbox's ephemeral file = %q; nothing should have been restored", got)
	}
}

func testRunAs(t *testing.T, env Env) {
	ctx := ctxT(t)
	c := env.NewClient(t, nil)
	ro := manifest.PermissionsFromMode(0o750)
	m := &manifest.Manifest{
		Groups: []manifest.Group{{Name: "analysts"}},
		Users:  []manifest.User{{Name: "analyst", Groups: []string{"analysts"}}},
		RunAs:  "analyst",
		Entries: map[string]*manifest.Entry{
			"dataroom":        {Type: manifest.TypeDir, Permissions: &ro, Group: "analysts"},
			"dataroom/q3.csv": {Type: manifest.TypeFile, Content: []byte("q,rev\n3,10\n")},
			"output":          {Type: manifest.TypeDir},
		},
	}
	// The data room belongs to root, readable by the group; output to the
	// agent's account.
	m.Entries["dataroom"].Permissions = &ro
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, env, c, s)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The workspace root is the agent's too: it can create files at the
	// top, but not write into the group's read-only data room.
	res, err := s.Exec(ctx, compute.ProcessSpec{Command: "echo top > top.txt && echo top-ok; echo x > dataroom/x.txt || echo ro-ok", User: "analyst"}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := string(res.Stdout); !strings.Contains(out, "top-ok") || !strings.Contains(out, "ro-ok") {
		t.Fatalf("as analyst at the top of the workspace: %q, stderr %q", out, res.Stderr)
	}
	res, err = s.Exec(ctx, compute.ProcessSpec{Command: "id -un; cat dataroom/q3.csv > output/report.csv && echo ok", User: "analyst"}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := string(res.Stdout) + string(res.Stderr); !strings.Contains(out, "ok") {
		t.Fatalf("as analyst: %q exit %d", out, res.Exit.ExitCode)
	}
	if got := readFile(t, ctx, s, "output/report.csv"); got != "q,rev\n3,10\n" {
		t.Fatalf("report = %q", got)
	}
}

func testStateRedacted(t *testing.T, env Env) {
	ctx := ctxT(t)
	c := env.NewClient(t, nil)
	m := testManifest()
	m.Environment = map[string]manifest.EnvValue{"API_TOKEN": manifest.SecretEnv("api-token")}
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, env, c, s)
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	data, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"token\":\"", "Bearer"} {
		if bytes.Contains(bytes.ToLower(data), bytes.ToLower([]byte(bad))) {
			t.Errorf("state contains %q: %s", bad, data)
		}
	}
	if _, err := c.DecodeState(data); err != nil {
		t.Fatal(err)
	}
	if _, err := compute.DecodeState(bytes.Replace(data, []byte(`"version":1`), []byte(`"version":99`), 1)); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("future version accepted: %v", err)
	}
}
