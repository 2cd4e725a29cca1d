// Package local runs sandboxes as local processes: sandbox-agentd started as
// a child of the harness on a unix socket in a private directory, with the
// workspace in a directory the harness owns.
//
// This file is the launcher every local sandbox is built on; the full
// errkind.Client provider (state, resume, snapshots, bubblewrap isolation)
// grows on top of it.
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// AgentdBinary is the daemon's executable name.
const AgentdBinary = "sandbox-agentd"

// Options configures a local daemon.
type Options struct {
	// AgentdPath is the daemon binary; empty means FindAgentd.
	AgentdPath string
	// Workspace is the workspace directory; empty means a fresh directory
	// inside the sandbox's private directory.
	Workspace string
	// WorkspaceRoot is the path the daemon is told the workspace is at
	// (--workspace): where an isolating Wrap or Prepare mounts Workspace
	// in the sandbox (see wsroot.go); empty means Workspace itself (a
	// plain process sees the host's paths).
	WorkspaceRoot string
	// Args are extra daemon flags (limits, --default-user, --grant ...).
	Args []string
	// Stderr receives the daemon's log (nil: discarded once it serves).
	// Whatever it is, the first bytes the sandbox writes while it starts
	// are kept (startLog), so that a start-up failure says why.
	Stderr io.Writer
	// ReadyTimeout bounds the wait for the daemon to answer health checks.
	ReadyTimeout time.Duration
	// Dir is the private directory (socket; workspace when not given);
	// empty means a fresh temporary one, removed by Close. A given Dir is
	// kept on failure and by Close.
	Dir string
	// Token is the bearer token; empty means a fresh random one.
	Token string
	// Wrap, when set, turns the daemon's argv into the argv actually run
	// (an isolation wrapper such as bubblewrap).
	Wrap func(argv []string) []string
	// Prepare, when set, is called with the daemon's argv before Wrap
	// (gVisor writes it into the OCI bundle runsc runs); its error fails
	// Start.
	Prepare func(argv []string) error
	// ExtraFiles are inherited by the daemon (or its wrapper) as
	// descriptors 4, 5, ... in order, after the token's 3 (bubblewrap's
	// seccomp filter, for one). Start does not close them.
	ExtraFiles []*os.File
	// Cgroup, when set, is a cgroup v2 directory the daemon (or its
	// wrapper) is started in, atomically (clone3 with CLONE_INTO_CGROUP),
	// so that every process of the sandbox starts there. The caller creates
	// it and removes it. Where the kernel refuses (no clone3, no right to
	// the cgroup...), the daemon is started outside it: Sandbox.Cgroup is
	// then empty and CgroupErr says why.
	Cgroup string
	// CgroupRequired makes Start fail rather than start the daemon outside
	// Cgroup (which then holds the sandbox's caps: see caps.go).
	CgroupRequired bool
	// CgroupV1 are cgroup v1 directories (one per hierarchy, holding the
	// sandbox's caps) the daemon (or its wrapper) runs in from its first
	// instruction on: it is started held in a shell waiting on a pipe
	// until its pid is in every one's cgroup.procs (see caps.go). The
	// caller creates and removes them. Start fails when it cannot move
	// the process there.
	CgroupV1 []string
	// UserNS, when set, starts the daemon (or its wrapper) as root of a new
	// user namespace mapping the ids it describes (see userns.go). Only a
	// root harness may map ids other than its own.
	UserNS *UserNS
	// Restored, when set, starts a process that brings back a daemon that
	// has its token already (gVisor's `runsc restore` of a checkpoint, see
	// pause.go): no token is sent (Token must be the daemon's, and
	// ExtraFiles start at descriptor 3), and Restored is called once the
	// process started (exited is closed when it exits), before Start
	// waits for the daemon to serve; its error fails Start.
	Restored func(ctx context.Context, exited <-chan struct{}) error
}

// Sandbox is a running local daemon and a client connected to it.
type Sandbox struct {
	Client    *agentclient.Client
	Dir       string // private directory: socket, and workspace when not given
	Workspace string // the workspace's host path (Options.WorkspaceRoot is the sandbox's)
	Socket    string
	// Cgroup is the cgroup the daemon was started in (Options.Cgroup), or
	// "" when it runs outside one.
	Cgroup    string
	cgroupErr error
	ownDir    bool
	cmd       *exec.Cmd
	output    *startLog // its stdout and stderr (see startLog)
	exited    chan struct{}
	log       *zap.Logger
}

// FindAgentd looks for sandbox-agentd next to the running executable, then
// on PATH.
func FindAgentd() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), AgentdBinary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath(AgentdBinary)
	if err != nil {
		return "", fmt.Errorf("%w: %s is neither next to this program nor on PATH (run `make build`)", errkind.ErrNotFound, AgentdBinary)
	}
	return p, nil
}

// Start launches sandbox-agentd with a fresh random token passed through an
// inherited pipe (never argv or environment), waits until it serves, and
// returns a connected client.
func Start(ctx context.Context, opts Options, log *zap.Logger) (*Sandbox, error) {
	bin := opts.AgentdPath
	if bin == "" {
		var err error
		if bin, err = FindAgentd(); err != nil {
			return nil, err
		}
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	dir, ownDir := opts.Dir, opts.Dir == ""
	if ownDir {
		var err error
		if dir, err = os.MkdirTemp("", "bulkhead-sandbox-"); err != nil {
			return nil, fmt.Errorf("create sandbox directory: %w", err)
		}
		// 0711, as the provider's: run_as users must pass through to the
		// workspace (MkdirTemp makes it 0700).
		if err := os.Chmod(dir, 0o711); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("create sandbox directory: %w", err)
		}
	}
	s := &Sandbox{Dir: dir, Workspace: opts.Workspace, Socket: filepath.Join(dir, "agentd.sock"), exited: make(chan struct{}), log: log, ownDir: ownDir}
	if s.Workspace == "" {
		s.Workspace = filepath.Join(dir, "workspace")
	}
	fail := func(err error) (*Sandbox, error) {
		s.kill()
		if s.output != nil {
			s.output.stop() // when nothing was started
		}
		if ownDir {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	_ = os.Remove(s.Socket) // a stale socket of an earlier daemon
	token := opts.Token
	if token == "" {
		if opts.Restored != nil {
			return fail(errors.New("restore a sandbox: its token is needed"))
		}
		var err error
		if token, err = NewToken(); err != nil {
			return fail(err)
		}
	}
	// The token's pipe (nil for a restored daemon, which has its token:
	// closing a nil *os.File does nothing).
	var tokenR, tokenW *os.File
	var err error
	if opts.Restored == nil {
		if tokenR, tokenW, err = os.Pipe(); err != nil {
			return fail(fmt.Errorf("token pipe: %w", err))
		}
	}
	output, outputW, err := newStartLog(opts.Stderr, token)
	if err != nil {
		tokenR.Close()
		tokenW.Close()
		return fail(err)
	}
	s.output = output
	wsRoot := opts.WorkspaceRoot
	if wsRoot == "" {
		wsRoot = s.Workspace
	}
	argv := append([]string{bin, "--listen", "unix://" + s.Socket, "--token-fd", "3", "--workspace", wsRoot}, opts.Args...)
	if opts.Prepare != nil {
		if err := opts.Prepare(argv); err != nil {
			tokenR.Close()
			tokenW.Close()
			outputW.Close()
			return fail(err)
		}
	}
	if opts.Wrap != nil {
		argv = opts.Wrap(argv)
	}
	// The v1 start gate (caps.go): the process waits, as a shell reading
	// gateR, until it is in its v1 cgroups.
	var gateR, gateW *os.File
	if len(opts.CgroupV1) > 0 {
		if gateR, gateW, err = os.Pipe(); err != nil {
			tokenR.Close()
			tokenW.Close()
			outputW.Close()
			return fail(fmt.Errorf("cgroup start gate: %w", err))
		}
		defer gateW.Close()
		argv = gateArgv(argv)
	}
	newCmd := func(cgroup *os.File) *exec.Cmd {
		cmd := exec.Command(argv[0], argv[1:]...)
		if gateR != nil {
			cmd.Stdin = gateR
		}
		cmd.ExtraFiles = opts.ExtraFiles
		if tokenR != nil {
			cmd.ExtraFiles = append([]*os.File{tokenR}, opts.ExtraFiles...)
		}
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // the daemon gets no harness secrets
		cmd.Stdout = outputW
		cmd.Stderr = outputW
		// Its own process group: a Ctrl-C meant for the harness does not hit the
		// sandbox, and Close can kill the whole group. No Pdeathsig: a local
		// sandbox may outlive the harness, to be resumed by the next one.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if opts.UserNS != nil {
			opts.UserNS.sysProcAttr(cmd.SysProcAttr)
		}
		if cgroup != nil {
			cmd.SysProcAttr.UseCgroupFD = true
			cmd.SysProcAttr.CgroupFD = int(cgroup.Fd())
		}
		return cmd
	}
	var cmd *exec.Cmd
	if opts.Cgroup != "" {
		cmd, err = startInCgroup(opts.Cgroup, newCmd)
		if err != nil && opts.CgroupRequired {
			tokenR.Close()
			tokenW.Close()
			outputW.Close()
			if gateR != nil {
				gateR.Close()
			}
			return fail(fmt.Errorf("%w: the sandbox's caps: %w", errkind.ErrFailedPrecondition, err))
		}
		if err != nil {
			// Started outside: as without a cgroup.
			s.cgroupErr = err
			cmd = nil
		} else {
			s.Cgroup = opts.Cgroup
		}
	}
	if cmd == nil {
		cmd = newCmd(nil)
		if err := cmd.Start(); err != nil {
			tokenR.Close()
			tokenW.Close()
			outputW.Close()
			if gateR != nil {
				gateR.Close()
			}
			return fail(fmt.Errorf("start %s: %w", bin, err))
		}
	}
	tokenR.Close()
	outputW.Close()
	if gateR != nil {
		gateR.Close()
	}
	s.cmd = cmd
	go func() {
		_ = cmd.Wait()
		// Before exited: what the process wrote is all read when a
		// waiter looks (waitReady's ErrExitedAtStart).
		s.output.stop()
		close(s.exited)
	}()
	if gateW != nil {
		// Held at the gate: into the v1 cgroups, then on. On failure the
		// gate's EOF makes the shell exit without running anything.
		if err := joinCgroupsV1(cmd.Process.Pid, opts.CgroupV1); err != nil {
			tokenW.Close()
			gateW.Close()
			return fail(fmt.Errorf("%w: the sandbox's caps: %w", errkind.ErrFailedPrecondition, err))
		}
		_, err := io.WriteString(gateW, "\n")
		gateW.Close()
		if err != nil {
			tokenW.Close()
			return fail(fmt.Errorf("cgroup start gate: %w", err))
		}
	}
	log.Debug("sandbox-agentd started", zap.Int("pid", cmd.Process.Pid), zap.String("socket", s.Socket))
	var werr error
	if tokenW != nil {
		_, werr = io.WriteString(tokenW, token)
		tokenW.Close()
	} else if err := opts.Restored(ctx, s.exited); err != nil {
		select {
		case <-s.exited: // say how, with what it printed
			err = fmt.Errorf("sandbox restore: %w", s.exitedErr())
		default:
		}
		return fail(err)
	}
	if werr != nil {
		// Nobody holds the pipe's reading end any more: the sandbox most
		// likely exited already (bwrap refusing its arguments does, at
		// once), which is said as waitReady says it, with its output.
		timer := time.NewTimer(opts.ReadyTimeout)
		defer timer.Stop()
		select {
		case <-s.exited:
			return fail(fmt.Errorf("sandbox-agentd start-up: %w", s.exitedErr()))
		case <-timer.C:
		case <-ctx.Done():
		}
		return fail(fmt.Errorf("send token to daemon: %w", werr))
	}
	client, err := agentclient.Dial(agentclient.Options{Address: "unix://" + s.Socket, Token: token, TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return fail(err)
	}
	s.Client = client
	if err := s.waitReady(ctx, opts.ReadyTimeout); err != nil {
		return fail(err)
	}
	if opts.Stderr == nil {
		// Serving: from now on its writes go nowhere, as to /dev/null
		// (see startLog), however long it runs.
		s.output.stop()
	}
	return s, nil
}

// startInCgroup starts the command newCmd makes for the cgroup directory
// at path (open for the start only). On error nothing was started.
func startInCgroup(path string, newCmd func(cgroup *os.File) *exec.Cmd) (*exec.Cmd, error) {
	dir, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	defer dir.Close()
	cmd := newCmd(dir)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start in cgroup %s: %w", path, err)
	}
	return cmd, nil
}

// CgroupErr says why the daemon runs outside the cgroup Options.Cgroup
// named (nil when it runs in it or none was asked for).
func (s *Sandbox) CgroupErr() error { return s.cgroupErr }

// ErrExitedAtStart: the daemon (or the sandbox wrapping it) exited before
// it served.
var ErrExitedAtStart = errors.New("sandbox-agentd exited during start-up")

// waitReady waits until the daemon serves and accepts the token
// (agentclient.WaitReady), giving up as soon as the process exits.
func (s *Sandbox) waitReady(ctx context.Context, timeout time.Duration) error {
	_, err := agentclient.WaitReady(ctx, s.Client, agentclient.ReadyOptions{Timeout: timeout,
		Alive: func(context.Context) error {
			select {
			case <-s.exited:
				return s.exitedErr()
			default:
				return nil
			}
		}})
	if err != nil {
		return fmt.Errorf("sandbox-agentd start-up: %w", err)
	}
	return nil
}

// exitedErr says that the daemon (or its wrapper) exited before it served:
// how, and what it printed. Only once exited is closed.
func (s *Sandbox) exitedErr() error {
	return fmt.Errorf("%w: %w: %s%s", errkind.ErrUnavailable, ErrExitedAtStart, s.cmd.ProcessState, s.output.describe())
}

// PID is the daemon's process id.
func (s *Sandbox) PID() int { return s.cmd.Process.Pid }

// Exited is closed when the daemon process has exited.
func (s *Sandbox) Exited() <-chan struct{} { return s.exited }

// Close stops the daemon gracefully (SIGTERM: it kills its process groups
// and drains), force-kills it if ctx ends first, and removes the private
// directory (and the workspace, when it lives there).
func (s *Sandbox) Close(ctx context.Context) error {
	var errs []error
	if s.Client != nil {
		errs = append(errs, s.Client.Close())
	}
	errs = append(errs, s.Stop(ctx))
	if s.ownDir {
		errs = append(errs, os.RemoveAll(s.Dir))
	}
	return errors.Join(errs...)
}

// Stop stops the daemon gracefully (SIGTERM: it kills its process groups
// and drains) and force-kills it if ctx ends first. The client and the
// directory are left alone.
func (s *Sandbox) Stop(ctx context.Context) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return nil
	case <-ctx.Done():
		s.log.Warn("sandbox-agentd did not stop in time; killing it", zap.Int("pid", s.cmd.Process.Pid))
		s.kill()
		return fmt.Errorf("sandbox-agentd did not stop in time; killed")
	}
}

func (s *Sandbox) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// NewToken returns a fresh random bearer token.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}
