package local

// Fault tests: what a harness sees when the sandbox's daemon dies (SIGKILL)
// in the middle of a command or a file write, and when the harness's own
// connection is cut in the middle of a streaming command. Each runs on a
// plain local sandbox and, when bwrap is installed, an isolated one.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/faultnet"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// forEachIsolation runs fn for a plain local sandbox and, when bwrap is
// installed (always under CI), for an isolated one.
func forEachIsolation(t *testing.T, fn func(t *testing.T, iso Isolation)) {
	t.Run("plain", func(t *testing.T) { fn(t, IsolationNone) })
	t.Run("bubblewrap", func(t *testing.T) {
		testenv.Require(t, testenv.Bubblewrap)
		fn(t, IsolationBubblewrap)
	})
}

// faultSession is a started session with a snapshot store, persisted once
// (Stop) so that a resume after a crash can compare fingerprints.
type faultSession struct {
	env   clientMaker
	store snapshot.Store
	c     *compute.Client
	s     *compute.Session
	dir   string // the sandbox's private directory
}

type clientMaker func(t *testing.T, store snapshot.Store) *compute.Client

func newFaultSession(t *testing.T, ctx context.Context, iso Isolation) *faultSession {
	t.Helper()
	env, _ := providerEnvWith(t, iso)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := env.NewClient(t, store)
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Delete(ctx, s); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, dir := sandboxState(t, s)
	return &faultSession{env: env.NewClient, store: store, c: c, s: s, dir: dir}
}

// daemonPID finds the sandbox-agentd process serving dir's socket (under
// bubblewrap it is a child of bwrap, not the pid the provider records).
func daemonPID(t *testing.T, dir string) int {
	t.Helper()
	socket := []byte(filepath.Join(dir, runDir, socketName))
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if string(argv0) == agentdBin && bytes.Contains(cmdline, socket) && alivePID(pid) {
			return pid
		}
	}
	t.Fatalf("no sandbox-agentd serves %s", socket)
	return 0
}

// killDaemon SIGKILLs the sandbox's daemon and waits until no process of
// the sandbox's daemon (or bwrap around it) is left.
func killDaemon(t *testing.T, dir string) {
	t.Helper()
	pid := daemonPID(t, dir)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, runDir)
	eventually(t, 20*time.Second, "the killed sandbox's daemon is gone", func() (bool, string) {
		left := daemonsFor(socket)
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// processesWith lists live processes whose command line contains marker.
func processesWith(marker string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(marker)) && alivePID(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// resume resumes the session from its state in a "new harness" and starts it.
func (f *faultSession) resume(t *testing.T, ctx context.Context) *compute.Session {
	t.Helper()
	st, err := f.s.State()
	if err != nil {
		t.Fatal(err)
	}
	_ = f.s.Release()
	s2, err := f.env(t, f.store).Resume(ctx, st)
	if err != nil {
		t.Fatalf("resume after the daemon died: %v", err)
	}
	f.s = s2 // Delete at cleanup removes the replacement
	if err := s2.Start(ctx); err != nil {
		t.Fatalf("start the replacement: %v", err)
	}
	return s2
}

// TestFaultDaemonKilledDuringCommand: SIGKILL of the daemon while a command
// streams output. Exec fails at once with ErrUnavailable, not retryable (the
// command ran); Follow and Start, safe to repeat, are retried until their
// context ends and then fail with its error, the last attempt's
// (unavailable, retryable) as its cause (no hang; see agentclient's
// retry); a resume starts a new daemon on the kept workspace without
// restoring (nothing changed since the snapshot).
func TestFaultDaemonKilledDuringCommand(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso Isolation) {
		ctx := testCtx(t)
		f := newFaultSession(t, ctx, iso)
		agent := f.s.Agent()
		if _, err := agent.WriteFile(ctx, "notes/kept.txt", compute.WriteFileOptions{CreateParents: true}, strings.NewReader("kept\n")); err != nil {
			t.Fatal(err)
		}
		if err := f.s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		marker := fmt.Sprintf("fault-marker-%d", time.Now().UnixNano())
		loop := "m=" + marker + "; i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.02; done"
		bg, err := agent.Start(ctx, compute.ProcessSpec{Command: loop}, compute.StartOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A process that prints nothing: no SIGPIPE will end it.
		if _, err := agent.Start(ctx, compute.ProcessSpec{Command: "m=" + marker + "; sleep 300; true"}, compute.StartOptions{}); err != nil {
			t.Fatal(err)
		}
		ticks := make(chan struct{}, 1)
		execErr := make(chan error, 1)
		go func() {
			_, err := agent.Exec(ctx, compute.ProcessSpec{Command: loop}, compute.ExecOptions{}, func(m *compute.ExecEvent) error {
				if len(m.Chunks) > 0 {
					select {
					case ticks <- struct{}{}:
					default:
					}
				}
				return nil
			})
			execErr <- err
		}()
		select {
		case <-ticks:
		case err := <-execErr:
			t.Fatalf("Exec ended before the kill: %v", err)
		}
		killDaemon(t, f.dir)

		select {
		case err = <-execErr:
		case <-time.After(30 * time.Second):
			t.Fatal("Exec hangs after the daemon died")
		}
		t.Logf("Exec after SIGKILL: %v", err)
		if !errors.Is(err, compute.ErrUnavailable) || compute.Retryable(err) {
			t.Errorf("Exec error %v: want ErrUnavailable, not retryable (the command ran)", err)
		}
		var pe *compute.ProcessError
		if !errors.As(err, &pe) || pe.ProcessID == "" {
			t.Errorf("Exec error %v does not name the process", err)
		}

		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err = agent.Follow(short, bg.Process.ProcessID, compute.FollowOptions{}, func(*compute.Output) error { return nil })
		cancel()
		t.Logf("Follow after SIGKILL: %v", err)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
			t.Errorf("Follow error %v: want its context's deadline, caused by unavailable attempts (it resumes from a cursor)", err)
		}
		short, cancel = context.WithTimeout(ctx, time.Second)
		_, err = agent.Start(short, compute.ProcessSpec{Command: "true"}, compute.StartOptions{})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
			t.Errorf("Start error %v: want its context's deadline, caused by unavailable attempts (it carries a request id)", err)
		}

		// The sandbox's processes die with the daemon where it has a pid
		// namespace. In a plain local sandbox a process that does not write
		// (no SIGPIPE) outlives a SIGKILLed daemon; its cgroup, when it has
		// one, ends it when the replacement is launched.
		_, err = os.Stat(filepath.Join(f.dir, cgroupFile))
		hasCgroup := err == nil
		if iso == IsolationBubblewrap {
			eventually(t, 10*time.Second, "the sandbox's processes die with the daemon", func() (bool, string) {
				left := processesWith(marker)
				return len(left) == 0, fmt.Sprint(left)
			})
		} else if left := processesWith(marker); len(left) > 0 && !hasCgroup {
			t.Logf("no cgroup here: a plain local sandbox's processes outlive a SIGKILLed daemon (pids %v); killing them", left)
			for _, pid := range left {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		} else if hasCgroup {
			t.Cleanup(func() { killMarked(marker) })
		}

		s2 := f.resume(t, ctx)
		if hasCgroup {
			// The replacement's Launch ended the dead sandbox's cgroup
			// before it started the new daemon.
			if left := processesWith(marker); len(left) > 0 {
				t.Errorf("processes of the SIGKILLed daemon survive its replacement: pids %v", left)
			}
		}
		if got := readFile(t, ctx, s2.Agent(), "notes/kept.txt"); got != "kept\n" {
			t.Fatalf("kept.txt after resume = %q", got)
		}
		if _, err := s2.Agent().Wait(ctx, bg.Process.ProcessID); !errors.Is(err, compute.ErrNotFound) {
			t.Errorf("a process of the dead daemon is known to the new one: %v", err)
		}
		res, err := s2.Agent().Exec(ctx, compute.ProcessSpec{Command: "cat notes/kept.txt"}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("exec after resume: %v", err)
		}
		if string(res.Stdout) != "kept\n" {
			t.Fatalf("exec after resume: %q", res.Stdout)
		}
	})
}

func readFile(t *testing.T, ctx context.Context, c *agentclient.Client, path string) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := c.ReadFile(ctx, path, compute.ReadFileOptions{}, &b); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return b.String()
}

// TestFaultDaemonKilledDuringWriteFile: SIGKILL of the daemon while a
// WriteFile streams in. The client gets a retryable ErrUnavailable; the old
// file is intact on disk (never torn); after a resume the next daemon has
// removed the temporary file, nothing lists it, the fingerprint matches
// the snapshot (no restore needed) and the retried write succeeds.
func TestFaultDaemonKilledDuringWriteFile(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso Isolation) {
		ctx := testCtx(t)
		f := newFaultSession(t, ctx, iso)
		agent := f.s.Agent()
		const old = "old content\n"
		if _, err := agent.WriteFile(ctx, "data/f.txt", compute.WriteFileOptions{CreateParents: true}, strings.NewReader(old)); err != nil {
			t.Fatal(err)
		}
		if err := f.s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		ws := filepath.Join(f.dir, "workspace")
		r := &gatedReader{head: 2 << 20, size: 64 << 20, reached: make(chan struct{}), gate: make(chan struct{})}
		var gateOnce sync.Once
		openGate := func() { gateOnce.Do(func() { close(r.gate) }) }
		t.Cleanup(openGate)
		writeErr := make(chan error, 1)
		go func() {
			_, err := agent.WriteFile(ctx, "data/f.txt", compute.WriteFileOptions{}, r)
			writeErr <- err
		}()
		select {
		case <-r.reached:
		case err := <-writeErr:
			t.Fatalf("WriteFile ended before the kill: %v", err)
		}
		var tmp string
		eventually(t, 30*time.Second, "the write's temporary file appears", func() (bool, string) {
			ents, _ := os.ReadDir(filepath.Join(ws, "data"))
			for _, e := range ents {
				if workspace.IsTempName(e.Name()) {
					tmp = filepath.Join(ws, "data", e.Name())
					return true, ""
				}
			}
			return false, fmt.Sprint(ents)
		})
		killDaemon(t, f.dir)
		openGate()
		var err error
		select {
		case err = <-writeErr:
		case <-time.After(30 * time.Second):
			t.Fatal("WriteFile hangs after the daemon died")
		}
		t.Logf("WriteFile after SIGKILL: %v", err)
		if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
			t.Errorf("WriteFile error %v: want ErrUnavailable, retryable (the write is atomic)", err)
		}
		if got, err := os.ReadFile(filepath.Join(ws, "data", "f.txt")); err != nil || string(got) != old {
			t.Fatalf("f.txt after the interrupted write = %q, %v: torn or lost", got, err)
		}

		s2 := f.resume(t, ctx)
		if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temporary file %s survived the restart: %v", filepath.Base(tmp), err)
		}
		ls, err := s2.Agent().ListDir(ctx, "data", compute.ListDirOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ls.Entries) != 1 || ls.Entries[0].Name != "f.txt" {
			t.Errorf("data/ after restart lists %v, want only f.txt", ls.Entries)
		}
		if got := readFile(t, ctx, s2.Agent(), "data/f.txt"); got != old {
			t.Fatalf("f.txt through the new daemon = %q", got)
		}
		// What Start saw: the kept workspace's fingerprint equals the
		// snapshot's, so it was not restored over.
		st, err := s2.State()
		if err != nil {
			t.Fatal(err)
		}
		if st.Fingerprint == "" {
			t.Fatal("no fingerprint after resume")
		}
		big := strings.Repeat("B", 3<<20)
		if _, err := s2.Agent().WriteFile(ctx, "data/f.txt", compute.WriteFileOptions{}, strings.NewReader(big)); err != nil {
			t.Fatalf("the retried write: %v", err)
		}
		if got := readFile(t, ctx, s2.Agent(), "data/f.txt"); got != big {
			t.Fatalf("the retried write left %d bytes", len(got))
		}
	})
}

// TestFaultConnectionCutDuringStream: the harness's connection is cut
// (twice) while a command streams its output; Follow re-attaches from its
// cursor through a new connection, and the output arrives complete, in
// order, exactly once. An Exec cut the same way fails, not retryable.
func TestFaultConnectionCutDuringStream(t *testing.T) {
	ctx := testCtx(t)
	token, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	sb := startSandbox(t, Options{Token: token})
	proxy := faultnet.Start(t, faultnet.Unix, "unix://"+sb.Socket)
	client, err := agentclient.Dial(agentclient.Options{Address: proxy.Address(), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	const lines = 3000
	cmd := fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo line-$i; i=$((i+1)); if [ $((i %% 150)) -eq 0 ]; then sleep 0.05; fi; done", lines)
	st, err := client.Start(ctx, compute.ProcessSpec{Command: cmd}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var dropped int64
	cutAt := []int{400, 1500}
	exit, err := client.Follow(ctx, st.Process.ProcessID, compute.FollowOptions{}, func(m *compute.Output) error {
		dropped += m.DroppedBytes
		for _, c := range m.Chunks {
			out.Write(c.Data)
		}
		if len(cutAt) > 0 && bytes.Count(out.Bytes(), []byte("\n")) >= cutAt[0] && m.Exit == nil {
			cutAt = cutAt[1:]
			proxy.Cut()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Follow across cuts: %v", err)
	}
	if exit.ExitCode != 0 || dropped != 0 {
		t.Fatalf("exit %v, dropped %d", exit, dropped)
	}
	if len(cutAt) != 0 {
		t.Fatalf("the command ended before every cut (%d left)", len(cutAt))
	}
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(got) != lines {
		t.Fatalf("got %d lines, want %d", len(got), lines)
	}
	for i, l := range got {
		if l != "line-"+strconv.Itoa(i) {
			t.Fatalf("line %d = %q: output lost, repeated or out of order", i, l)
		}
	}

	// Exec is not idempotent: cut in the middle, it fails and says so.
	execErr := make(chan error, 1)
	first := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := client.Exec(ctx, compute.ProcessSpec{Command: "while true; do echo x; sleep 0.02; done"}, compute.ExecOptions{}, func(m *compute.ExecEvent) error {
			if len(m.Chunks) > 0 {
				once.Do(func() { close(first) })
			}
			return nil
		})
		execErr <- err
	}()
	select {
	case <-first:
	case err := <-execErr:
		t.Fatalf("Exec ended early: %v", err)
	}
	proxy.Cut()
	select {
	case err = <-execErr:
	case <-time.After(30 * time.Second):
		t.Fatal("Exec hangs after its connection was cut")
	}
	t.Logf("Exec after a cut: %v", err)
	if !errors.Is(err, compute.ErrUnavailable) || compute.Retryable(err) {
		t.Errorf("Exec error %v: want ErrUnavailable, not retryable", err)
	}
	// The client reconnects by itself for the next call.
	if _, err := client.Info(ctx); err != nil {
		t.Fatalf("Info after the cuts: %v", err)
	}
}
