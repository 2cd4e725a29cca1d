// Package agentd is the logic of sandbox-agentd, the daemon inside every
// sandbox: it runs processes, reads and writes files confined to the
// workspace, and applies patches. It has no gRPC imports; the server
// subpackage adapts it to the wire, and nothing here knows about providers.
package agentd

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/materialize"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/process"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Features returns the names of the features this daemon implements,
// reported by Info so clients can adapt to older daemons.
func Features() []string {
	return []string{
		"process.pty", "process.stdin_offsets", "process.request_id", "process.attach", "process.timeout",
		"file.atomic_write", "file.run_as", "file.grants",
		"workspace.apply_patch", "workspace.apply_patch.atomic",
		"workspace.archive", "workspace.restore", "workspace.fingerprint", "workspace.materialize",
		"port.forward", "system.prepare_checkpoint", "system.last_activity",
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
	// activity is the last activity (see LastActivity); cpu samples the
	// CPU time of the processes for it.
	activity *activity.Clock
	cpu      *cpuSampler
	// relay is the egress relay (nil without Config.EgressRelay).
	relay *relay
	// restoreMu makes a Restore exclusive against other Restores, Archives
	// and Fingerprints.
	restoreMu sync.RWMutex
	// ckpt is the checkpoint state (see checkpoint.go).
	ckpt checkpointGate
}

// New prepares the workspace and the process engine.
func New(cfg Config, log *zap.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.WorkspaceRoot, 0o755); err != nil {
		return nil, fmt.Errorf("create workspace root: %w", err)
	}
	// Descriptors inherited from whoever started the daemon must not reach
	// the processes it runs.
	if err := markInheritedCloseOnExec(); err != nil {
		log.Warn("marking inherited descriptors close-on-exec", zap.Error(err))
	}
	users := userdb.New(cfg.EtcRoot)
	d := &Daemon{cfg: cfg, log: log, users: users, startedAt: time.Now(), cpu: newCPUSampler("/proc")}
	d.activity = activity.New(d.startedAt)
	reaper, err := process.NewReaper(process.ReaperOptions{ReapAll: cfg.ReapAll, Subreaper: cfg.ReapAll && os.Getpid() != 1}, log)
	if err != nil {
		return nil, fmt.Errorf("start child reaper: %w", err)
	}
	d.reaper = reaper
	var baseEnv map[string]string
	if cfg.EgressRelay != nil {
		baseEnv = map[string]string{"PATH": process.DefaultPath, "LANG": "C.UTF-8"}
		maps.Copy(baseEnv, cfg.EgressRelay.ProxyEnv())
	}
	d.procs, err = process.NewManager(process.Config{
		MaxProcesses:         cfg.MaxProcesses,
		OutputBufferBytes:    cfg.OutputBufferBytes,
		ExitRetention:        cfg.ExitRetention,
		FollowerStallTimeout: cfg.FollowerStallTimeout,
		DefaultShell:         cfg.Shell,
		DefaultUser:          cfg.DefaultUser,
		Users:                users,
		Reaper:               reaper,
		BaseEnv:              baseEnv,
		Activity:             d.activity,
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
	if cfg.EgressRelay != nil {
		if d.relay, err = startRelay(*cfg.EgressRelay, log); err != nil {
			_ = d.Shutdown(context.Background())
			return nil, err
		}
	}
	// A restore a crash interrupted is completed (or undone) before
	// anything is served; when it cannot be, archives, fingerprints and
	// restores are refused (and retry it) until it can.
	_ = d.recoverRestore() // archive.Recover logs what it did, or why it could not
	if n, err := materialize.CleanupStaging(cfg.WorkspaceRoot); err != nil {
		log.Warn("removing staging directories left by an interrupted materialization", zap.Error(err))
	} else if n > 0 {
		log.Info("removed staging directories left by an interrupted materialization", zap.Int("count", n))
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
		return process.Info{}, false, &errkind.ProcessError{Op: "start", Err: err}
	}
	dir, err := d.ws.ResolveDir(ctx, user, spec.Cwd)
	if err != nil {
		return process.Info{}, false, &errkind.ProcessError{Op: "start", Err: err}
	}
	opts := spec.StartOptions
	opts.Dir = dir
	opts.RunAs = user
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

// Shutdown kills every process group, waits for them, kills what escaped
// its group, and releases the workspace.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.stopCheckpointLease()
	if d.relay != nil {
		if rerr := d.relay.close(); rerr != nil {
			d.log.Warn("closing the egress relay", zap.Error(rerr))
		}
	}
	err := d.procs.Shutdown(ctx)
	if d.cfg.ReapAll {
		if kerr := killChildren(ctx); kerr != nil && err == nil {
			err = kerr
		}
	}
	if cerr := d.ws.Close(); cerr != nil && err == nil {
		err = cerr
	}
	d.reaper.Close()
	return err
}

// markInheritedCloseOnExec marks every descriptor above stderr close-on-exec.
// The Go runtime opens its own descriptors that way; this catches those the
// daemon inherited without it, which every process it starts would
// otherwise inherit in turn.
func markInheritedCloseOnExec() error {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return nil
	}
	ents, err := os.ReadDir("/proc/self/fd") // kernels before 5.11
	if err != nil {
		return err
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	return nil
}

// killChildren kills the daemon's remaining children until none is left.
// As PID 1 or a child subreaper the daemon inherits every orphaned
// descendant, so a background job whose group was not killed (its leader
// exited and its output was closed, or it left the group) ends here instead
// of outliving the sandbox. The reaper collects them.
func killChildren(ctx context.Context) error {
	self := os.Getpid()
	for {
		kids := childPIDs(self)
		if len(kids) == 0 {
			return nil
		}
		for _, pid := range kids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill %d remaining processes: %w", len(kids), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// childPIDs lists the processes whose parent is ppid (zombies included).
// It lists none when /proc belongs to another PID namespace (a daemon that
// is PID 1 under the host's /proc would otherwise see init's children).
func childPIDs(ppid int) []int {
	if self, err := os.Readlink("/proc/self"); err != nil || self != strconv.Itoa(os.Getpid()) {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}
