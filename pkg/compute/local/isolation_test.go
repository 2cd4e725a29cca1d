package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

func TestParseIsolation(t *testing.T) {
	for in, want := range map[string]Isolation{"": IsolationAuto, "auto": IsolationAuto, "none": IsolationNone, "bubblewrap": IsolationBubblewrap} {
		if got, err := ParseIsolation(in); err != nil || got != want {
			t.Errorf("ParseIsolation(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseIsolation("gvisor-please"); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("an unknown isolation: %v, want ErrInvalidArgument", err)
	}
	if IsolationAuto.String() != "auto" || IsolationNone.String() != "none" {
		t.Errorf("names: %q %q", IsolationAuto, IsolationNone)
	}
}

// TestAutoNeverFallsBackSilently: with nothing stronger than plain
// processes available, the zero-value (auto) configuration refuses, and
// plain processes need IsolationNone by name.
func TestAutoNeverFallsBackSilently(t *testing.T) {
	state := testenv.SearchableTempDir(t)
	agentd := filepath.Join(t.TempDir(), "sandbox-agentd") // never started here
	t.Setenv("PATH", t.TempDir())                          // no bwrap
	_, err := New(Config{StateDir: state, AgentdPath: agentd}, zap.NewNop())
	if !errors.Is(err, ErrNoIsolation) || !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Fatalf("auto without bubblewrap: %v, want ErrNoIsolation (a failed precondition)", err)
	}
	if _, err := New(Config{StateDir: state, AgentdPath: agentd, Isolation: IsolationBubblewrap}, zap.NewNop()); !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Fatalf("bubblewrap without bwrap: %v", err)
	}
	p, err := New(Config{StateDir: state, AgentdPath: agentd, Isolation: IsolationNone}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if p.Isolation() != IsolationNone || p.Isolated() {
		t.Fatalf("isolation %q", p.Isolation())
	}
	// A plain provider made this process non-dumpable: its environment,
	// memory and descriptors are closed to processes of its own user.
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Fatalf("PR_GET_DUMPABLE = %d, %v after a plain provider; want 0", d, err)
	}
}

func TestAutoPicksBubblewrap(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	p, err := New(Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: "/bin/true"}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if p.Isolation() != IsolationBubblewrap || !p.Isolated() {
		t.Fatalf("auto with bwrap chose %q", p.Isolation())
	}
}

// TestDefaultRunAs: a root harness gives each session an account of its
// own, with uids that differ between sandboxes and from the host's.
func TestDefaultRunAs(t *testing.T) {
	p := &Provider{log: zap.NewNop()}
	u := p.DefaultRunAs()
	if os.Geteuid() != 0 {
		if u != nil {
			t.Fatalf("a non-root harness cannot make accounts, got %+v", u)
		}
		return
	}
	if u == nil || u.Name != compute.DefaultRunAsName || u.UID == nil {
		t.Fatalf("DefaultRunAs = %+v", u)
	}
	seen := map[uint32]bool{}
	for range 50 {
		uid := *p.DefaultRunAs().UID
		if uid < minSandboxUID || uid >= maxSandboxUID {
			t.Fatalf("uid %d outside [%d, %d)", uid, minSandboxUID, maxSandboxUID)
		}
		seen[uid] = true
	}
	if len(seen) < 45 {
		t.Fatalf("50 draws gave %d distinct uids", len(seen))
	}
}

// TestPlainRootNeedsASearchableStateDir: a plain sandbox's own account must
// reach its workspace, so a root harness refuses a state directory below a
// directory other users cannot search, with a clear error.
func TestPlainRootNeedsASearchableStateDir(t *testing.T) {
	testenv.Require(t, testenv.Root)
	top := t.TempDir()
	if err := os.Chmod(top, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{StateDir: filepath.Join(top, "state"), AgentdPath: "/bin/true", Isolation: IsolationNone}, zap.NewNop())
	if !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Fatalf("state dir below a 0700 directory: %v", err)
	}
}

// TestBubblewrapStartRetriedThenReported: a bubblewrap sandbox whose
// process exits before it serves is started again, at most
// bwrapStartAttempts times, each time with the seccomp filter rewound; a
// failure that repeats is reported (ErrUnavailable, ErrExitedAtStart)
// with what the sandbox printed, as is every restart's warning, and
// leaves nothing behind.
func TestBubblewrapStartRetriedThenReported(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	core, logs := observer.New(zap.WarnLevel)
	state := testenv.SearchableTempDir(t)
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationBubblewrap, Args: []string{"--no-such-flag"}}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = p.Launch(ctx, compute.LaunchSpec{SessionID: "retried"})
	if !errors.Is(err, ErrExitedAtStart) || !errors.Is(err, compute.ErrUnavailable) {
		t.Fatalf("a daemon that cannot start: %v", err)
	}
	if !strings.Contains(err.Error(), flagRefusal) {
		t.Errorf("the error does not say why the daemon exited: %v", err)
	}
	restarts := logs.FilterMessageSnippet("starting it again").All()
	if len(restarts) != bwrapStartAttempts-1 {
		t.Errorf("%d restarts, want %d", len(restarts), bwrapStartAttempts-1)
	}
	for _, e := range restarts {
		if why := fmt.Sprint(e.ContextMap()["error"]); !strings.Contains(why, flagRefusal) {
			t.Errorf("a restart's warning does not say why the daemon exited: %s", why)
		}
	}
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("a failed launch left %v", ents)
	}
}
