// Package agentd is the logic of sandbox-agentd, the daemon inside every
// sandbox: it runs processes, reads and writes files confined to the
// workspace, and applies patches. It has no gRPC imports; the server
// subpackage adapts it to the wire, and nothing here knows about providers.
package agentd

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/process"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/userdb"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/workspace"
)

// Features returns the names of the features this daemon implements,
// reported by Info so clients can adapt to older daemons.
func Features() []string {
	return []string{
		"process.pty", "process.stdin_offsets", "process.request_id", "process.attach", "process.timeout",
		"file.atomic_write", "file.run_as", "file.grants",
		"workspace.apply_patch", "workspace.apply_patch.atomic",
	}
}

// Daemon is one sandbox's daemon state: its workspace, processes and users.
type Daemon struct {
	cfg       Config
	log       *zap.Logger
	users     *userdb.DB
	reaper    *process.Reaper
	procs     *process.Manager
	ws        *workspace.Workspace
	startedAt time.Time
}

// New prepares the workspace and the process engine.
func New(cfg Config, log *zap.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.WorkspaceRoot, 0o755); err != nil {
		return nil, fmt.Errorf("create workspace root: %w", err)
	}
	users := userdb.New(cfg.EtcRoot)
	d := &Daemon{cfg: cfg, log: log, users: users, startedAt: time.Now()}
	reaper, err := process.NewReaper(process.ReaperOptions{ReapAll: cfg.ReapAll, Subreaper: cfg.ReapAll && os.Getpid() != 1}, log)
	if err != nil {
		return nil, fmt.Errorf("start child reaper: %w", err)
	}
	d.reaper = reaper
	d.procs, err = process.NewManager(process.Config{
		MaxProcesses:      cfg.MaxProcesses,
		OutputBufferBytes: cfg.OutputBufferBytes,
		ExitRetention:     cfg.ExitRetention,
		DefaultShell:      cfg.Shell,
		DefaultUser:       cfg.DefaultUser,
		Users:             users,
		Reaper:            reaper,
	}, log)
	if err != nil {
		reaper.Close()
		return nil, err
	}
	d.ws, err = workspace.New(workspace.Config{
		Root:          cfg.WorkspaceRoot,
		MaxReadBytes:  0,
		MaxWriteBytes: cfg.MaxFileBytes,
		Users:         users,
		Logger:        log,
	})
	if err != nil {
		_ = d.procs.Shutdown(context.Background())
		reaper.Close()
		return nil, err
	}
	if err := d.ws.SetGrants(cfg.Grants); err != nil {
		_ = d.Shutdown(context.Background())
		return nil, err
	}
	if n, err := d.ws.CleanupTemp(context.Background()); err != nil {
		log.Warn("removing temporary files left by an interrupted write", zap.Error(err))
	} else if n > 0 {
		log.Info("removed temporary files left by an interrupted write", zap.Int("count", n))
	}
	return d, nil
}

// Processes is the process engine.
func (d *Daemon) Processes() *process.Manager { return d.procs }

// Workspace is the confined filesystem.
func (d *Daemon) Workspace() *workspace.Workspace { return d.ws }

// Config returns the configuration the daemon runs with.
func (d *Daemon) Config() Config { return d.cfg }

// StartedAt is when the daemon started.
func (d *Daemon) StartedAt() time.Time { return d.startedAt }

// ReadLimit clamps a client's requested read size to the daemon's maximum;
// zero or negative means the maximum.
func (d *Daemon) ReadLimit(requested int) int {
	if requested <= 0 || requested > d.cfg.MaxReadBytes {
		return d.cfg.MaxReadBytes
	}
	return requested
}

// Platform is GOOS/GOARCH.
func Platform() string { return runtime.GOOS + "/" + runtime.GOARCH }

// StartSpec is a process start request before its working directory has
// been confined.
type StartSpec struct {
	process.StartOptions
	// Cwd is workspace-relative, absolute inside the workspace or a grant;
	// empty is the workspace root.
	Cwd string
}

// StartProcess confines the working directory and starts the process. It
// reports whether request_id matched an existing process.
func (d *Daemon) StartProcess(ctx context.Context, spec StartSpec) (process.Info, bool, error) {
	user, err := d.User(spec.User)
	if err != nil {
		return process.Info{}, false, &compute.ProcessError{Op: "start", Err: err}
	}
	dir, err := d.ws.ResolveDir(ctx, user, spec.Cwd)
	if err != nil {
		return process.Info{}, false, &compute.ProcessError{Op: "start", Err: err}
	}
	opts := spec.StartOptions
	opts.Dir = dir
	return d.procs.StartOrFind(ctx, opts)
}

// User resolves the run_as user for a file operation: the named one, else
// the default user, else nil (the daemon's own identity).
func (d *Daemon) User(name string) (*userdb.User, error) {
	if name == "" {
		name = d.cfg.DefaultUser
	}
	if name == "" {
		return nil, nil
	}
	u, err := d.users.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("run_as: %w", err)
	}
	return u, nil
}

// Shutdown kills every process group, waits for them, and releases the
// workspace.
func (d *Daemon) Shutdown(ctx context.Context) error {
	err := d.procs.Shutdown(ctx)
	if cerr := d.ws.Close(); cerr != nil && err == nil {
		err = cerr
	}
	d.reaper.Close()
	return err
}
