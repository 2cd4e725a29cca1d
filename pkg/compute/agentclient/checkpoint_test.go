package agentclient_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestPrepareCheckpointRealDaemon runs the real sandbox-agentd binary and
// prepares it for a checkpoint: it answers, closes the caller's
// connection and every other one, removes its socket (it holds no socket
// then), keeps its processes running, refuses a second prepare, does
// nothing on a SIGUSR1 it was not prepared for, comes back on SIGUSR1 at
// the same address with the same token (the process's output read on from
// its cursor), and comes back by itself when the lease runs out.
func TestPrepareCheckpointRealDaemon(t *testing.T) {
	tok := hexToken(t)
	d := startRealDaemon(t, tok)
	cmd, sock, stderr := d.cmd, d.sock, d.stderr
	ctx := testCtx(t)
	c := dial(t, "unix://"+sock, tok)
	if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// SIGUSR1 while serving: nothing happens.
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	st, err := c.Start(ctx, agentclient.ProcessSpec{Command: "i=0; while :; do i=$((i+1)); echo $i; sleep 0.02; done"}, agentclient.StartOptions{})
	if err != nil {
		t.Fatalf("after a stray SIGUSR1: %v", err)
	}
	pid := st.Process.ProcessID
	out, err := c.ReadOutput(ctx, pid, agentclient.ReadOutputOptions{YieldTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cursor := out.NextCursor
	// Another connection, which the daemon must close too.
	other := dial(t, "unix://"+sock, tok)
	if _, err := other.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.PrepareCheckpoint(ctx, agentclient.PrepareCheckpointOptions{ResumeAfter: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	waitGone(t, sock)
	if n := socketsOf(t, cmd.Process.Pid); n != 0 {
		t.Fatalf("prepared, the daemon holds %d sockets", n)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Fatal("a prepared daemon accepts connections")
	}
	time.Sleep(200 * time.Millisecond) // the counter runs on meanwhile
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	c = dial(t, "unix://"+sock, tok)
	if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatalf("back after SIGUSR1: %v", err)
	}
	out, err = c.ReadOutput(ctx, pid, agentclient.ReadOutputOptions{Cursor: cursor, YieldTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for _, ch := range out.Chunks {
		got.Write(ch.Data)
	}
	if n := len(strings.Fields(got.String())); n < 5 || out.Exit != nil {
		t.Fatalf("the process did not run on while the daemon was closed: %q, exit %+v", got.String(), out.Exit)
	}
	// Twice, then the lease.
	if err := c.PrepareCheckpoint(ctx, agentclient.PrepareCheckpointOptions{ResumeAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := other.PrepareCheckpoint(ctx, agentclient.PrepareCheckpointOptions{}); !errors.Is(err, errkind.ErrFailedPrecondition) && !errors.Is(err, errkind.ErrUnavailable) {
		t.Fatalf("a second prepare: %v", err)
	}
	c.Close()
	waitGone(t, sock)
	c = dial(t, "unix://"+sock, tok)
	if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatalf("back after the lease: %v", err)
	}
	if _, err := c.List(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), tok) {
		t.Fatal("the daemon logged its token")
	}
}

// waitGone waits until path does not exist.
func waitGone(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// socketsOf counts the sockets process pid has open.
func socketsOf(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}
