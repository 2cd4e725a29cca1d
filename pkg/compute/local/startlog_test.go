package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// flagRefusal is what the daemon prints when it is given an unknown flag.
const flagRefusal = "flag provided but not defined: -no-such-flag"

// TestStartFailureSaysWhy: a daemon that refuses to start (an unknown
// flag) is reported with what it printed, and the token never appears.
func TestStartFailureSaysWhy(t *testing.T) {
	token := strings.Repeat("5ec2e7", 8)
	_, err := Start(testCtx(t), Options{AgentdPath: agentdBin, Token: token, Args: []string{"--no-such-flag"}}, zap.NewNop())
	if !errors.Is(err, ErrExitedAtStart) || !errors.Is(err, errkind.ErrUnavailable) {
		t.Fatalf("a daemon that cannot start: %v", err)
	}
	if !strings.Contains(err.Error(), flagRefusal) {
		t.Errorf("the error does not say why: %v", err)
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("the error shows the token: %v", err)
	}
	if n := len(err.Error()); n > startLogMax+500 {
		t.Errorf("the error is %d bytes long; the output kept is bounded by %d", n, startLogMax)
	}
}

// TestStartFailureOfTheWrapperSaysWhy: when the wrapper (bubblewrap here,
// refusing a bind of a path that does not exist) fails before the daemon
// runs, its message is in the error.
func TestStartFailureOfTheWrapperSaysWhy(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	missing := filepath.Join(t.TempDir(), "no-such-source")
	wrap := func(argv []string) []string {
		return append([]string{"bwrap", "--dev-bind", "/", "/", "--bind", missing, "/mnt", "--"}, argv...)
	}
	_, err := Start(testCtx(t), Options{AgentdPath: agentdBin, Wrap: wrap}, zap.NewNop())
	if !errors.Is(err, ErrExitedAtStart) {
		t.Fatalf("a wrapper that cannot start: %v", err)
	}
	if !strings.Contains(err.Error(), "bwrap: ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("the error does not carry bwrap's message: %v", err)
	}
}

// TestStartFailureWithSilentExit: a sandbox that exits without a word is
// reported as such, also when it is gone before the launcher sends the
// token (the write then fails: no reader), which a quick exit makes
// likely in some of the starts.
func TestStartFailureWithSilentExit(t *testing.T) {
	wrap := func([]string) []string { return []string{"/bin/sh", "-c", "exec 3<&-; exit 1"} }
	for i := 0; i < 20; i++ {
		_, err := Start(testCtx(t), Options{AgentdPath: agentdBin, Wrap: wrap}, zap.NewNop())
		if !errors.Is(err, ErrExitedAtStart) || !strings.Contains(err.Error(), "exit status 1; it wrote nothing") {
			t.Fatalf("a sandbox that exits silently (start %d): %v", i+1, err)
		}
	}
}

// TestGVisorStartFailureSaysWhy: a gVisor sandbox whose daemon refuses to
// start is reported with what the daemon printed (through runsc).
func TestGVisorStartFailureSaysWhy(t *testing.T) {
	bin := runsc.Require(t)
	state := testenv.SearchableTempDir(t)
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: bin, Args: []string{"--no-such-flag"}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = p.Launch(ctx, compute.LaunchSpec{SessionID: "refused"})
	if !errors.Is(err, ErrExitedAtStart) || !strings.Contains(err.Error(), flagRefusal) {
		t.Fatalf("a gVisor sandbox whose daemon cannot start: %v", err)
	}
}

// TestStartLogBounded: however much a sandbox writes while it starts,
// the first startLogMax bytes are kept and the rest only counted; a
// forwarding writer still gets everything.
func TestStartLogBounded(t *testing.T) {
	var fwd syncbuf.Buffer
	l, w, err := newStartLog(&fwd, "")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 99) + "\n"
	const lines = 200
	for i := 0; i < lines; i++ {
		if _, err := w.WriteString(line); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	l.stop()
	want := fmt.Sprintf("[%d more bytes not kept]", lines*len(line)-startLogMax)
	if got := l.text(); !strings.HasSuffix(got, want) || len(got) > startLogMax+len(want)+1 {
		t.Errorf("kept %d bytes ending %q, want %d bytes then %q", len(got), got[max(0, len(got)-60):], startLogMax, want)
	}
	if got := len(fwd.String()); got != lines*len(line) {
		t.Errorf("forwarded %d bytes, want %d", got, lines*len(line))
	}
}

// TestServingDaemonSurvivesClosedOutput: once the daemon serves (no
// Options.Stderr), the launcher holds nothing of its output (no reader,
// no descriptor), and the daemon goes on logging and serving: a write to
// the closed output fails quietly rather than killing it (as SIGPIPE
// would, on a pipe whose reader is gone). That is also the state of a
// sandbox whose harness has exited.
func TestServingDaemonSurvivesClosedOutput(t *testing.T) {
	ctx := testCtx(t)
	s := startSandbox(t, Options{})
	select {
	case <-s.output.done:
	default:
		t.Fatal("the output reader still runs after start-up")
	}
	daemonOut, err := os.Readlink("/proc/" + strconv.Itoa(s.PID()) + "/fd/2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(daemonOut, "socket:") {
		t.Fatalf("the daemon's stderr is %s, want the output socket", daemonOut)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if target, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); target == daemonOut {
			t.Errorf("the launcher still holds the daemon's output socket (fd %s)", fd.Name())
		}
	}
	// Every process start and exit, and every refused call, is logged.
	for i := 0; i < 3; i++ {
		if _, _, code := execShell(ctx, t, s, "true"); code != 0 {
			t.Fatalf("exec: exit %d", code)
		}
		if _, err := s.Client.Stat(ctx, "no-such-file", compute.StatOptions{}); !errors.Is(err, errkind.ErrNotFound) {
			t.Fatalf("Stat of a missing file: %v", err)
		}
	}
	select {
	case <-s.Exited():
		t.Fatalf("the daemon exited (%s) after logging to its closed output", s.cmd.ProcessState)
	default:
	}
	if out, _, code := execShell(ctx, t, s, "echo still"); code != 0 || strings.TrimSpace(out) != "still" {
		t.Errorf("after logging to its closed output: %q, exit %d", out, code)
	}
}

// TestServingDaemonLogForwarded: with Options.Stderr, the daemon's log
// keeps reaching it after start-up, and the reader ends when the daemon
// does.
func TestServingDaemonLogForwarded(t *testing.T) {
	ctx := testCtx(t)
	var log syncbuf.Buffer
	s := startSandbox(t, Options{Stderr: &log})
	if !strings.Contains(log.String(), "sandbox-agentd ready") {
		t.Errorf("start-up log not forwarded:\n%s", log.String())
	}
	execShell(ctx, t, s, "true")
	eventually(t, 10*time.Second, "the log of a process started after start-up is forwarded", func() (bool, string) {
		return strings.Contains(log.String(), "process exited"), log.String()
	})
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.output.done:
	default:
		t.Error("the output reader still runs after Close")
	}
}
