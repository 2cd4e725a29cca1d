package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/computetest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// providerEnv makes clients over one state directory, as successive
// harness processes on one machine would.
func providerEnv(t *testing.T) (computetest.Env, string) {
	return providerEnvWith(t, IsolationNone)
}

func providerEnvWith(t *testing.T, iso Isolation) (computetest.Env, string) {
	stateDir := t.TempDir()
	// Sandbox accounts must pass through the test's temporary directories
	// to reach the workspace (as they would through a real state dir).
	for d := stateDir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	env := computetest.Env{
		NewClient: func(t *testing.T, store snapshot.Store) *compute.Client {
			log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
			c, err := NewClient(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: iso}, compute.ClientOptions{Snapshots: store, Log: log})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		Users: os.Geteuid() == 0,
		Leaked: func(t *testing.T, sessionID string) []string {
			var left []string
			if _, err := os.Stat(filepath.Join(stateDir, sessionID)); err == nil {
				left = append(left, "directory "+sessionID)
			}
			left = append(left, daemonsFor(filepath.Join(stateDir, sessionID, runDir))...)
			return left
		},
	}
	return env, stateDir
}

// daemonsFor lists running daemons whose socket is in dir.
func daemonsFor(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), filepath.Join(dir, socketName)) && alivePID(atoi(e.Name())) {
			out = append(out, "daemon pid "+e.Name())
		}
	}
	return out
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func TestProviderConformance(t *testing.T) {
	env, _ := providerEnv(t)
	computetest.Run(t, env)
}

func TestProviderConformanceIsolated(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	env, _ := providerEnvWith(t, IsolationBubblewrap)
	computetest.Run(t, env)
	t.Run("Confined", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := env.NewClient(t, nil)
		s, err := c.Create(ctx, compute.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
		outside := filepath.Join(t.TempDir(), "host-file")
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{
			Command: "touch " + outside + " 2>/dev/null && echo wrote-host; echo $$; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '",
		}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := string(res.Stdout)
		if strings.Contains(out, "wrote-host") {
			t.Errorf("the sandbox wrote to the host: %q", out)
		}
		if _, err := os.Stat(outside); err == nil {
			t.Error("host file created")
		}
		if fields := strings.Fields(out); len(fields) == 0 || atoi(fields[0]) > 100 {
			t.Errorf("not in a new pid namespace: %q", out)
		}
		if strings.Contains(out, "eth") {
			t.Errorf("network interfaces visible: %q", out)
		}
	})
	// The sandbox's accounts resolve by name inside it (its /etc/passwd and
	// /etc/group are the private copies the daemon edits), and the rest of
	// the host's /etc is there, read-only.
	t.Run("Accounts", func(t *testing.T) {
		testenv.Require(t, testenv.Root) // creating sandbox accounts needs a root harness
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := env.NewClient(t, nil)
		m := &manifest.Manifest{Groups: []manifest.Group{{Name: "crew"}}, Users: []manifest.User{{Name: "mate", Groups: []string{"crew"}}}, RunAs: "mate"}
		s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{
			User:    "mate",
			Command: "id -un; id -Gn; touch /etc/x 2>/dev/null && echo wrote-etc; test -e /etc/hostname -o -e /etc/os-release && echo host-etc",
		}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(res.Stdout); got != "mate\nmate crew\nhost-etc\n" {
			t.Errorf("inside the sandbox: %q (stderr %q)", got, res.Stderr)
		}
		if host, _ := os.ReadFile("/etc/passwd"); strings.Contains(string(host), "\nmate:") {
			t.Error("the sandbox's account reached the host's /etc/passwd")
		}
	})
}

func TestResumeAfterDaemonKilled(t *testing.T) {
	env, _ := providerEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := env.NewClient(t, store)
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Agent().WriteFile(ctx, "kept.txt", compute.WriteFileOptions{}, strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st, dir := sandboxState(t, s)
	m, err := readMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon dies (a crash, a reboot); the directory survives.
	if err := syscall.Kill(m.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for alivePID(m.PID) {
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.Release()
	s2 := resumeStarted(ctx, t, env.NewClient(t, store), st)
	var b strings.Builder
	if _, err := s2.Agent().ReadFile(ctx, "kept.txt", compute.ReadFileOptions{}, &b); err != nil || b.String() != "kept" {
		t.Fatalf("kept.txt: %q %v", b.String(), err)
	}
}

func TestReapExpired(t *testing.T) {
	env, stateDir := providerEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := env.NewClient(t, nil)
	short, err := c.Create(ctx, compute.CreateOptions{TTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	long, err := c.Create(ctx, compute.CreateOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), long); _ = c.Delete(context.Background(), short) })
	// A harness that crashed leaves its sandboxes running: drop the
	// connections without closing anything.
	_ = short.Release()
	list, err := c.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %v, %v", list, err)
	}
	time.Sleep(5 * time.Millisecond)
	reaped, err := c.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(reaped) != 1 || reaped[0].SessionID != short.ID() {
		t.Fatalf("reaped %v, want %s", reaped, short.ID())
	}
	if left := env.Leaked(t, short.ID()); len(left) > 0 {
		t.Fatalf("reap left %v", left)
	}
	if _, err := os.Stat(filepath.Join(stateDir, long.ID())); err != nil {
		t.Fatalf("the unexpired sandbox was reaped: %v", err)
	}
}

func TestCreateRefusesARunningSessionID(t *testing.T) {
	env, _ := providerEnv(t)
	ctx := context.Background()
	c := env.NewClient(t, nil)
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: "dup-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if _, err := c.Create(ctx, compute.CreateOptions{SessionID: "dup-1"}); !errors.Is(err, compute.ErrAlreadyExists) {
		t.Fatalf("second create: %v", err)
	}
}

// TestLaunchRefusesForeignDirectories checks a session state (or id) that
// names a directory outside the provider's state directory is refused:
// nothing is created there, and nothing removed.
func TestLaunchRefusesForeignDirectories(t *testing.T) {
	stateDir, elsewhere := testenv.SearchableTempDir(t), t.TempDir()
	p, err := New(Config{StateDir: stateDir, AgentdPath: agentdBin}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(elsewhere, "victim")
	prior, _ := json.Marshal(providerState{Dir: victim})
	for name, spec := range map[string]compute.LaunchSpec{
		"prior elsewhere": {SessionID: "s1", Prior: prior},
		"id with a slash": {SessionID: "../" + filepath.Base(elsewhere) + "/victim"},
		"dot dot":         {SessionID: ".."},
		// Names starting with a dot are the state directory's own.
		"dot name":       {SessionID: agentdCopyPrefix + "0123456789abcdef"},
		"prior dot name": {SessionID: "s2", Prior: json.RawMessage(`{"dir":"` + filepath.Join(stateDir, agentdCopyPrefix+"0123456789abcdef") + `"}`)},
	} {
		if _, err := p.Launch(t.Context(), spec); !errors.Is(err, compute.ErrInvalidArgument) {
			t.Errorf("%s: Launch error %v, want ErrInvalidArgument", name, err)
		}
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("Launch created %v outside its state directory", entries)
	}
}

func TestUnsearchableAncestor(t *testing.T) {
	base := t.TempDir()
	deep := filepath.Join(base, "a", "b", "c")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's own directories are 0700; open them (and below) up.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if blocked := unsearchableAncestor(filepath.Dir(filepath.Dir(base))); blocked != "" {
		testenv.Skip(t, blocked+" is not searchable by others here")
	}
	if got := unsearchableAncestor(deep); got != "" {
		t.Fatalf("unsearchableAncestor of an open path = %q", got)
	}
	a := filepath.Join(base, "a")
	if err := os.Chmod(a, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := unsearchableAncestor(deep); got != a {
		t.Fatalf("unsearchableAncestor = %q, want %s", got, a)
	}
}

// sandboxState returns a session's state and its sandbox's private
// directory.
func sandboxState(t *testing.T, s *compute.Session) (*compute.State, string) {
	t.Helper()
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	var ps providerState
	if err := json.Unmarshal(st.ProviderState, &ps); err != nil {
		t.Fatal(err)
	}
	return st, ps.Dir
}
