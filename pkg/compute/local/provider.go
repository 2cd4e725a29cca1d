package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// ProviderName is the provider's name in session states.
const ProviderName = "local"

// Config configures the local provider.
type Config struct {
	// StateDir holds one private directory per sandbox (socket, token,
	// workspace); "" means <user cache dir>/bulkhead/local.
	StateDir string
	// AgentdPath is the daemon binary; "" means FindAgentd.
	AgentdPath string
	// Args are extra daemon flags for every sandbox.
	Args []string
	// Stderr receives the daemons' logs (nil: discarded).
	Stderr io.Writer
	// ReadyTimeout bounds a daemon's start-up (default 10 s).
	ReadyTimeout time.Duration
	// Isolation selects how sandboxes are confined.
	Isolation Isolation
	// Network keeps the host network in isolated sandboxes (default: none).
	Network bool
}

// Isolation is how a local sandbox is confined.
type Isolation string

// Isolation modes.
const (
	// IsolationNone runs the daemon as a plain child process: confinement
	// is the daemon's own (workspace paths, run_as accounts).
	IsolationNone Isolation = ""
	// IsolationBubblewrap runs it under bubblewrap: new pid, mount, ipc,
	// uts and network namespaces (and a user namespace when the harness is
	// not root), the host file system read-only, the workspace the only
	// writable path besides a private /tmp, no network unless asked.
	IsolationBubblewrap Isolation = "bubblewrap"
	// IsolationAuto is bubblewrap when bwrap is installed, else none.
	IsolationAuto Isolation = "auto"
)

// Provider runs sandboxes as local sandbox-agentd processes. Sandboxes
// outlive the harness process (they are not its process group's), so a
// later harness can resume them; List and Reap find the ones left behind.
type Provider struct {
	cfg   Config
	log   *zap.Logger
	bwrap string // bwrap binary when sandboxes are isolated
	// noCgroup logs, once, why a sandbox runs without a cgroup.
	noCgroup sync.Once
}

// Isolated reports whether this provider's sandboxes run under bubblewrap.
func (p *Provider) Isolated() bool { return p.bwrap != "" }

var _ compute.Provider = (*Provider)(nil)

// New returns a local provider.
func New(cfg Config, log *zap.Logger) (*Provider, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.StateDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cfg.StateDir = filepath.Join(base, "bulkhead", "local")
	}
	// Directories are 0711: sandbox accounts (run_as users) must be able to
	// pass through to the workspace; the token and state files inside are
	// 0600 and directory listings stay closed.
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("local provider: state directory: %w", err)
	}
	if cfg.AgentdPath == "" {
		p, err := FindAgentd()
		if err != nil {
			return nil, err
		}
		cfg.AgentdPath = p
	}
	// Absolute: the daemon is started (and, isolated, bind-mounted) by path.
	abs, err := filepath.Abs(cfg.AgentdPath)
	if err != nil {
		return nil, fmt.Errorf("local provider: agentd path: %w", err)
	}
	cfg.AgentdPath = abs
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	p := &Provider{cfg: cfg, log: log.Named("local")}
	switch cfg.Isolation {
	case IsolationNone:
	case IsolationBubblewrap, IsolationAuto:
		bwrap, err := exec.LookPath("bwrap")
		switch {
		case err == nil:
			p.bwrap = bwrap
		case cfg.Isolation == IsolationBubblewrap:
			return nil, fmt.Errorf("%w: isolation %q needs bwrap (bubblewrap) on PATH", compute.ErrFailedPrecondition, cfg.Isolation)
		}
	default:
		return nil, fmt.Errorf("%w: unknown isolation %q", compute.ErrInvalidArgument, cfg.Isolation)
	}
	return p, nil
}

// NewClient is compute.NewClient over a new local provider.
func NewClient(cfg Config, opts compute.ClientOptions) (*compute.Client, error) {
	p, err := New(cfg, opts.Log)
	if err != nil {
		return nil, err
	}
	return compute.NewClient(p, opts), nil
}

// Name returns "local".
func (p *Provider) Name() string { return ProviderName }

// providerState is what a session state records about a local sandbox.
type providerState struct {
	Dir string `json:"dir"`
}

// meta is the private directory's record of its sandbox.
type meta struct {
	SessionID string            `json:"session_id"`
	Lifetime  compute.Lifetime  `json:"lifetime"`
	Labels    map[string]string `json:"labels,omitempty"`
	PID       int               `json:"pid"`
}

// Files of a private directory. The token is readable only by the harness
// user; with the daemon's sandboxed processes running as other users (or
// under isolation) it is never reachable from inside.
const (
	homeDir    = "home" // the sandbox accounts' homes (below the etc root, as the daemon makes them)
	metaFile   = "meta.json"
	tokenFile  = "token"
	activeFile = "active"
	socketName = "agentd.sock"
	runDir     = "run" // holds the socket: the only private path a sandbox sees
)

// Launch starts a daemon for a session.
func (p *Provider) Launch(ctx context.Context, spec compute.LaunchSpec) (compute.Sandbox, error) {
	dir := filepath.Join(p.cfg.StateDir, spec.SessionID)
	if filepath.Dir(dir) != filepath.Clean(p.cfg.StateDir) || filepath.Base(dir) != spec.SessionID {
		return nil, fmt.Errorf("%w: session id %q cannot name a local sandbox directory", compute.ErrInvalidArgument, spec.SessionID)
	}
	if spec.Prior != nil {
		var ps providerState
		if err := json.Unmarshal(spec.Prior, &ps); err == nil && ps.Dir != "" {
			// The replaced sandbox's directory, if it is one of ours: a
			// state naming any other directory is refused, never created
			// or removed.
			d, err := p.dirOf(spec.Prior)
			if err != nil {
				return nil, err
			}
			dir = d
		}
	}
	if pid, alive := p.running(dir); alive {
		return nil, fmt.Errorf("%w: a sandbox of session %s is running (pid %d)", compute.ErrAlreadyExists, spec.SessionID, pid)
	}
	// What a dead daemon left running (processes that never wrote, or left
	// its process groups) ends before its replacement starts.
	if err := p.removeCgroup(ctx, dir); err != nil {
		return nil, fmt.Errorf("replace the sandbox of session %s: %w", spec.SessionID, err)
	}
	kept := false
	if fi, err := os.Stat(filepath.Join(dir, "workspace")); err == nil && fi.IsDir() && spec.Prior != nil {
		kept = true
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create sandbox directory: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create sandbox directory: %w", err)
	}
	token, err := NewToken()
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(dir, tokenFile), []byte(token), 0o600); err != nil {
		return nil, err
	}
	// The sandbox's accounts live in a private etc (seeded from the host's
	// passwd and group), so materializing users never edits the host's.
	etc := filepath.Join(dir, "etc")
	if err := seedEtc(etc); err != nil {
		return nil, err
	}
	args := append([]string{"--etc-root", dir}, p.cfg.Args...)
	run, ws := filepath.Join(dir, runDir), filepath.Join(dir, "workspace")
	for _, d := range []string{run, ws, filepath.Join(dir, homeDir)} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create sandbox directory: %w", err)
		}
	}
	opts := Options{AgentdPath: p.cfg.AgentdPath, Dir: run, Workspace: ws, Token: token, Args: args,
		Stderr: p.cfg.Stderr, ReadyTimeout: p.cfg.ReadyTimeout}
	if p.bwrap != "" {
		opts.Wrap = func(argv []string) []string { return p.bubblewrap(dir, argv) }
	} else if m := spec.Manifest; m != nil && m.RunAs != "" && m.RunAs != "root" {
		if blocked := unsearchableAncestor(ws); blocked != "" {
			p.log.Warn("the run_as user cannot reach this plain local sandbox's workspace: commands run as it will fail to start; "+
				"use a state directory whose parents other users may search, or bubblewrap isolation",
				zap.String("run_as", m.RunAs), zap.String("workspace", ws), zap.String("not searchable by others", blocked))
		}
	}
	if cg, err := makeCgroup(dir); err != nil {
		p.withoutCgroup(err)
	} else {
		opts.Cgroup = cg
	}
	sb, err := Start(ctx, opts, p.log)
	if err != nil {
		if rerr := p.removeCgroup(ctx, dir); rerr != nil {
			p.log.Warn("a sandbox that failed to start left its cgroup", zap.String("dir", dir), zap.Error(rerr))
		}
		if !kept {
			_ = removeTree(dir)
		}
		return nil, err
	}
	if opts.Cgroup != "" && sb.Cgroup == "" {
		// Started outside the cgroup: drop it (it is empty) and the record.
		p.withoutCgroup(sb.CgroupErr())
		if err := p.removeCgroup(ctx, dir); err != nil {
			p.log.Warn("an unused sandbox cgroup could not be removed", zap.String("dir", dir), zap.Error(err))
		}
	}
	m := meta{SessionID: spec.SessionID, Lifetime: spec.Lifetime, Labels: spec.Labels, PID: sb.PID()}
	data, _ := json.Marshal(m)
	if err := writeFileAtomic(filepath.Join(dir, metaFile), data, 0o600); err != nil {
		_ = sb.Close(ctx)
		_ = p.removeCgroup(ctx, dir)
		return nil, err
	}
	s := &sandbox{p: p, dir: dir, client: sb.Client, child: sb, kept: kept}
	_ = s.Touch(ctx)
	return s, nil
}

// Reattach connects to a sandbox's daemon if it still runs.
func (p *Provider) Reattach(ctx context.Context, _ compute.LaunchSpec, prior json.RawMessage) (compute.Sandbox, error) {
	dir, err := p.dirOf(prior)
	if err != nil {
		return nil, err
	}
	pid, alive := p.running(dir)
	if !alive {
		return nil, fmt.Errorf("%w: the sandbox daemon in %s is not running", compute.ErrNotFound, filepath.Base(dir))
	}
	token, err := os.ReadFile(filepath.Join(dir, tokenFile))
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox token: %v", compute.ErrNotFound, err)
	}
	client, err := agentclient.Dial(agentclient.Options{Address: "unix://" + filepath.Join(dir, runDir, socketName), Token: string(token), TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(client.Conn()).Check(rctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		client.Close()
		return nil, fmt.Errorf("%w: the sandbox daemon (pid %d) does not answer: %v", compute.ErrUnavailable, pid, err)
	}
	s := &sandbox{p: p, dir: dir, client: client, kept: true}
	_ = s.Touch(ctx)
	return s, nil
}

// Destroy stops the daemon and removes the private directory with the
// workspace.
func (p *Provider) Destroy(ctx context.Context, prior json.RawMessage) error {
	dir, err := p.dirOf(prior)
	if err != nil {
		return err
	}
	if err := p.stopSandbox(ctx, dir); err != nil {
		return err
	}
	if err := removeTree(dir); err != nil {
		return fmt.Errorf("remove sandbox directory: %w", err)
	}
	return nil
}

// List returns the sandboxes in the state directory.
func (p *Provider) List(context.Context) ([]compute.SandboxInfo, error) {
	entries, err := os.ReadDir(p.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("list local sandboxes: %w", err)
	}
	var out []compute.SandboxInfo
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(p.cfg.StateDir, e.Name())
		m, err := readMeta(dir)
		if err != nil {
			continue // not a sandbox directory (or one still being created)
		}
		_, alive := p.running(dir)
		st, _ := json.Marshal(providerState{Dir: dir})
		info := compute.SandboxInfo{Provider: ProviderName, SessionID: m.SessionID, ID: e.Name(), Running: alive, Lifetime: m.Lifetime, State: st}
		if fi, err := os.Stat(filepath.Join(dir, activeFile)); err == nil {
			info.LastActive = fi.ModTime()
		}
		out = append(out, info)
	}
	return out, nil
}

// dirOf returns the private directory a provider state names, checking it
// is one of this provider's.
func (p *Provider) dirOf(prior json.RawMessage) (string, error) {
	var ps providerState
	if err := json.Unmarshal(prior, &ps); err != nil || ps.Dir == "" {
		return "", fmt.Errorf("%w: local provider state: %v", compute.ErrInvalidArgument, err)
	}
	dir := filepath.Clean(ps.Dir)
	if filepath.Dir(dir) != filepath.Clean(p.cfg.StateDir) {
		return "", fmt.Errorf("%w: local sandbox directory %s is not in this provider's state directory", compute.ErrInvalidArgument, dir)
	}
	return dir, nil
}

// running reports the daemon pid recorded in dir and whether that process
// still runs and is that daemon (its command line names dir's socket).
func (p *Provider) running(dir string) (int, bool) {
	m, err := readMeta(dir)
	if err != nil || m.PID <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", m.PID))
	if err != nil || !bytes.Contains(cmdline, []byte(filepath.Join(dir, runDir, socketName))) {
		return m.PID, false
	}
	return m.PID, alivePID(m.PID)
}

func readMeta(dir string) (meta, error) {
	var m meta
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(data, &m)
}

// sandbox is one local sandbox as a session holds it.
type sandbox struct {
	p      *Provider
	dir    string
	client *agentclient.Client
	child  *Sandbox // set when this process started the daemon
	kept   bool

	closeOnce sync.Once
	closeErr  error
}

func (s *sandbox) Agent() *agentclient.Client { return s.client }

func (s *sandbox) State() (json.RawMessage, error) {
	return json.Marshal(providerState{Dir: s.dir})
}

func (s *sandbox) WorkspaceKept() bool { return s.kept }

// Touch records activity for idle timeouts.
func (s *sandbox) Touch(context.Context) error {
	now := time.Now()
	p := filepath.Join(s.dir, activeFile)
	if err := os.Chtimes(p, now, now); errors.Is(err, fs.ErrNotExist) {
		return os.WriteFile(p, nil, 0o600)
	} else if err != nil {
		return err
	}
	return nil
}

// Shutdown stops the daemon (SIGTERM: it kills its processes and drains).
func (s *sandbox) Shutdown(ctx context.Context) error {
	if err := s.p.stopSandbox(ctx, s.dir); err != nil {
		return err
	}
	if s.child != nil {
		// Reap the process this harness started (it has exited by now).
		return s.child.Stop(ctx)
	}
	return nil
}

// Close drops the connection; the sandbox keeps running. Idempotent.
func (s *sandbox) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.client.Close() })
	return s.closeErr
}

// stopSandbox ends the sandbox in dir: SIGTERM to its daemon (which kills
// its process groups and drains), then, if anything of the sandbox still
// runs after ctx ends or 10 s, SIGKILL to every process naming its socket
// (under bubblewrap that includes the pid namespace's init, whose death
// ends everything inside). Last, the sandbox's cgroup, when it has one, is
// killed and removed: whatever escaped the daemon's process groups, or
// outlived a daemon that died without draining, ends there.
func (p *Provider) stopSandbox(ctx context.Context, dir string) error {
	return errors.Join(p.stopDaemon(ctx, dir), p.removeCgroup(ctx, dir))
}

// stopDaemon is stopSandbox's graceful part: SIGTERM to the daemon, and
// SIGKILL to the processes naming its socket if they do not end in time.
func (p *Provider) stopDaemon(ctx context.Context, dir string) error {
	socket := filepath.Join(dir, runDir, socketName)
	procs := sandboxProcesses(socket)
	signalled := false
	for _, pr := range procs {
		if pr.argv0 == p.cfg.AgentdPath {
			_ = syscall.Kill(pr.pid, syscall.SIGTERM)
			signalled = true
		}
	}
	if !signalled {
		for _, pr := range procs {
			_ = syscall.Kill(pr.pid, syscall.SIGTERM)
		}
	}
	return waitNoDaemons(ctx, socket)
}

// removeCgroup kills and removes the cgroup recorded in dir, if any, and
// then the record. A record that does not pass validation is not acted on
// (only dropped, with a warning), nor is a cgroup this process may not
// touch (a harness without the rights of the one that made it): without
// usable cgroups a sandbox ends as it did before them. It fails when the
// cgroup's processes do not end in time.
func (p *Provider) removeCgroup(ctx context.Context, dir string) error {
	record := filepath.Join(dir, cgroupFile)
	cg, err := recordedCgroup(dir)
	if err != nil {
		p.log.Warn("ignoring the sandbox's cgroup record", zap.String("dir", dir), zap.Error(err))
	} else if cg != "" {
		err := killCgroup(ctx, cg)
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
			p.log.Warn("cannot end the sandbox's cgroup", zap.String("cgroup", cg), zap.Error(err))
		default:
			return fmt.Errorf("end the sandbox's processes: %w", err)
		}
	}
	if err := os.Remove(record); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the sandbox's cgroup record: %w", err)
	}
	return nil
}

// unsearchableAncestor returns the first directory on the way from / to
// path that other users may not search (a 0700 home directory above the
// state directory, say), or "" when there is none.
func unsearchableAncestor(path string) string {
	var parts []string
	for d := filepath.Clean(path); ; d = filepath.Dir(d) {
		parts = append(parts, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	for i := len(parts) - 1; i >= 0; i-- {
		fi, err := os.Stat(parts[i])
		if err == nil && fi.IsDir() && fi.Mode().Perm()&0o001 == 0 {
			return parts[i]
		}
	}
	return ""
}

// withoutCgroup notes (once per provider, at debug level) that a sandbox
// runs without a cgroup, and why.
func (p *Provider) withoutCgroup(reason error) {
	p.noCgroup.Do(func() {
		p.log.Debug("local sandboxes run without a cgroup of their own: processes a SIGKILLed daemon leaves behind are not ended", zap.Error(reason))
	})
}

// sandboxProc is a live process of a sandbox.
type sandboxProc struct {
	pid   int
	argv0 string
}

// sandboxProcesses lists the live processes whose command line names socket.
func sandboxProcesses(socket string) []sandboxProc {
	var out []sandboxProc
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(socket)) || !alivePID(pid) {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		out = append(out, sandboxProc{pid: pid, argv0: string(argv0)})
	}
	return out
}

// waitNoDaemons waits until no live process's command line names socket,
// killing what remains after ctx ends or 10 s pass.
func waitNoDaemons(ctx context.Context, socket string) error {
	deadline := time.Now().Add(10 * time.Second)
	killed := false
	for {
		procs := sandboxProcesses(socket)
		if len(procs) == 0 {
			return nil
		}
		if !killed && (time.Now().After(deadline) || ctx.Err() != nil) {
			for _, pr := range procs {
				_ = syscall.Kill(pr.pid, syscall.SIGKILL)
			}
			killed, deadline = true, time.Now().Add(5*time.Second)
		} else if killed && time.Now().After(deadline) {
			return fmt.Errorf("sandbox processes of %s survive SIGKILL", filepath.Dir(filepath.Dir(socket)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alivePID reports whether pid runs (and is not a zombie).
func alivePID(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return !(i > 0 && i+2 < len(stat) && stat[i+2] == 'Z')
}

// bubblewrap wraps the daemon's argv: the host file system read-only, the
// workspace, the socket directory and the private etc writable, fresh
// /dev, /proc and /tmp, and new namespaces. A root harness keeps real root
// for the daemon (no user namespace), so run_as accounts work; otherwise a
// user namespace maps the harness user.
func (p *Provider) bubblewrap(dir string, argv []string) []string {
	out := []string{p.bwrap,
		// The daemon is the pid namespace's init (it reaps like one): when
		// it dies, for whatever reason, the kernel ends everything inside.
		"--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"}
	out = append(out, privateEtc(dir)...)
	// The sandbox sees of the state directory only its own workspace,
	// socket directory, accounts and homes: a fresh tmpfs hides the rest
	// (its token, other sandboxes and theirs) from the highest directory
	// that needs hiding (see hiddenTop), and the directories on the way
	// down are made 0711, so run_as accounts pass through to the workspace
	// even below a 0700 home.
	top := hiddenTop(p.cfg.StateDir, dir)
	if top != "/tmp" {
		out = append(out, "--perms", "0711", "--tmpfs", top)
	}
	var chain []string
	for a := dir; a != top && a != filepath.Dir(a); a = filepath.Dir(a) {
		chain = append([]string{a}, chain...)
	}
	for _, a := range chain {
		out = append(out, "--perms", "0711", "--dir", a)
	}
	home := filepath.Join(dir, homeDir)
	out = append(out,
		"--bind", filepath.Join(dir, "workspace"), filepath.Join(dir, "workspace"),
		"--bind", filepath.Join(dir, runDir), filepath.Join(dir, runDir),
		"--bind", filepath.Join(dir, "etc"), filepath.Join(dir, "etc"),
		// Homes: where the daemon creates them (below its etc root) and
		// where the accounts say they are; the host's /home is hidden.
		"--bind", home, home, "--bind", home, "/home",
		// Last, after every tmpfs: the daemon binary may live below /tmp
		// or below the hidden directory (a root harness's ~/go/bin).
		"--ro-bind", argv[0], argv[0],
		// No --die-with-parent: the sandbox outlives the harness process so
		// a later one can resume it; stopSandbox ends it explicitly.
		"--new-session")
	if !p.cfg.Network {
		out = append(out, "--unshare-net")
	}
	if os.Geteuid() != 0 {
		out = append(out, "--unshare-user")
	}
	return append(append(out, "--"), argv...)
}

// privateEtc returns the bwrap arguments that give the sandbox an /etc of
// its own, on a tmpfs made read-only once filled: passwd and group are
// symbolic links to the sandbox's private copies (<dir>/etc, which the
// daemon edits by rename, so a bind of the files themselves would go
// stale), and every other entry is the host's, through one read-only bind
// of the host's /etc at /etc/.host and a symbolic link per entry (a bind
// per entry costs a mount each: about 20 ms more per sandbox). Processes
// then resolve the sandbox's accounts by name, as in a container.
func privateEtc(dir string) []string {
	entries, err := os.ReadDir("/etc")
	if err != nil {
		return nil // keep the host's /etc (read-only) rather than fail
	}
	out := []string{"--perms", "0755", "--tmpfs", "/etc", "--ro-bind", "/etc", "/etc/" + hostEtc}
	for _, e := range entries {
		name := e.Name()
		if name == "passwd" || name == "group" || name == hostEtc {
			continue
		}
		target := hostEtc + "/" + name
		if e.Type()&fs.ModeSymlink != 0 {
			// The host's own link, so that a relative target still
			// resolves from /etc.
			if target, err = os.Readlink(filepath.Join("/etc", name)); err != nil {
				continue // gone meanwhile
			}
		}
		out = append(out, "--symlink", target, filepath.Join("/etc", name))
	}
	for _, name := range []string{"passwd", "group"} {
		out = append(out, "--symlink", filepath.Join(dir, "etc", name), filepath.Join("/etc", name))
	}
	return append(out, "--remount-ro", "/etc")
}

// hiddenTop returns the directory an isolated sandbox's view of the state
// directory is rebuilt from: /tmp (already a fresh tmpfs) when dir lies
// below it, else the highest directory above stateDir that other users
// may not search (a 0700 home), else stateDir itself.
func hiddenTop(stateDir, dir string) string {
	if strings.HasPrefix(dir, "/tmp/") {
		return "/tmp"
	}
	top := filepath.Clean(stateDir)
	for a := filepath.Dir(top); a != filepath.Dir(a); a = filepath.Dir(a) {
		if fi, err := os.Stat(a); err == nil && fi.Mode().Perm()&0o001 == 0 {
			top = a
		}
	}
	return top
}

// hostEtc is where, in an isolated sandbox's /etc, the host's /etc is
// bound (see privateEtc).
const hostEtc = ".host"

// seedEtc creates a private etc with copies of the host's account files,
// keeping an existing one (a replacement sandbox keeps its accounts).
func seedEtc(etc string) error {
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("sandbox accounts: %w", err)
	}
	for _, name := range []string{"passwd", "group"} {
		dst := filepath.Join(etc, name)
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/etc", name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sandbox accounts: %w", err)
		}
		if err := writeFileAtomic(dst, data, 0o644); err != nil {
			return fmt.Errorf("sandbox accounts: %w", err)
		}
	}
	return nil
}

// writeFileAtomic writes a small file by temp file and rename.
func writeFileAtomic(path string, data []byte, mode fs.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// removeTree removes dir, first making read-only directories in it
// writable (a workspace may hold some).
func removeTree(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && !strings.HasPrefix(d.Name(), "..") {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
