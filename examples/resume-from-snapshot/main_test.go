package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

// TestRun runs the example as `go run .` would, offline: a local sandbox
// and the scripted model.
func TestRun(t *testing.T) {
	// A short state directory: unix socket paths are short.
	dir, err := os.MkdirTemp("", "bh-resume-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Sandbox accounts of a root harness pass through to the workspaces.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	cfg := config{StateDir: filepath.Join(dir, "state"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, cfg, &out, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	// The output tells the story in order.
	want := []string{
		"== Part 1",
		"closed: workspace persisted to snapshot",
		"deleted the sandbox: 0 sandboxes left",
		"resumed session",
		"data/readings.csv is back (31 bytes, unchanged)",
		"notes/todo.md is back (34 bytes, unchanged)",
		"build 42: ok",
		"== Part 2",
		"Created report/summary.md",
		"stopped: exec_command: $ tar -czf report.tar.gz report && tar -tzf report.tar.gz needs approval (call call_3)",
		"deleted the sandbox of agent \"packer\" while the run waited",
		"approved call call_3",
		"report/summary.md",
		"final output: Packed report/ into report.tar.gz.",
		"the runner cleaned up: 0 sandboxes left",
	}
	rest := got
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Fatalf("output lacks %q (in order):\n%s", w, got)
		}
		rest = rest[i+len(w):]
	}
	// Nothing is left running: the sandboxes' directories are gone.
	entries, err := os.ReadDir(filepath.Join(cfg.StateDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("sandboxes left behind: %v", entries)
	}
}
