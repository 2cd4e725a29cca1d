package process

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// newTestManager returns a Manager shut down at the end of the test.
func newTestManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := NewManager(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return m
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// output is everything a process printed, by stream.
type output struct {
	stdout, stderr, pty bytes.Buffer
	dropped             int64
	exit                ExitStatus
}

// collect attaches from offset 0 until the process exits.
func collect(t testing.TB, m *Manager, id string) *output {
	t.Helper()
	o := &output{}
	err := m.Attach(testCtx(t), id, 0, func(r ReadResult) error {
		o.dropped += r.Dropped
		for _, c := range r.Chunks {
			switch c.Stream {
			case Stdout:
				o.stdout.Write(c.Data)
			case Stderr:
				o.stderr.Write(c.Data)
			case PTY:
				o.pty.Write(c.Data)
			}
		}
		if r.Exit != nil {
			o.exit = *r.Exit
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	return o
}

// run starts opts and collects its output.
func run(t testing.TB, m *Manager, opts StartOptions) *output {
	t.Helper()
	info, err := m.Start(testCtx(t), opts)
	if err != nil {
		t.Fatalf("Start %v: %v", opts.Argv, err)
	}
	return collect(t, m, info.ID)
}

func mustStart(t testing.TB, m *Manager, opts StartOptions) Info {
	t.Helper()
	info, err := m.Start(testCtx(t), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return info
}

// wantErr checks that err wraps sentinel and is a *errkind.ProcessError
// whose message contains each of subs.
func wantErr(t testing.TB, err, sentinel error, subs ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error = %v, want %v", err, sentinel)
	}
	var pe *errkind.ProcessError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *errkind.ProcessError", err)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupMembers lists the live (non-zombie) pids of process group pgid.
func groupMembers(pgid int) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, pg, ok := procStat(pid); ok && pg == pgid && st != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, _, ok := procStat(pid)
	return ok && st != "Z"
}

// procStat returns the state and process group of pid.
func procStat(pid int) (state string, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return "", 0, false
	}
	pg, _ := strconv.Atoi(f[2])
	return f[0], pg, true
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
