package docker

// Fault tests: the container stopped from outside (ContainerStop through
// the Engine API) during a run, and its daemon SIGKILLed (ContainerKill:
// it is the container's PID 1) during a command and during a file write.
// The harness gets a clear error, retryable where a retry is safe; a resume
// restarts the container and finds the workspace intact.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// faultSession is a started session over a provider that removes
// everything at the end of the test.
type faultSession struct {
	p     *Provider
	store snapshot.Store
	s     *compute.Session
	id    string // container id
}

func newFaultSession(t *testing.T, ctx context.Context) *faultSession {
	t.Helper()
	p := newProvider(t, nil)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := compute.NewClient(p, compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: sessionID(t)})
	if err != nil {
		t.Fatal(err)
	}
	f := &faultSession{p: p, store: store, s: s}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	raw := st.ProviderState
	t.Cleanup(func() {
		_ = f.s.Release()
		destroyAll(t, p, raw)
	})
	f.id = mustDecode(t, raw).ContainerID
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

// resume resumes the session from its state through a new provider over
// the same state directory (a new harness process) and starts it.
func (f *faultSession) resume(t *testing.T, ctx context.Context) *compute.Session {
	t.Helper()
	st, err := f.s.State()
	if err != nil {
		t.Fatal(err)
	}
	_ = f.s.Release()
	p2, err := New(f.p.Config(), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p2.Close() })
	s2, err := compute.NewClient(p2, compute.ClientOptions{Snapshots: f.store}).Resume(ctx, st)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	f.s = s2
	if err := s2.Start(ctx); err != nil {
		t.Fatalf("start after resume: %v", err)
	}
	return s2
}

// streamUntilOutput runs a printing loop with Exec in the background and
// returns once it printed, with the channel of Exec's result.
func streamUntilOutput(t *testing.T, ctx context.Context, s *compute.Session) <-chan execResult {
	t.Helper()
	done := make(chan execResult, 1)
	first := make(chan struct{})
	var once sync.Once
	go func() {
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.02; done"}, compute.ExecOptions{},
			func(m *compute.ExecEvent) error {
				if len(m.Chunks) > 0 {
					once.Do(func() { close(first) })
				}
				return nil
			})
		done <- execResult{res.Exit, err}
	}()
	select {
	case <-first:
	case r := <-done:
		t.Fatalf("Exec ended before the fault: %v", r.err)
	case <-ctx.Done():
		t.Fatal("no output")
	}
	return done
}

type execResult struct {
	exit compute.ExitStatus
	err  error
}

// waitExec waits for a background Exec, failing on a hang.
func waitExec(t *testing.T, done <-chan execResult) execResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("Exec hangs after the fault")
		return execResult{}
	}
}

// TestFaultContainerStoppedDuringRun: ContainerStop from outside while a
// command streams. The daemon drains on SIGTERM: the command is reported
// killed (or, if the stream is cut first, Exec fails with ErrUnavailable,
// not retryable); later calls fail retryable; a resume restarts the
// container and finds the workspace as it was.
func TestFaultContainerStoppedDuringRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFaultSession(t, ctx)
	writeFile(t, f.s.Agent(), "work/progress.txt", "step 1 done\n", "")
	if err := f.s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.s.Agent(), "work/after-snapshot.txt", "not in the snapshot\n", "")
	done := streamUntilOutput(t, ctx, f.s)
	timeout := 2
	if _, err := f.p.API().ContainerStop(ctx, f.id, client.ContainerStopOptions{Timeout: &timeout}); err != nil {
		t.Fatal(err)
	}
	r := waitExec(t, done)
	switch {
	case r.err != nil:
		t.Logf("Exec after ContainerStop: %v", r.err)
		if !errors.Is(r.err, compute.ErrUnavailable) || compute.Retryable(r.err) {
			t.Errorf("Exec error %v: want ErrUnavailable, not retryable (the command ran)", r.err)
		}
	case r.exit.Signal == "":
		t.Errorf("Exec ended without an error or a signal: %v", r.exit)
	default:
		t.Logf("Exec after ContainerStop: killed by %s", r.exit.Signal)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	_, err := f.s.Agent().Start(short, compute.ProcessSpec{Command: "true"}, compute.StartOptions{})
	cancel()
	if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
		t.Errorf("Start on a stopped container: %v; want ErrUnavailable, retryable", err)
	}

	s2 := f.resume(t, ctx)
	info, err := f.p.API().ContainerInspect(ctx, f.id, client.ContainerInspectOptions{})
	if err != nil || !info.Container.State.Running {
		t.Fatalf("the same container is not running again: %v", err)
	}
	// The live workspace is kept, including what came after the snapshot.
	for path, want := range map[string]string{"work/progress.txt": "step 1 done\n", "work/after-snapshot.txt": "not in the snapshot\n"} {
		if got := readFile(t, s2.Agent(), path); got != want {
			t.Errorf("%s after restart = %q, want %q", path, got, want)
		}
	}
	if out := run(t, s2.Agent(), "", "echo alive"); out != "alive\n" {
		t.Fatalf("exec after restart: %q", out)
	}
}

// TestFaultDaemonKilledInContainer: the daemon (the container's PID 1) is
// SIGKILLed during a command and during a WriteFile.
func TestFaultDaemonKilledInContainer(t *testing.T) {
	t.Parallel()
	t.Run("command", func(t *testing.T) {
		ctx := testCtx(t)
		f := newFaultSession(t, ctx)
		writeFile(t, f.s.Agent(), "kept.txt", "kept\n", "")
		done := streamUntilOutput(t, ctx, f.s)
		if _, err := f.p.API().ContainerKill(ctx, f.id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
			t.Fatal(err)
		}
		r := waitExec(t, done)
		t.Logf("Exec after SIGKILL: %v", r.err)
		if !errors.Is(r.err, compute.ErrUnavailable) || compute.Retryable(r.err) {
			t.Errorf("Exec error %v: want ErrUnavailable, not retryable (the command ran)", r.err)
		}
		s2 := f.resume(t, ctx)
		if got := readFile(t, s2.Agent(), "kept.txt"); got != "kept\n" {
			t.Fatalf("kept.txt after restart = %q", got)
		}
	})
	t.Run("WriteFile", func(t *testing.T) {
		ctx := testCtx(t)
		f := newFaultSession(t, ctx)
		const old = "old content\n"
		writeFile(t, f.s.Agent(), "data/f.txt", old, "")
		pr, pw := io.Pipe()
		writeErr := make(chan error, 1)
		go func() {
			_, err := f.s.Agent().WriteFile(ctx, "data/f.txt", compute.WriteFileOptions{}, pr)
			writeErr <- err
		}()
		// 4 MiB in: the daemon is writing its temporary file.
		chunk := []byte(strings.Repeat("B", 1<<20))
		for range 4 {
			if _, err := pw.Write(chunk); err != nil {
				t.Fatalf("the write ended early: %v", err)
			}
		}
		var tmp string
		deadline := time.Now().Add(30 * time.Second)
		for tmp == "" {
			out := run(t, f.s.Agent(), "", "ls -a data")
			for _, name := range strings.Fields(out) {
				if strings.HasPrefix(name, ".bulkhead-tmp-") {
					tmp = name
				}
			}
			if tmp == "" && time.Now().After(deadline) {
				t.Fatalf("no temporary file while writing: %q", out)
			}
		}
		if _, err := f.p.API().ContainerKill(ctx, f.id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
			t.Fatal(err)
		}
		// The source keeps delivering: the client notices the dead daemon
		// at its next send.
		go func() {
			for {
				if _, err := pw.Write(chunk); err != nil {
					return
				}
			}
		}()
		var err error
		select {
		case err = <-writeErr:
		case <-time.After(60 * time.Second):
			t.Fatal("WriteFile hangs after the daemon died")
		}
		pr.CloseWithError(errors.New("test: the write is over"))
		t.Logf("WriteFile after SIGKILL: %v", err)
		if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
			t.Errorf("WriteFile error %v: want ErrUnavailable, retryable (the write is atomic)", err)
		}
		s2 := f.resume(t, ctx)
		if got := readFile(t, s2.Agent(), "data/f.txt"); got != old {
			t.Fatalf("f.txt after restart = %q: torn or lost", got)
		}
		if out := run(t, s2.Agent(), "", "ls -a data"); strings.Contains(out, ".bulkhead-tmp-") {
			t.Errorf("temporary file survived the restart: %q", out)
		}
		ls, err := s2.Agent().ListDir(ctx, "data", compute.ListDirOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ls.Entries {
			names = append(names, e.Name)
		}
		if fmt.Sprint(names) != "[f.txt]" {
			t.Errorf("data/ lists %v after restart", names)
		}
	})
}
