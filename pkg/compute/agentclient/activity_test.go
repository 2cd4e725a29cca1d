package agentclient_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// activityDaemon runs the real sandbox-agentd binary on a unix socket of
// a fresh temporary directory and returns a ready client and the
// workspace's path.
func activityDaemon(t *testing.T) (*agentclient.Client, string) {
	t.Helper()
	token := hexToken(t)
	d := startRealDaemon(t, token)
	c := dial(t, "unix://"+d.sock, token)
	if _, err := agentclient.WaitReady(testCtx(t), c, agentclient.ReadyOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	return c, d.ws
}

// pollBound bounds every wait of these tests; they poll, never time.
const pollBound = 30 * time.Second

func info(ctx context.Context, t *testing.T, c *agentclient.Client) *agentclient.DaemonInfo {
	t.Helper()
	in, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.LastActivity.IsZero() || in.LastActivity.Before(in.StartedAt) {
		t.Fatalf("last activity %v: want set and not before the start %v", in.LastActivity, in.StartedAt)
	}
	return in
}

// settled polls Info until two answers 100 ms apart report the same last
// activity (CPU still used by a process that just started is counted by
// the samples until then), and returns it.
func settled(ctx context.Context, t *testing.T, c *agentclient.Client) time.Time {
	t.Helper()
	last := info(ctx, t, c).LastActivity
	for deadline := time.Now().Add(pollBound); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		now := info(ctx, t, c).LastActivity
		if now.Equal(last) {
			return now
		}
		last = now
	}
	t.Fatalf("the last activity did not settle within %v", pollBound)
	return time.Time{}
}

// movesPast polls Info until the last activity is after since, and
// returns it.
func movesPast(ctx context.Context, t *testing.T, c *agentclient.Client, since time.Time, what string) time.Time {
	t.Helper()
	for deadline := time.Now().Add(pollBound); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if la := info(ctx, t, c).LastActivity; la.After(since) {
			return la
		}
	}
	t.Fatalf("%s: the last activity stayed at %v for %v", what, since, pollBound)
	return time.Time{}
}

// stays checks that ten Info calls over half a second report since.
func stays(ctx context.Context, t *testing.T, c *agentclient.Client, since time.Time, what string) {
	t.Helper()
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		if la := info(ctx, t, c).LastActivity; !la.Equal(since) {
			t.Fatalf("%s: the last activity moved from %v to %v", what, since, la)
		}
	}
}

// Info alone never moves the last activity, and health checks do not
// either; a WriteFile and an Exec do, to a time during the call.
func TestLastActivityCalls(t *testing.T) {
	c, _ := activityDaemon(t)
	ctx := testCtx(t)
	first := info(ctx, t, c)
	if first.RunningProcesses != 0 {
		t.Fatalf("running processes of a fresh daemon: %d", first.RunningProcesses)
	}
	la := settled(ctx, t, c)
	if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: pollBound}); err != nil {
		t.Fatal(err) // health checks, then Info
	}
	stays(ctx, t, c, la, "Info and health alone")

	before := time.Now()
	if _, err := c.WriteFile(ctx, "a.txt", agentclient.WriteFileOptions{}, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	got := info(ctx, t, c).LastActivity
	if got.Before(before) || got.After(after) {
		t.Fatalf("after WriteFile the last activity is %v, want within [%v, %v]", got, before, after)
	}

	before = time.Now()
	if _, err := c.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"true"}}, agentclient.ExecOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if got := info(ctx, t, c).LastActivity; got.Before(before) {
		t.Fatalf("after Exec the last activity is %v, before the call (%v)", got, before)
	}
}

// A process that sleeps moves the last activity when it starts, not
// after; one that burns CPU without a word moves it while it runs; both
// are counted as running until they end.
func TestLastActivityCPU(t *testing.T) {
	c, _ := activityDaemon(t)
	ctx := testCtx(t)
	sleeper, err := c.Start(ctx, agentclient.ProcessSpec{Argv: []string{"sleep", "300"}}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	la := settled(ctx, t, c)
	stays(ctx, t, c, la, "a sleeping process")
	if n := info(ctx, t, c).RunningProcesses; n != 1 {
		t.Fatalf("running processes with a sleeper: %d, want 1", n)
	}

	burner, err := c.Start(ctx, agentclient.ProcessSpec{Command: "while :; do :; done"}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := info(ctx, t, c) // the first sample of the burner: measured, not counted
	if in.RunningProcesses != 2 {
		t.Fatalf("running processes with a sleeper and a burner: %d, want 2", in.RunningProcesses)
	}
	sampled := time.Now()
	got := movesPast(ctx, t, c, in.LastActivity, "a process burning CPU")
	if got.Before(sampled) {
		t.Fatalf("CPU use dated %v, before the sample that saw it (%v)", got, sampled)
	}

	for _, id := range []string{burner.Process.ProcessID, sleeper.Process.ProcessID} {
		if err := c.Signal(ctx, id, "KILL"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := info(ctx, t, c).RunningProcesses; n != 0 {
		t.Fatalf("running processes after both ended: %d", n)
	}
}

// Output moves the last activity without any call: the process waits
// silently on a FIFO the test writes to outside the daemon, then prints.
func TestLastActivityOutput(t *testing.T) {
	c, ws := activityDaemon(t)
	ctx := testCtx(t)
	fifo := filepath.Join(ws, "go.fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := c.Start(ctx, agentclient.ProcessSpec{Command: `read x < go.fifo; echo "got $x"; exec sleep 300`}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	la := settled(ctx, t, c)
	before := time.Now()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // the shell has it open for reading, or soon will
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("x\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := movesPast(ctx, t, c, la, "a process printing"); got.Before(before) {
		t.Fatalf("output dated %v, before it was triggered (%v)", got, before)
	}
	out, err := c.ReadOutput(ctx, st.Process.ProcessID, agentclient.ReadOutputOptions{YieldTime: pollBound})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, ch := range out.Chunks {
		text.Write(ch.Data)
	}
	if !strings.Contains(text.String(), "got x") {
		t.Fatalf("output %q: the process did not print", text.String())
	}
}

// A port forward carrying bytes moves the last activity, with no call in
// between: the port inside the sandbox speaks first on an open tunnel.
func TestLastActivityForward(t *testing.T) {
	c, _ := activityDaemon(t)
	ctx := testCtx(t)
	speak := make(chan struct{})
	port := serveTCP(t, func(conn *net.TCPConn) {
		select {
		case <-speak:
			_, _ = conn.Write([]byte("ping"))
		case <-ctx.Done():
		}
		_, _ = io.Copy(io.Discard, conn)
	})
	conn, err := c.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	la := settled(ctx, t, c)
	before := time.Now()
	close(speak)
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read through the tunnel: %q, %v", buf, err)
	}
	if got := movesPast(ctx, t, c, la, "a forward carrying bytes"); got.Before(before) {
		t.Fatalf("forwarded bytes dated %v, before they were sent (%v)", got, before)
	}
}
