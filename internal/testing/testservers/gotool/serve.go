package gotool

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// Process is a server program started by Launch.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// readyPoll is how often Launch asks whether the program is ready.
const readyPoll = 50 * time.Millisecond

// Launch starts cmd (its arguments, environment and output as the caller
// set them) in a process group of its own that dies with the test binary
// (Pdeathsig), and polls ready until it says yes. It fails when the
// program exits first or is not ready within wait, and then kills it.
// name is the program's name for the errors.
func Launch(name string, cmd *exec.Cmd, wait time.Duration, ready func() bool) (*Process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(p.done)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited at start (see its log)", name)
		default:
		}
		if ready() {
			return p, nil
		}
		time.Sleep(readyPoll)
	}
	p.Stop()
	return nil, fmt.Errorf("%s did not answer within %s", name, wait)
}

// Answers is a readiness check for Launch: a GET of url gets an answer,
// with status want (any status when want is 0).
func Answers(url string, want int) func() bool {
	return func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return want == 0 || resp.StatusCode == want
	}
}

// Stop kills the process's group at once (as a crash would) and waits
// for the process to end. Stopping twice, or a nil Process, is fine.
func (p *Process) Stop() {
	if p == nil || p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}

// LoopbackAddr returns HOST:PORT of a TCP port on 127.0.0.1 that was free
// when asked (its listener is closed again), for a server to listen on.
func LoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// StartTest is the test side of a server package's Start: it builds p
// (once per machine; a program that cannot be had skips the test through
// testenv, with missing before the reason, and so fails it under
// CI=true), then starts the server with run, its output going to
// p.Name.log in a test directory. The server stops when the test ends,
// and a failed test's log shows the tail of the server's. A server that
// does not start fails the test.
func StartTest[S interface{ Stop() }](t testing.TB, p Program, missing string, run func(ctx context.Context, logw io.Writer) (S, error)) S {
	t.Helper()
	var none S
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout())
	defer cancel()
	if _, err := p.Install(ctx); err != nil {
		testenv.Skip(t, missing+": "+err.Error())
		return none
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), p.Name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil && len(b) > 0 {
				t.Logf("%s log:\n%s", p.Name, Tail(b))
			}
		}
	})
	s, err := run(ctx, logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop) // runs before the log's cleanup: the log is whole when shown
	return s
}
