package local

// These tests run the real sandbox-agentd binary. TestMain builds it once
// (agentdtest: the Makefile's flags, a stamped test version) and every
// test launches it as a child process.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// Stamped into the test binary so Info and --version can be checked exactly.
const (
	testVersion = agentdtest.Version
	testCommit  = agentdtest.Commit
)

// agentdBin is the sandbox-agentd binary built by TestMain.
var agentdBin string

func TestMain(m *testing.M) { agentdtest.Main(m, &agentdBin) }

// ---- helpers ----

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
}

// startSandbox launches the built daemon through Start and closes it when
// the test ends (Close is idempotent enough: a second call only finds an
// exited process and an absent directory).
func startSandbox(t *testing.T, opts Options) *Sandbox {
	t.Helper()
	if opts.AgentdPath == "" {
		opts.AgentdPath = agentdBin
	}
	s, err := Start(testCtx(t), opts, testLogger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// eventually polls cond until it reports true or the deadline passes; the
// string it returns describes the last state for the failure message.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %s", what, timeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procStat is the part of /proc/<pid>/stat the tests need.
type procStat struct {
	pid, ppid, pgrp int
	state           byte
	comm            string
	start           uint64 // starttime in clock ticks: tells a reused pid apart
}

func (p procStat) String() string {
	return fmt.Sprintf("pid=%d comm=%s state=%c ppid=%d pgrp=%d", p.pid, p.comm, p.state, p.ppid, p.pgrp)
}

// readStat reads /proc/<pid>/stat; ok is false when the process is gone.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := strings.Fields(s[end+1:])
	// f[0]=state f[1]=ppid f[2]=pgrp ... f[19]=starttime
	if len(f) < 20 {
		return procStat{}, false
	}
	ps := procStat{pid: pid, comm: s[open+1 : end], state: f[0][0]}
	ps.ppid, _ = strconv.Atoi(f[1])
	ps.pgrp, _ = strconv.Atoi(f[2])
	ps.start, _ = strconv.ParseUint(f[19], 10, 64)
	return ps, true
}

// allProcs lists every process visible in /proc.
func allProcs() []procStat {
	ents, _ := os.ReadDir("/proc")
	var out []procStat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ps, ok := readStat(pid); ok {
			out = append(out, ps)
		}
	}
	return out
}

func procsWhere(keep func(procStat) bool) []procStat {
	var out []procStat
	for _, p := range allProcs() {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether the process seen as was still runs (same pid, same
// start time, not a zombie).
func alive(was procStat) bool {
	now, ok := readStat(was.pid)
	return ok && now.start == was.start && now.state != 'Z'
}

// exists reports whether the process seen as was still has a /proc entry,
// zombie or not.
func exists(was procStat) bool {
	now, ok := readStat(was.pid)
	return ok && now.start == was.start
}

// mustStat reads a process that must exist now.
func mustStat(t *testing.T, pid int) procStat {
	t.Helper()
	ps, ok := readStat(pid)
	if !ok {
		t.Fatalf("process %d does not exist", pid)
	}
	return ps
}

// execShell runs a command line to completion through the daemon.
func execShell(ctx context.Context, t *testing.T, s *Sandbox, command string) (stdout, stderr string, code int) {
	t.Helper()
	res, err := s.Client.Exec(ctx, agentclient.ProcessSpec{Command: command}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatalf("Exec %q: %v", command, err)
	}
	return string(res.Stdout), string(res.Stderr), res.Exit.ExitCode
}

// readLine reads a started process's output until it holds a full line.
func readLine(ctx context.Context, t *testing.T, s *Sandbox, processID string) string {
	t.Helper()
	var out []byte
	var cursor int64
	for !bytes.Contains(out, []byte("\n")) {
		resp, err := s.Client.ReadOutput(ctx, processID, agentclient.ReadOutputOptions{Cursor: cursor, YieldTime: 500 * time.Millisecond})
		if err != nil {
			t.Fatalf("ReadOutput %s: %v", processID, err)
		}
		for _, c := range resp.Chunks {
			out = append(out, c.Data...)
		}
		cursor = resp.NextCursor
		if resp.Exit != nil && !bytes.Contains(out, []byte("\n")) {
			t.Fatalf("process %s exited (%v) before printing a line: %q", processID, resp.Exit, out)
		}
	}
	return strings.TrimSpace(string(out[:bytes.IndexByte(out, '\n')]))
}
