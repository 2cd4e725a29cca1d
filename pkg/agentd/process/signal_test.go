package process

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestParseSignal(t *testing.T) {
	for name, want := range map[string]unix.Signal{
		"TERM": unix.SIGTERM, "SIGTERM": unix.SIGTERM, "kill": unix.SIGKILL, "sigint": unix.SIGINT,
		"HUP": unix.SIGHUP, "QUIT": unix.SIGQUIT, "USR1": unix.SIGUSR1, "USR2": unix.SIGUSR2,
		"STOP": unix.SIGSTOP, "CONT": unix.SIGCONT, " WINCH ": unix.SIGWINCH,
	} {
		if got, err := ParseSignal(name); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	for _, bad := range []string{"", "SIG", "BOGUS", "9", "-9", "SIGKILLX"} {
		if _, err := ParseSignal(bad); !errorsIs(err, errkind.ErrInvalidArgument) {
			t.Errorf("ParseSignal(%q) error = %v, want invalid argument", bad, err)
		}
	}
}

// sleepersOf waits until the group of leader has n live members besides
// the leader and returns them.
func sleepersOf(t *testing.T, pgid, n int) []int {
	t.Helper()
	var pids []int
	eventually(t, 5*time.Second, "background sleeps to start", func() bool {
		pids = pids[:0]
		for _, pid := range groupMembers(pgid) {
			if pid != pgid {
				pids = append(pids, pid)
			}
		}
		return len(pids) >= n
	})
	return pids
}

func noSurvivors(t *testing.T, pids []int) {
	t.Helper()
	eventually(t, 5*time.Second, "killed processes to die", func() bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	})
}

func TestSignalKillsWholeGroup(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: "sleep 1000 & sleep 1000"})
	pids := append(sleepersOf(t, info.PID, 2), info.PID)

	err := m.Signal(info.ID, "BOGUS")
	wantErr(t, err, errkind.ErrInvalidArgument, "BOGUS")
	if err := m.Signal(info.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	e, err := m.Wait(testCtx(t), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Signal != "SIGKILL" || e.Code != 128+9 || e.TimedOut {
		t.Errorf("exit = %+v", e)
	}
	noSurvivors(t, pids)
	wantErr(t, m.Signal(info.ID, "TERM"), errkind.ErrFailedPrecondition, "exited")
}

func TestSignalTermAndStopCont(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Argv: []string{"sleep", "100"}})
	if err := m.Signal(info.ID, "STOP"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "process to stop", func() bool {
		st, _, _ := procStat(info.PID)
		return st == "T"
	})
	if err := m.Signal(info.ID, "SIGCONT"); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(info.ID); !got.Running {
		t.Fatal("a stopped process was reported exited")
	}
	if err := m.Signal(info.ID, "term"); err != nil {
		t.Fatal(err)
	}
	e, err := m.Wait(testCtx(t), info.ID)
	if err != nil || e.Signal != "SIGTERM" || e.Code != 143 {
		t.Fatalf("exit = %+v, %v", e, err)
	}
}

func TestTimeoutKillsGroup(t *testing.T) {
	m := newTestManager(t, Config{})
	start := time.Now()
	info := mustStart(t, m, StartOptions{Command: "sleep 1000 & sleep 1000", Timeout: 300 * time.Millisecond})
	pids := append(sleepersOf(t, info.PID, 2), info.PID)
	e, err := m.Wait(testCtx(t), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !e.TimedOut || e.Signal != "SIGKILL" {
		t.Errorf("exit = %+v, want a timeout", e)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Errorf("killed before its timeout")
	}
	noSurvivors(t, pids)

	// A process that ends before its timeout is not marked.
	o := run(t, m, StartOptions{Argv: []string{"true"}, Timeout: time.Minute})
	if o.exit.TimedOut || o.exit.Code != 0 {
		t.Errorf("exit = %+v", o.exit)
	}
}

func TestBackgroundJobDoesNotBlockExit(t *testing.T) {
	m := newTestManager(t, Config{DrainGrace: 200 * time.Millisecond})
	info := mustStart(t, m, StartOptions{Command: "sleep 1000 & echo started"})
	bg := sleepersOf(t, info.PID, 1)
	done := make(chan *output, 1)
	go func() { done <- collect(t, m, info.ID) }()
	var o *output
	select {
	case o = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("exit was never reported while a background job held the output")
	}
	if o.stdout.String() != "started\n" || o.exit.Code != 0 {
		t.Errorf("output %q, exit %+v", o.stdout.String(), o.exit)
	}
	// The background job is left running (a normal exit kills nothing) ...
	for _, pid := range bg {
		if !alive(pid) {
			t.Errorf("background job %d was killed by a normal exit", pid)
		}
	}
	// ... and Shutdown kills it.
	ctx := testCtx(t)
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	noSurvivors(t, bg)
	_, err := m.Start(ctx, StartOptions{Argv: []string{"true"}})
	wantErr(t, err, errkind.ErrUnavailable, "shutting down")
}

func TestShutdownKillsRunning(t *testing.T) {
	m := newTestManager(t, Config{})
	a := mustStart(t, m, StartOptions{Command: "sleep 1000 & sleep 1000"})
	b := mustStart(t, m, StartOptions{Command: "sleep 1000", TTY: true})
	pids := append(sleepersOf(t, a.PID, 2), a.PID, b.PID)
	if err := m.Shutdown(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	noSurvivors(t, pids)
	for _, in := range m.List() {
		if in.Running || in.Exit == nil || !strings.Contains(in.Exit.Signal, "KILL") {
			t.Errorf("after Shutdown: %+v", in)
		}
	}
}

func TestShutdownReachesForgottenBackgroundJobs(t *testing.T) {
	m := newTestManager(t, Config{DrainGrace: 50 * time.Millisecond, ExitRetention: 50 * time.Millisecond})
	info := mustStart(t, m, StartOptions{Command: "sleep 1000 & echo started"})
	bg := sleepersOf(t, info.PID, 1)
	if _, err := m.Wait(testCtx(t), info.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the record to be forgotten", func() bool {
		_, err := m.Get(info.ID)
		return err != nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	noSurvivors(t, bg)
}
