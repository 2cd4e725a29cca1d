// Command resume-from-snapshot shows how a sandbox's workspace outlives
// the sandbox. A session made with a snapshot store is persisted when it
// closes, and its State (plain JSON, no secrets) is all a later process needs
// to bring it back. If the sandbox is gone, Resume launches a fresh one and
// restores the workspace from the snapshot.
//
// Part 1 drives a compute.Session directly. Part 2 does the same through
// the harness: a run stops for a human's approval, its RunState is saved
// as JSON, the sandbox is deleted, and resuming the approved run brings
// the workspace back in a new sandbox before the approved command runs.
//
// Everything is real except the model, which is a scripted Responses server
// (pkg/harness/replay), so the run stops for approval at the same
// point every time and no API key is needed.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// config is what the flags set.
type config struct {
	// StateDir holds the sandboxes, the snapshot store and the saved
	// states; "" means a temporary directory removed at the end.
	StateDir string
	// AgentdPath is the sandbox-agentd binary ("" means next to this
	// program, then PATH).
	AgentdPath string
	// Isolation confines the local sandboxes (none, bubblewrap, auto).
	Isolation local.Isolation
}

func main() {
	var cfg config
	var isolation string
	var verbose bool
	flag.StringVar(&cfg.StateDir, "state-dir", "", "keep sandboxes, snapshots and saved states here (default: a temporary directory, removed at the end)")
	flag.StringVar(&cfg.AgentdPath, "agentd", "", "sandbox-agentd binary (default: next to this program, then PATH)")
	flag.StringVar(&isolation, "isolation", "none", "local sandbox isolation: none, bubblewrap or auto")
	flag.BoolVar(&verbose, "v", false, "log what the library does on stderr")
	flag.Parse()
	iso, err := local.ParseIsolation(isolation)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg.Isolation = iso
	log := zap.NewNop()
	if verbose {
		log, _ = zap.NewDevelopment()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "resume-from-snapshot:", err)
		os.Exit(1)
	}
}

// run runs both parts of the example, writing what happens to out.
func run(ctx context.Context, cfg config, out io.Writer, log *zap.Logger) error {
	dir := cfg.StateDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "bh-resume-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
		// A root harness's sandboxes run as accounts of their own, which
		// pass through here to their workspaces.
		if err := os.Chmod(dir, 0o711); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	// One snapshot store and one client serve both parts. A client made
	// with the same store in another process would resume these
	// sessions just as well.
	store, err := snapshot.NewLocal(filepath.Join(dir, "snapshots"))
	if err != nil {
		return err
	}
	client, err := local.NewClient(local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: cfg.AgentdPath, Isolation: cfg.Isolation},
		compute.ClientOptions{Snapshots: store, Log: log})
	if err != nil {
		return err
	}
	if err := sessionPart(ctx, client, store, dir, out); err != nil {
		return fmt.Errorf("part 1: %w", err)
	}
	if err := runStatePart(ctx, client, dir, out, log); err != nil {
		return fmt.Errorf("part 2: %w", err)
	}
	return nil
}

// step prints a numbered heading.
func step(out io.Writer, format string, args ...any) {
	fmt.Fprintf(out, "\n== "+format+"\n", args...)
}

// sandboxCount returns how many sandboxes the client's provider runs.
func sandboxCount(ctx context.Context, client *compute.Client) (int, error) {
	infos, err := client.List(ctx)
	return len(infos), err
}
