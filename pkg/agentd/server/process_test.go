package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/faultnet"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func sh(cmd string) agentclient.ProcessSpec { return agentclient.ProcessSpec{Command: cmd} }

func TestExecOutputStreamsAndExit(t *testing.T) {
	td := newTestDaemon(t, nil)
	res, err := td.client.Exec(ctxT(t), sh("echo out; echo err >&2; exit 7"), agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.Exit.ExitCode != 7 {
		t.Fatalf("stdout %q stderr %q exit %v", res.Stdout, res.Stderr, res.Exit)
	}
	if res.Process.ProcessID == "" || res.Process.PID <= 0 {
		t.Fatalf("no process info: %v", res.Process)
	}
}

func TestExecStdinAndTTY(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	res, err := td.client.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"tr", "a-z", "A-Z"}}, agentclient.ExecOptions{Stdin: []byte("shout\n")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "SHOUT\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	res, err = td.client.Exec(ctx, agentclient.ProcessSpec{Command: "stty size; test -t 0 && echo tty", Tty: true, Size: agentclient.TerminalSize{Rows: 33, Cols: 101}}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.ReplaceAll(string(res.Stdout), "\r", ""); got != "33 101\ntty\n" {
		t.Fatalf("tty output %q", got)
	}
}

func TestCleanEnvironment(t *testing.T) {
	t.Setenv("BULKHEAD_TEST_SECRET", "sk-do-not-leak")
	td := newTestDaemon(t, nil)
	res, err := td.client.Exec(ctxT(t), agentclient.ProcessSpec{Argv: []string{"env"}, Env: map[string]string{"MINE": "yes"}}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	env := string(res.Stdout)
	if strings.Contains(env, "sk-do-not-leak") || strings.Contains(env, "BULKHEAD_TEST_SECRET") {
		t.Fatalf("the daemon's environment leaked into a process:\n%s", env)
	}
	if !strings.Contains(env, "MINE=yes\n") || !strings.Contains(env, "PATH=") {
		t.Fatalf("the request's env or the defaults are missing:\n%s", env)
	}
}

func TestCwdIsConfined(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	if err := os.MkdirAll(filepath.Join(td.workspace, "sub/dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := td.client.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"pwd"}, Cwd: "sub/dir"}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != filepath.Join(td.workspace, "sub/dir") {
		t.Fatalf("pwd %q", got)
	}
	for _, cwd := range []string{"../..", "/etc", "sub/../../.."} {
		_, err := td.client.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"pwd"}, Cwd: cwd}, agentclient.ExecOptions{}, nil)
		if !errors.Is(err, errkind.ErrPathEscape) {
			t.Errorf("cwd %q: want ErrPathEscape, got %v", cwd, err)
		}
	}
	// A symlink inside the workspace pointing out is refused too.
	if err := os.Symlink("/etc", filepath.Join(td.workspace, "out")); err != nil {
		t.Fatal(err)
	}
	if _, err := td.client.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"pwd"}, Cwd: "out"}, agentclient.ExecOptions{}, nil); !errors.Is(err, errkind.ErrPathEscape) {
		t.Errorf("cwd through symlink: want ErrPathEscape, got %v", err)
	}
}

func TestStartFailuresAreSpecific(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	if err := os.WriteFile(filepath.Join(td.workspace, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		spec agentclient.ProcessSpec
		want error
	}{
		{"missing binary", agentclient.ProcessSpec{Argv: []string{"no-such-binary-xyz"}}, errkind.ErrNotFound},
		{"missing absolute binary", agentclient.ProcessSpec{Argv: []string{"/nonexistent/bin"}}, errkind.ErrNotFound},
		{"missing cwd", agentclient.ProcessSpec{Argv: []string{"true"}, Cwd: "nope"}, errkind.ErrNotFound},
		{"cwd is a file", agentclient.ProcessSpec{Argv: []string{"true"}, Cwd: "file"}, errkind.ErrNotDirectory},
		{"unknown user", agentclient.ProcessSpec{Argv: []string{"true"}, User: "no-such-user"}, errkind.ErrNotFound},
		{"argv and command", agentclient.ProcessSpec{Argv: []string{"true"}, Command: "true"}, errkind.ErrInvalidArgument},
		{"nothing to run", agentclient.ProcessSpec{}, errkind.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := td.client.Start(ctx, c.spec, agentclient.StartOptions{})
			if !errors.Is(err, c.want) {
				t.Fatalf("want %v, got %v", c.want, err)
			}
			if errkind.Retryable(err) {
				t.Fatalf("a bad request must not be retryable: %v", err)
			}
		})
	}
	list, err := td.client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Fatalf("failed starts left processes: %v", list)
	}
}

func TestProcessStateErrors(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, sh("exit 0"), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	if _, err := td.client.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := td.client.WriteStdin(ctx, id, 0, []byte("x")); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Errorf("stdin to an exited process: want ErrFailedPrecondition, got %v", err)
	}
	if err := td.client.Resize(ctx, id, agentclient.TerminalSize{Rows: 10, Cols: 10}); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Errorf("resize without a tty: want ErrFailedPrecondition, got %v", err)
	}
	if err := td.client.Signal(ctx, id, "NOPE"); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("unknown signal: want ErrInvalidArgument, got %v", err)
	}
	if _, err := td.client.Wait(ctx, "no-such-process"); !errors.Is(err, errkind.ErrNotFound) {
		t.Errorf("unknown process: want ErrNotFound, got %v", err)
	}
	var pe *errkind.ProcessError
	if _, err := td.client.ReadOutput(ctx, "no-such-process", agentclient.ReadOutputOptions{}); !errors.As(err, &pe) || pe.ProcessID != "no-such-process" {
		t.Errorf("error should name the process: %#v", err)
	}
}

func TestMaxProcesses(t *testing.T) {
	td := newTestDaemon(t, func(c *agentd.Config) { c.MaxProcesses = 2 })
	ctx := ctxT(t)
	for i := 0; i < 2; i++ {
		if _, err := td.client.Start(ctx, sh("sleep 100"), agentclient.StartOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := td.client.Start(ctx, sh("sleep 100"), agentclient.StartOptions{})
	if !errors.Is(err, errkind.ErrResourceExhausted) {
		t.Fatalf("want ErrResourceExhausted, got %v", err)
	}
}

func TestStartIsIdempotentByRequestID(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	spec := sh("echo ran >> count.txt")
	a, err := td.client.Start(ctx, spec, agentclient.StartOptions{RequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := td.client.Wait(ctx, a.Process.ProcessID); err != nil {
		t.Fatal(err)
	}
	b, err := td.client.Start(ctx, spec, agentclient.StartOptions{RequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Existing || b.Process.ProcessID != a.Process.ProcessID {
		t.Fatalf("retried start should return the same process: %v vs %v", a, b)
	}
	data, _ := os.ReadFile(filepath.Join(td.workspace, "count.txt"))
	if string(data) != "ran\n" {
		t.Fatalf("the command ran %d times", strings.Count(string(data), "ran"))
	}
	_, err = td.client.Start(ctx, sh("echo other"), agentclient.StartOptions{RequestID: "req-1"})
	if !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("same request id, different command: want ErrConflict, got %v", err)
	}
}

func TestStdinOffsetsAreIdempotent(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, agentclient.ProcessSpec{Argv: []string{"cat"}, Stdin: true}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	steps := []struct {
		offset int64
		data   string
		next   int64
		err    error
	}{
		{0, "abc", 3, nil},
		{0, "abc", 3, nil},  // resent: nothing applied twice
		{1, "bcde", 5, nil}, // overlapping resend: only "de" is new
		{5, "f", 6, nil},    // continues
		{10, "zz", 0, errkind.ErrConflict},
	}
	for i, s := range steps {
		next, err := td.client.WriteStdin(ctx, id, s.offset, []byte(s.data))
		if !errors.Is(err, s.err) || (s.err == nil && next != s.next) {
			t.Fatalf("step %d: next %d err %v, want %d %v", i, next, err, s.next, s.err)
		}
	}
	if err := td.client.CloseStdin(ctx, id); err != nil {
		t.Fatal(err)
	}
	out := readAll(t, td.client, id)
	if out != "abcdef" {
		t.Fatalf("cat saw %q", out)
	}
}

func TestPTYInterrupt(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, agentclient.ProcessSpec{Argv: []string{"sleep", "100"}, Tty: true}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	time.Sleep(100 * time.Millisecond)
	if _, err := td.client.WriteStdin(ctx, id, 0, []byte{0x03}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	exit, err := td.client.Wait(wctx, id)
	if err != nil {
		t.Fatalf("Ctrl-C did not stop sleep: %v", err)
	}
	if exit.Signal != "SIGINT" {
		t.Fatalf("want SIGINT, got %v", exit)
	}
	if err := td.client.Resize(ctx, id, agentclient.TerminalSize{Rows: 40, Cols: 120}); !errors.Is(err, errkind.ErrFailedPrecondition) && !errors.Is(err, errkind.ErrNotFound) && err != nil {
		t.Fatalf("resize after exit: %v", err)
	}
}

func TestSignalKillsWholeGroup(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, sh("sleep 1000 & echo $!; sleep 1000"), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	res, err := td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{YieldTime: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bg, err := strconv.Atoi(strings.TrimSpace(joinData(res.Chunks)))
	if err != nil {
		t.Fatalf("background pid: %v", err)
	}
	if err := td.client.Signal(ctx, id, "TERM"); err != nil {
		t.Fatal(err)
	}
	exit, err := td.client.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Signal != "SIGTERM" {
		t.Fatalf("exit %v", exit)
	}
	waitGone(t, bg)
	waitGone(t, int(st.Process.PID))
}

func TestProcessSurvivesDisconnectAndReplays(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, sh("for i in $(seq 1 40); do echo line $i; sleep 0.005; done"), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	first, err := td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{YieldTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	td.client.Close() // the harness goes away
	time.Sleep(300 * time.Millisecond)
	again, err := agentclient.Dial(agentclient.Options{Address: "unix://" + td.socket, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	rest := readFrom(t, again, id, first.NextCursor)
	got := joinData(first.Chunks) + rest
	if got != expectedLines(40) {
		t.Fatalf("replayed output differs:\n%s", got)
	}
}

// TestConnectionCutMidStream cuts the TCP connection under a running Follow
// several times; the client reconnects and resumes from its cursor, and the
// output arrives complete, in order, exactly once.
func TestConnectionCutMidStream(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	proxy := faultnet.Start(t, faultnet.TCP, "unix://"+td.socket)
	c, err := agentclient.Dial(agentclient.Options{Address: proxy.Address(), Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 300
	st, err := c.Start(ctx, sh(fmt.Sprintf("for i in $(seq 1 %d); do echo line $i; sleep 0.002; done", n)), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	cuts := 0
	exit, err := c.Follow(ctx, st.Process.ProcessID, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
		got.WriteString(joinData(m.Chunks))
		if m.DroppedBytes != 0 {
			t.Errorf("dropped %d bytes", m.DroppedBytes)
		}
		if cuts < 3 && got.Len() > (cuts+1)*800 {
			cuts++
			proxy.Cut()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cuts == 0 {
		t.Fatal("the connection was never cut")
	}
	if exit.ExitCode != 0 || got.String() != expectedLines(n) {
		t.Fatalf("after %d cuts: exit %v, output intact=%v", cuts, exit, got.String() == expectedLines(n))
	}
}

func TestShutdownKillsProcesses(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, sh("sleep 1000 & sleep 1000"), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	td.srv.Shutdown(sctx)
	waitGone(t, int(st.Process.PID))
	// A member killed with the group can take a moment to stop running
	// on a loaded machine; it must be gone well within the deadline.
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive := liveGroupMembers(int(st.Process.PID))
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group members survived shutdown: %v", alive)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveGroupMembers lists the pids of process group pgid that are not zombies.
func liveGroupMembers(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		// fields after the command: state, ppid, pgrp, ...
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

func TestReadOutputYield(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, sh("sleep 0.3; echo late"), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	// Nothing yet: returns empty after the yield, not an error.
	res, err := td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{YieldTime: 20 * time.Millisecond})
	if err != nil || len(res.Chunks) != 0 || res.Exit != nil {
		t.Fatalf("early read: %v %v", res, err)
	}
	// A long yield returns as soon as output arrives (not after the full yield).
	res, err = td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{YieldTime: 20 * time.Second})
	if err != nil || joinData(res.Chunks) != "late\n" {
		t.Fatalf("read: %v %v", res, err)
	}
	// Reading past the end of an exited process reports the exit.
	res, err = td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{Cursor: res.NextCursor, YieldTime: 5 * time.Second})
	if err != nil || res.Exit == nil {
		t.Fatalf("final read: %v %v", res, err)
	}
}

func TestOutputBufferWrapReportsDropped(t *testing.T) {
	td := newTestDaemon(t, func(c *agentd.Config) { c.OutputBufferBytes = 64 << 10 })
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, sh("head -c 1000000 /dev/zero"), agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	if _, err := td.client.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	var got, dropped int64
	exit, err := td.client.Follow(ctx, id, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
		for _, c := range m.Chunks {
			got += int64(len(c.Data))
		}
		dropped += m.DroppedBytes
		return nil
	})
	if err != nil || exit == nil {
		t.Fatal(err)
	}
	if got+dropped != 1000000 || got > 64<<10 {
		t.Fatalf("got %d + dropped %d, want 1000000 with at most 64 KiB kept", got, dropped)
	}
}

func TestExecFreesOutputOnceExitSent(t *testing.T) {
	// Once Exec sent the exit, the daemon no longer keeps the output: a
	// later ReadOutput or Attach reports it all as dropped, with the exit.
	// Start + Attach keeps it for the exit retention.
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	const size = 100000
	cmd := sh(fmt.Sprintf("head -c %d /dev/zero", size))
	res, err := td.client.Exec(ctx, cmd, agentclient.ExecOptions{}, nil)
	if err != nil || len(res.Stdout) != size || res.Dropped != 0 || res.Exit.ExitCode != 0 {
		t.Fatalf("Exec: %d bytes, dropped %d, exit %v, %v", len(res.Stdout), res.Dropped, res.Exit, err)
	}
	id := res.Process.ProcessID
	out, err := td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{})
	if err != nil || len(out.Chunks) != 0 || out.DroppedBytes != size || out.NextCursor != size || out.Exit == nil {
		t.Fatalf("ReadOutput from 0 after Exec: %d chunks, dropped %d, next %d, exit %v, %v",
			len(out.Chunks), out.DroppedBytes, out.NextCursor, out.Exit, err)
	}
	var got, dropped int64
	exit, err := td.client.Follow(ctx, id, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
		got += int64(len(joinData(m.Chunks)))
		dropped += m.DroppedBytes
		return nil
	})
	if err != nil || got != 0 || dropped != size || exit == nil {
		t.Fatalf("Attach from 0 after Exec: got %d, dropped %d, exit %v, %v", got, dropped, exit, err)
	}
	list, err := td.client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, p := range list {
		listed = listed || (p.ProcessID == id && p.State == agentclient.ProcessExited && p.Exit != nil)
	}
	if !listed {
		t.Fatalf("the Exec'd process is not listed with its exit: %v", list)
	}

	st, err := td.client.Start(ctx, cmd, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id = st.Process.ProcessID
	if got := readAll(t, td.client, id); len(got) != size {
		t.Fatalf("Start + Attach: %d bytes", len(got))
	}
	out, err = td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{MaxBytes: size})
	if err != nil || len(joinData(out.Chunks)) != size || out.DroppedBytes != 0 || out.Exit == nil {
		t.Fatalf("ReadOutput from 0 after Start + Attach: %d bytes, dropped %d, exit %v, %v",
			len(joinData(out.Chunks)), out.DroppedBytes, out.Exit, err)
	}
}

func TestExecAndAttachFlowControl(t *testing.T) {
	// With a client attached, nothing is dropped however small the ring:
	// the process is held back while the client is slow.
	td := newTestDaemon(t, func(c *agentd.Config) { c.OutputBufferBytes = 64 << 10 })
	ctx := ctxT(t)
	const size = 16 << 20
	res, err := td.client.Exec(ctx, sh(fmt.Sprintf("head -c %d /dev/zero; echo end >&2", size)), agentclient.ExecOptions{}, nil)
	if err != nil || len(res.Stdout) != size || string(res.Stderr) != "end\n" || res.Dropped != 0 || res.Exit.ExitCode != 0 {
		t.Fatalf("Exec: stdout %d bytes, stderr %q, dropped %d, exit %v, %v", len(res.Stdout), res.Stderr, res.Dropped, res.Exit, err)
	}

	// Start + Follow: output written before the follower attaches may be
	// dropped (no reader holds it), so the process waits for a byte of
	// stdin, which the test sends only once its Follow is receiving.
	spec := sh(fmt.Sprintf("echo ready; head -c 1 >/dev/null; head -c %d /dev/zero", size))
	spec.Stdin = true
	st, err := td.client.Start(ctx, spec, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	var got, dropped int64
	calls := 0
	released := make(chan error, 1)
	exit, err := td.client.Follow(ctx, id, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
		if calls++; calls%8 == 0 {
			time.Sleep(time.Millisecond) // a slow client
		}
		for _, c := range m.Chunks {
			got += int64(len(c.Data))
		}
		dropped += m.DroppedBytes
		if calls == 1 {
			go func() {
				_, err := td.client.WriteStdin(ctx, id, 0, []byte("x"))
				released <- err
			}()
		}
		return nil
	})
	if werr := <-released; werr != nil {
		t.Fatal(werr)
	}
	if err != nil || exit.ExitCode != 0 || got != size+int64(len("ready\n")) || dropped != 0 {
		t.Fatalf("Follow: got %d, dropped %d, exit %v, %v", got, dropped, exit, err)
	}
}

func TestExecMessageOrder(t *testing.T) {
	// The started process comes in the first message only (possibly with
	// output and the exit of a quick command), the exit in the last only.
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	for _, cmd := range []string{"true", "echo hi", "echo a; sleep 0.1; echo b >&2; exit 3"} {
		var msgs []*agentclient.ExecEvent
		res, err := td.client.Exec(ctx, sh(cmd), agentclient.ExecOptions{}, func(m *agentclient.ExecEvent) error {
			msgs = append(msgs, m)
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		for i, m := range msgs {
			if (m.Started != nil) != (i == 0) || (m.Exit != nil) != (i == len(msgs)-1) {
				t.Fatalf("%s: message %d of %d: started %v, exit %v", cmd, i, len(msgs), m.Started != nil, m.Exit)
			}
		}
		if res.Process.ProcessID == "" {
			t.Fatalf("%s: no process info", cmd)
		}
	}
	res, err := td.client.Exec(ctx, sh("echo a; sleep 0.1; echo b >&2; exit 3"), agentclient.ExecOptions{}, nil)
	if err != nil || string(res.Stdout) != "a\n" || string(res.Stderr) != "b\n" || res.Exit.ExitCode != 3 {
		t.Fatalf("Exec = %q %q %v, %v", res.Stdout, res.Stderr, res.Exit, err)
	}
}

// --- helpers ---

func readAll(t *testing.T, c *agentclient.Client, id string) string { return readFrom(t, c, id, 0) }

func readFrom(t *testing.T, c *agentclient.Client, id string, cursor int64) string {
	t.Helper()
	var b strings.Builder
	if _, err := c.Follow(ctxT(t), id, agentclient.FollowOptions{Cursor: cursor}, func(m *agentclient.Output) error {
		b.WriteString(joinData(m.Chunks))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func joinData(chunks []agentclient.OutputChunk) string {
	var b strings.Builder
	for _, c := range chunks {
		b.Write(c.Data)
	}
	return b.String()
}

func expectedLines(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// waitGone waits until pid no longer names a live process (gone or a zombie
// awaiting its reaper).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d survived", pid)
}
