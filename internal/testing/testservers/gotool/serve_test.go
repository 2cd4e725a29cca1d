package gotool

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// TestLaunch starts a program that becomes ready on the third poll, one
// that exits at once and one that never becomes ready: the first runs
// until Stop (twice is fine), the others fail with the program's name and
// leave no process behind.
func TestLaunch(t *testing.T) {
	testenv.Require(t, testenv.Tool("sleep"), testenv.Tool("true"))

	polls := 0
	cmd := exec.Command("sleep", "60")
	p, err := Launch("sleeper", cmd, 10*time.Second, func() bool { polls++; return polls == 3 })
	if err != nil {
		t.Fatal(err)
	}
	if polls != 3 {
		t.Fatalf("ready after %d polls, want 3", polls)
	}
	start := time.Now()
	p.Stop()
	p.Stop()
	if cmd.ProcessState == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Stop did not end the program at once (state %v, after %s)", cmd.ProcessState, time.Since(start))
	}

	if _, err := Launch("quitter", exec.Command("true"), 10*time.Second, func() bool { return false }); err == nil || !strings.Contains(err.Error(), "quitter exited at start") {
		t.Fatalf("a program that exits at start: %v", err)
	}

	cmd = exec.Command("sleep", "60")
	if _, err := Launch("mute", cmd, 200*time.Millisecond, func() bool { return false }); err == nil || !strings.Contains(err.Error(), "mute did not answer within 200ms") {
		t.Fatalf("a program that is never ready: %v", err)
	}
	if cmd.ProcessState == nil {
		t.Fatal("a program that was never ready was left running")
	}

	var none *Process
	none.Stop()
}

// TestLoopbackAddr gets a port on 127.0.0.1 that can be listened on.
func TestLoopbackAddr(t *testing.T) {
	addr, err := LoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
		t.Fatalf("LoopbackAddr() = %q, want a 127.0.0.1 address", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	ln.Close()
}

// fakeServer records its Stop.
type fakeServer struct{ stopped bool }

func (f *fakeServer) Stop() { f.stopped = true }

// TestStartTest starts a server of a program already in the cache: run
// gets a writable log, and the server is stopped when the test ends.
func TestStartTest(t *testing.T) {
	t.Setenv("BULKHEAD_TESTSERVERS_DIR", t.TempDir())
	p := Program{Name: "fake", Package: "example.com/fake", Version: "v0.0.1"}
	bin, err := p.Path()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var srv *fakeServer
	t.Run("server", func(t *testing.T) {
		srv = StartTest(t, p, "no fake", func(ctx context.Context, logw io.Writer) (*fakeServer, error) {
			if _, ok := ctx.Deadline(); !ok {
				return nil, fmt.Errorf("run's context has no deadline")
			}
			_, err := io.WriteString(logw, "started\n")
			return &fakeServer{}, err
		})
		if srv.stopped {
			t.Fatal("stopped before the test ended")
		}
	})
	if srv == nil || !srv.stopped {
		t.Fatalf("the server was not stopped when its test ended: %+v", srv)
	}
}

// TestAnswers: any answer will do when no status is wanted; otherwise only
// the wanted one; a server that is gone never answers.
func TestAnswers(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	if !Answers(srv.URL, 0)() {
		t.Error("a 404 is not an answer when any status will do")
	}
	if Answers(srv.URL, http.StatusOK)() {
		t.Error("a 404 passes for 200")
	}
	srv.Close()
	if Answers(srv.URL, 0)() {
		t.Error("a closed server answers")
	}
}
