package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local/seccomp"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// ProviderName is the provider's name in session states.
const ProviderName = "local"

// Config configures the local provider.
type Config struct {
	// StateDir holds one private directory per sandbox (socket, token,
	// workspace); "" means <user cache dir>/bulkhead/local, or
	// /var/lib/bulkhead/local for root. A root harness's bubblewrap
	// sandboxes need every directory above it searchable by other users
	// (see userns.go); New says so otherwise.
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
	// Egress, when set, lets isolated sandboxes reach the network only
	// through a harness-side proxy enforcing Egress.Policy (see egress.go
	// and package egress); nil means no network (unless Network). Refused
	// with IsolationNone (a plain process has the host's network) and with
	// Network.
	Egress *egress.Options
	// NoSeccomp turns off the seccomp filter every bubblewrap sandbox
	// otherwise runs under (package seccomp: ptrace, mounts, namespaces,
	// kernel modules, the keyring... are refused). For debugging a
	// program the filter stops, never in production: processes that run
	// as root in the sandbox of a root harness keep the daemon's
	// capabilities (in the sandbox's user namespace).
	NoSeccomp bool
	// Runsc is gVisor's runsc binary for IsolationGVisor; "" means runsc
	// on PATH.
	Runsc string
	// GVisorFlags are extra runsc flags for every gVisor sandboxes
	// (--platform=kvm, --debug-log=DIR/ ...).
	GVisorFlags []string
	// RootFS, when set, is a directory holding the sandboxes' root file
	// system (`make rootfs` writes one: the small sandbox image's tree),
	// shared read-only by every sandbox in place of the host's /: a
	// sandbox then sees nothing of the host, its /etc is the tree's
	// (with passwd and group the sandbox's own), and the daemon binary is
	// bound in (see rootfs.go). It must be owned by root (or the
	// harness's user), not writable by others, and hold bin/sh. Needs
	// bubblewrap or gVisor isolation. A service (`harness serve`) sets it.
	RootFS string
	// Resources caps every sandbox's CPU, memory, processes and disk (zero
	// fields: no cap); a launch's CreateOptions override it (see
	// caps.go). Caps need cgroup controllers this harness may use (a root
	// harness): New refuses caps it cannot apply, and so does a launch.
	Resources Resources
}

// Isolation is how a local sandbox is confined.
type Isolation string

// Isolation modes.
const (
	// IsolationAuto (the zero value) picks bubblewrap when bwrap works
	// (IsolationGVisor, the stronger boundary but about 5x as slow to
	// start, is chosen by name only). When there is none, New
	// refuses: a plain local sandbox must be asked for by name
	// (IsolationNone), never fallen back to silently.
	IsolationAuto Isolation = ""
	// IsolationNone runs the daemon as a plain child process: confinement
	// is the daemon's own (workspace paths, run_as accounts). The harness
	// process makes itself non-dumpable (see New), and with a root harness
	// model-directed processes run as an account of the sandbox's own
	// (DefaultRunAs), so they cannot read the harness's memory or
	// environment; they still see the host's file system and network.
	IsolationNone Isolation = "none"
	// IsolationBubblewrap runs it under bubblewrap: new user, pid, mount,
	// ipc, uts and network namespaces, the host file system (or
	// Config.RootFS) read-only, the workspace the only writable path
	// besides a private /tmp, no network unless asked. A root harness
	// gives each sandbox a user namespace whose root is an unprivileged
	// host uid of the sandbox's own (see userns.go); otherwise bwrap maps
	// the harness's user.
	IsolationBubblewrap Isolation = "bubblewrap"
	// IsolationGVisor runs it in a gVisor sandbox (runsc): the same file
	// system view and network as bubblewrap, but the sandbox's system
	// calls are served by gVisor's user-space kernel rather than the
	// host's (see gvisor.go). Chosen by name only: auto keeps bubblewrap.
	IsolationGVisor Isolation = "gvisor"
)

// ParseIsolation reads an isolation name as the CLI spells it: "auto" (or
// ""), "none", "bubblewrap" or "gvisor".
func ParseIsolation(s string) (Isolation, error) {
	switch s {
	case "", "auto":
		return IsolationAuto, nil
	case string(IsolationNone), string(IsolationBubblewrap), string(IsolationGVisor):
		return Isolation(s), nil
	}
	return "", fmt.Errorf("%w: unknown isolation %q (auto, none, bubblewrap or gvisor)", compute.ErrInvalidArgument, s)
}

// String is the isolation's name ("auto" for the zero value).
func (i Isolation) String() string {
	if i == IsolationAuto {
		return "auto"
	}
	return string(i)
}

// ErrNoIsolation is returned by New for IsolationAuto on a machine that
// offers nothing stronger than plain processes. It wraps
// compute.ErrFailedPrecondition.
var ErrNoIsolation = fmt.Errorf("%w: no sandbox isolation is available here (install bubblewrap, `apt-get install bubblewrap`); "+
	"to run sandboxes as plain processes that see the host's files and network, choose isolation none explicitly", compute.ErrFailedPrecondition)

// Provider runs sandboxes as local sandbox-agentd processes. Sandboxes
// outlive the harness process (they are not its process group's), so a
// later harness can resume them; List and Reap find the ones left behind.
type Provider struct {
	cfg   Config
	log   *zap.Logger
	bwrap string // bwrap binary when sandboxes are isolated with bubblewrap
	runsc string // runsc binary when they are isolated with gVisor
	// isolation is the mode in effect (never IsolationAuto).
	isolation Isolation
	// rootFS is Config.RootFS, checked and resolved ("" for the host's /).
	rootFS string
	// userns: this root harness starts its bubblewrap sandboxes in user
	// namespaces of their own (see userns.go).
	userns bool
	// noCgroup logs, once, why a sandbox runs without a cgroup.
	noCgroup sync.Once
	// egress are the egress proxies this provider serves (egressServers).
	egress     *egress.Servers
	egressOnce sync.Once
}

// Isolated reports whether this provider's sandboxes run under bubblewrap
// or gVisor.
func (p *Provider) Isolated() bool { return p.bwrap != "" || p.runsc != "" }

// Isolation returns the isolation in effect: what IsolationAuto chose, or
// the mode asked for.
func (p *Provider) Isolation() Isolation { return p.isolation }

var (
	_ compute.Provider        = (*Provider)(nil)
	_ compute.AccountProvider = (*Provider)(nil)
)

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
		if os.Geteuid() == 0 {
			// Not below /root (0700): plain sandboxes' own accounts
			// must pass through to their workspaces.
			base = "/var/lib"
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
		p.isolation = IsolationNone
	case IsolationGVisor:
		runsc := cfg.Runsc
		if runsc == "" {
			var err error
			if runsc, err = exec.LookPath("runsc"); err != nil {
				return nil, fmt.Errorf("%w: isolation %q: %w", compute.ErrFailedPrecondition, cfg.Isolation, errNoRunsc)
			}
		}
		abs, err := filepath.Abs(runsc)
		if err != nil {
			return nil, fmt.Errorf("local provider: runsc path: %w", err)
		}
		if fi, err := os.Stat(abs); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return nil, fmt.Errorf("%w: isolation %q: runsc %s is not an executable file", compute.ErrFailedPrecondition, cfg.Isolation, abs)
		}
		p.runsc, p.isolation = abs, IsolationGVisor
	case IsolationBubblewrap, IsolationAuto:
		bwrap, err := exec.LookPath("bwrap")
		switch {
		case err == nil:
			p.bwrap, p.isolation = bwrap, IsolationBubblewrap
		case cfg.Isolation == IsolationBubblewrap:
			return nil, fmt.Errorf("%w: isolation %q needs bwrap (bubblewrap) on PATH", compute.ErrFailedPrecondition, cfg.Isolation)
		default:
			return nil, ErrNoIsolation
		}
	default:
		return nil, fmt.Errorf("%w: unknown isolation %q", compute.ErrInvalidArgument, cfg.Isolation)
	}
	p.userns = p.bwrap != "" && os.Geteuid() == 0
	if cfg.RootFS != "" {
		if p.isolation == IsolationNone {
			return nil, fmt.Errorf("%w: a sandbox root file system (%s) needs bubblewrap or gVisor isolation: a plain local sandbox sees the host's", compute.ErrInvalidArgument, cfg.RootFS)
		}
		if p.rootFS, err = checkRootFS(cfg.RootFS); err != nil {
			return nil, err
		}
	}
	if p.userns {
		// bwrap sets the sandbox up as root of its user namespace, no
		// host root: what it binds must be reachable by any user.
		for what, path := range map[string]string{"state directory": cfg.StateDir, "sandbox root file system": p.rootFS} {
			if blocked := unsearchableAncestor(path); path != "" && blocked != "" {
				return nil, fmt.Errorf("%w: the %s %s is below %s, which other users may not search: a root harness's bubblewrap sandboxes are set up by their own unprivileged root, which must reach it; "+
					"choose one other users may pass through (e.g. below /var/lib)", compute.ErrFailedPrecondition, what, path, blocked)
			}
		}
		if p.cfg.AgentdPath, err = reachableAgentd(cfg.StateDir, cfg.AgentdPath); err != nil {
			return nil, err
		}
	}
	if p.isolation == IsolationNone {
		// Plain sandboxes share the host's process table: keep this
		// process's environment, memory and descriptors (the model API key
		// and every other credential) from processes of the harness's own
		// user, and say once what the sandbox does not confine.
		if err := MakeNonDumpable(); err != nil {
			return nil, fmt.Errorf("local provider: %w", err)
		}
		if blocked := unsearchableAncestor(cfg.StateDir); blocked != "" && os.Geteuid() == 0 {
			return nil, fmt.Errorf("%w: plain local sandboxes run as accounts of their own, which cannot reach state directory %s: %s is not searchable by other users; "+
				"choose a state directory they may pass through (e.g. below /var/tmp) or bubblewrap isolation", compute.ErrFailedPrecondition, cfg.StateDir, blocked)
		}
		// Info, not Warn: IsolationNone is only ever asked for by name, and
		// the programs that offer it say so once where it is chosen (the
		// CLI when a sandbox is made, serve at start); a warning here would
		// repeat on every later command that opens the provider.
		p.log.Info("local sandboxes are not isolated (isolation none): their processes see the host's files and network",
			zap.Bool("separate_account", os.Geteuid() == 0))
	}
	if err := p.checkEgress(); err != nil {
		return nil, err
	}
	if err := CheckResources(cfg.Resources); err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	return p, nil
}

// MakeNonDumpable clears the calling process's dumpable flag
// (PR_SET_DUMPABLE 0): its /proc/<pid>/environ, mem, fd and the like then
// belong to root, and no process without CAP_SYS_PTRACE (a sandbox process
// of the same user included) may read them or attach to it. Harnesses
// that run plain local sandboxes call it (New does); cmd/harness calls it
// at start. Children it execs are dumpable again (the kernel resets the
// flag on execve), so the sandbox daemon it starts is unaffected.
func MakeNonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the harness non-dumpable: %w", err)
	}
	return nil
}

// DefaultRunAs gives a session whose manifest names no run_as user an
// account of its own. In a root harness's bubblewrap sandbox, whose user
// namespace maps ids of its own (see userns.go), its uid is drawn at
// random from [minRunAsUID, maxRunAsUID) (ids the sandbox's base accounts
// and most manifests leave free): no other sandbox shares its host uid
// whatever it is. Otherwise (plain or gVisor sandboxes of a root harness)
// the uid is drawn from a range far above the host's accounts (2^24 to
// 2^31), so that processes of two such sandboxes on one host never share
// a uid (one could otherwise signal, trace or read the other's processes
// and files). Only a root harness can make accounts; otherwise it returns
// nil and work runs as the harness's user (inside bubblewrap's user
// namespace, or plainly with IsolationNone).
func (p *Provider) DefaultRunAs() *manifest.User {
	if os.Geteuid() != 0 {
		return nil
	}
	lo, hi, etc := uint32(minSandboxUID), uint32(maxSandboxUID), "/etc"
	if p.userns {
		lo, hi = minRunAsUID, maxRunAsUID
		if p.rootFS != "" {
			etc = filepath.Join(p.rootFS, "etc")
		}
	}
	uid, err := randomUID(lo, hi, etc)
	if err != nil {
		p.log.Warn("no uid for the sandbox's own account", zap.Error(err))
		return nil
	}
	return &manifest.User{Name: compute.DefaultRunAsName, UID: &uid}
}

// Sandbox accounts' uids are drawn from [minSandboxUID, maxSandboxUID)
// (plain and gVisor sandboxes of a root harness); the host id blocks of
// bubblewrap sandboxes' user namespaces too (see userns.go).
const (
	minSandboxUID = 1 << 24
	maxSandboxUID = 1 << 31
)

// In a sandbox with a user namespace of its own, the default account's
// uid is drawn from [minRunAsUID, maxRunAsUID): above the ids account
// tools hand out first (1000 on), below nobody's (65534).
const (
	minRunAsUID = 10000
	maxRunAsUID = 60000
)

// randomUID draws a uid in [lo, hi) that the passwd and group files of
// the directory etc (the host's /etc, or the one the sandbox's accounts
// are seeded from) do not use.
func randomUID(lo, hi uint32, etc string) (uint32, error) {
	taken := map[uint32]bool{}
	for _, name := range []string{"passwd", "group"} {
		data, err := os.ReadFile(filepath.Join(etc, name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Split(line, ":"); len(f) > 2 {
				if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					taken[uint32(n)] = true
				}
			}
		}
	}
	var b [4]byte
	for range 16 {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("random uid: %w", err)
		}
		uid := lo + binary.LittleEndian.Uint32(b[:])%(hi-lo)
		if !taken[uid] {
			return uid, nil
		}
	}
	return 0, errors.New("random uid: every draw was taken")
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
	// Checkpoint is where a paused sandbox's checkpoint is (see pause.go).
	Checkpoint string `json:"checkpoint,omitempty"`
}

// meta is the private directory's record of its sandbox.
type meta struct {
	SessionID string            `json:"session_id"`
	Lifetime  compute.Lifetime  `json:"lifetime"`
	Labels    map[string]string `json:"labels,omitempty"`
	PID       int               `json:"pid"`
	// Caps are the caps the sandbox was launched with (a restore from a
	// pause makes them again: see pause.go).
	Caps *Resources `json:"caps,omitempty"`
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
	if p.userns {
		if err := checkIDs(spec.Manifest); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(p.cfg.StateDir, spec.SessionID)
	// Names starting with a dot are the state directory's own (see
	// agentdCopyPrefix).
	if filepath.Dir(dir) != filepath.Clean(p.cfg.StateDir) || filepath.Base(dir) != spec.SessionID || strings.HasPrefix(spec.SessionID, ".") {
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
	res, err := p.resources(spec.Options)
	if err != nil {
		return nil, err
	}
	root, err := p.sandboxRoot(spec.Manifest)
	if err != nil {
		return nil, err
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
	var idBase uint32
	if p.userns {
		if _, ok, err := readIDBase(dir); err == nil && !ok && kept {
			// Made before sandboxes had user namespaces: its files
			// belong to host ids the new namespace cannot map. The
			// session restores its workspace from its snapshot instead.
			p.log.Warn("the sandbox being replaced predates user namespaces: its workspace and accounts are not kept",
				zap.String("dir", dir))
			for _, d := range []string{"workspace", "etc", homeDir} {
				if err := removeTree(filepath.Join(dir, d)); err != nil {
					return nil, fmt.Errorf("replace the sandbox of session %s: %w", spec.SessionID, err)
				}
			}
			kept = false
		}
		base, err := p.idBase(dir)
		if err != nil {
			if !kept {
				_ = removeTree(dir)
			}
			return nil, err
		}
		idBase = base
	}
	// A disk cap: the directories the sandbox writes to are put on a file
	// system of its own before anything is written there (see disk.go).
	if kept, err = p.setupDisk(dir, res.Disk, kept); err != nil {
		if !kept {
			_ = removeTree(dir)
		}
		return nil, err
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
	baseEtc := "/etc"
	if p.rootFS != "" {
		baseEtc = filepath.Join(p.rootFS, "etc")
	}
	if err := seedEtc(etc, baseEtc); err != nil {
		return nil, err
	}
	if err := seedRunAs(dir, spec.Manifest, idBase); err != nil {
		return nil, err
	}
	args := []string{"--etc-root", dir}
	if m := spec.Manifest; m != nil && m.RunAs != "" && m.RunAs != "root" {
		// Requests that name no user (the agent's tools, an operator's
		// exec) run as the manifest's run_as account, not as root.
		args = append(args, "--default-user", m.RunAs)
	}
	args = append(args, p.cfg.Args...)
	run, ws := filepath.Join(dir, runDir), filepath.Join(dir, "workspace")
	for _, d := range []string{run, ws, filepath.Join(dir, homeDir)} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create sandbox directory: %w", err)
		}
	}
	if p.userns {
		// The daemon is root of the sandbox's user namespace, host uid
		// idBase: what it writes must be its own (a kept workspace
		// already is, and its files are their users').
		own := []string{run, etc, filepath.Join(etc, "passwd"), filepath.Join(etc, "group"), filepath.Join(dir, homeDir)}
		if !kept {
			own = append(own, ws)
		}
		if err := chownToSandbox(idBase, own...); err != nil {
			if !kept {
				_ = removeTree(dir)
			}
			return nil, err
		}
	}
	if p.runsc != "" {
		// Before the egress proxy (see giveEgressSocket).
		if err = gvisorForgetAccount(dir); err != nil {
			if !kept {
				_ = removeTree(dir)
			}
			return nil, err
		}
	}
	launched := false
	if p.cfg.Egress != nil {
		relay, err := p.startEgress(dir)
		if err != nil {
			return nil, err
		}
		defer func() {
			if !launched {
				p.stopEgress(dir)
			}
		}()
		args = append(args, relay...)
	} else {
		p.forgetEgress(dir) // a replaced sandbox's policy does not carry over
	}
	opts := Options{AgentdPath: p.cfg.AgentdPath, Dir: run, Workspace: ws, WorkspaceRoot: root, Token: token, Args: args,
		Stderr: p.cfg.Stderr, ReadyTimeout: p.cfg.ReadyTimeout}
	var rewound []*os.File // what a restart must rewind (see rewind)
	if p.bwrap != "" {
		var filter *os.File
		if !p.cfg.NoSeccomp {
			if filter, err = seccomp.File(); err != nil {
				return nil, fmt.Errorf("sandbox seccomp filter (Config.NoSeccomp turns it off for debugging): %w", err)
			}
			defer filter.Close() // bwrap holds its own copy once started
			rewound = append(rewound, filter)
		}
		bw, err := p.bubblewrap(dir, root, filter)
		if err != nil {
			if !kept {
				_ = removeTree(dir)
			}
			return nil, err
		}
		opts.ExtraFiles = bw.files
		opts.Wrap = func(argv []string) []string {
			return append(append(append([]string{p.bwrap}, bw.args...), "--"), argv...)
		}
		if p.userns {
			opts.UserNS = &UserNS{HostID: idBase, Size: idBlockSize}
		}
	} else if p.runsc != "" {
		opts.Prepare = func(argv []string) error { return p.gvisorPrepare(dir, root, argv, res.MaxProcesses) }
		opts.Wrap = func([]string) []string { return p.gvisorArgv(dir) }
	} else if m := spec.Manifest; m != nil && m.RunAs != "" && m.RunAs != "root" {
		if blocked := unsearchableAncestor(ws); blocked != "" {
			p.log.Warn("the run_as user cannot reach this plain local sandbox's workspace: commands run as it will fail to start; "+
				"use a state directory whose parents other users may search, or bubblewrap isolation",
				zap.String("run_as", m.RunAs), zap.String("workspace", ws), zap.String("not searchable by others", blocked))
		}
	}
	// The host's caps: under gVisor, room for runsc's own processes and
	// threads besides the sandbox's (capped inside: see caps.go).
	hostRes := p.hostResources(res)
	cgroups := func() error {
		cgs, note, err := makeSandboxCgroups(dir, hostRes)
		if err != nil {
			return err
		}
		if note != nil {
			p.withoutCgroup(note)
		}
		opts.Cgroup, opts.CgroupRequired, opts.CgroupV1 = cgs.v2, cgs.v2Caps, cgs.v1
		return nil
	}
	if err := cgroups(); err != nil {
		if !kept {
			_ = removeTree(dir)
		}
		return nil, err
	}
	sb, err := Start(ctx, opts, p.log)
	for attempt := 2; err != nil && p.bwrap != "" && errors.Is(err, ErrExitedAtStart) && attempt <= bwrapStartAttempts && ctx.Err() == nil; attempt++ {
		// bwrap builds the sandbox's mount tree from the host's live one;
		// a CI run saw one start fail with nothing wrong in the sandbox
		// (the same launch passed at once after). A deterministic failure
		// (a bad flag) fails every attempt and is reported as before.
		p.log.Warn("the bubblewrap sandbox exited during start-up; starting it again", zap.String("dir", dir), zap.Int("attempt", attempt), zap.Error(err))
		if opts.Cgroup != "" || len(opts.CgroupV1) > 0 {
			if rerr := p.removeCgroup(ctx, dir); rerr != nil {
				break
			}
			if err = cgroups(); err != nil {
				break
			}
		}
		if err = rewind(rewound); err != nil {
			break
		}
		sb, err = Start(ctx, opts, p.log)
	}
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
		// Started outside the cgroup: drop it (it is empty) and the record
		// (not the v1 cgroups: the sandbox runs in them).
		p.withoutCgroup(sb.CgroupErr())
		if err := p.removeCgroupV2(ctx, dir); err != nil {
			p.log.Warn("an unused sandbox cgroup could not be removed", zap.String("dir", dir), zap.Error(err))
		}
	}
	m := meta{SessionID: spec.SessionID, Lifetime: spec.Lifetime, Labels: spec.Labels, PID: sb.PID(), Caps: &res}
	data, _ := json.Marshal(m)
	if err := writeFileAtomic(filepath.Join(dir, metaFile), data, 0o600); err != nil {
		_ = sb.Close(ctx)
		_ = p.removeCgroup(ctx, dir)
		return nil, err
	}
	// A replacement of a paused sandbox (compute.DiscardMemory): its
	// memory image no longer matches the workspace.
	p.dropCheckpoint(dir)
	s := &sandbox{p: p, dir: dir, client: sb.Client, child: sb, kept: kept}
	_ = s.Touch(ctx)
	launched = true
	return s, nil
}

// Reattach connects to a sandbox's daemon if it still runs, and restores
// a paused one (see pause.go) unless spec.DiscardMemory.
func (p *Provider) Reattach(ctx context.Context, spec compute.LaunchSpec, prior json.RawMessage) (compute.Sandbox, error) {
	dir, err := p.dirOf(prior)
	if err != nil {
		return nil, err
	}
	if err := awaitCheckpoint(ctx, dir); err != nil {
		return nil, err
	}
	pid, alive := p.running(dir)
	paused := pausedAt(dir)
	if alive && paused && p.runsc != "" && !p.containerRunning(ctx, dir, pid) {
		// Checkpointed a moment ago (by a harness that died before it
		// cleaned up): its runsc is ending.
		if err := waitNoDaemons(ctx, dir, sandboxMarkers(dir)); err != nil {
			return nil, err
		}
		pid, alive = p.running(dir)
	}
	switch {
	case !alive && paused && spec.DiscardMemory:
		return nil, fmt.Errorf("%w: the sandbox in %s is paused and its memory is to be discarded", compute.ErrNotFound, filepath.Base(dir))
	case !alive && paused:
		return p.restore(ctx, dir)
	case !alive:
		return nil, fmt.Errorf("%w: the sandbox daemon in %s is not running", compute.ErrNotFound, filepath.Base(dir))
	}
	// A pause that did not finish (its harness died) may have left the
	// daemon closed: bring it back now rather than when its lease ends.
	_, err = os.Stat(filepath.Join(dir, gvisorDir, checkpointPausing))
	nudged := p.runsc != "" && (err == nil || paused)
	if nudged {
		p.nudge(ctx, dir, pid)
	}
	if err := p.resumeEgress(dir); err != nil {
		// Fails closed: the sandbox has no way out until a harness serves
		// its proxy again.
		p.log.Warn("the sandbox's egress proxy could not be served; its network requests will fail", zap.String("dir", dir), zap.Error(err))
	}
	token, err := os.ReadFile(filepath.Join(dir, tokenFile))
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox token: %v", compute.ErrNotFound, err)
	}
	client, err := agentclient.Dial(agentclient.Options{Address: "unix://" + filepath.Join(dir, runDir, socketName), Token: string(token), TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return nil, err
	}
	if _, err := agentclient.WaitReady(ctx, client, agentclient.ReadyOptions{Timeout: p.cfg.ReadyTimeout,
		Alive: func(context.Context) error {
			if _, alive := p.running(dir); !alive {
				return fmt.Errorf("%w: the sandbox daemon (pid %d) exited", compute.ErrUnavailable, pid)
			}
			return nil
		}}); err != nil {
		client.Close()
		return nil, fmt.Errorf("the sandbox daemon (pid %d) does not answer: %w", pid, err)
	}
	if nudged {
		p.dropCheckpoint(dir)
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
		info := compute.SandboxInfo{Provider: ProviderName, SessionID: m.SessionID, ID: e.Name(), Running: alive, Lifetime: m.Lifetime, State: st,
			Paused: !alive && pausedAt(dir)}
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
	if filepath.Dir(dir) != filepath.Clean(p.cfg.StateDir) || strings.HasPrefix(filepath.Base(dir), ".") {
		return "", fmt.Errorf("%w: local sandbox directory %s is not in this provider's state directory", compute.ErrInvalidArgument, dir)
	}
	return dir, nil
}

// running reports the daemon pid recorded in dir and whether that process
// still runs and is that daemon (its command line names dir's socket, or,
// for runsc, dir's gVisor state: see sandboxMarkers).
func (p *Provider) running(dir string) (int, bool) {
	m, err := readMeta(dir)
	if err != nil || m.PID <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", m.PID))
	if err != nil || !hasMarker(cmdline, sandboxMarkers(dir)) {
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
	p        *Provider
	dir      string
	child    *Sandbox // set when this process started the daemon
	kept     bool
	restored bool // brought back from a pause (see pause.go)

	mu     sync.Mutex
	client *agentclient.Client // replaced by reconnect
	closed bool

	// pauseMu makes pauses of this sandbox one at a time.
	pauseMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
}

func (s *sandbox) Agent() *agentclient.Client { return s.agent() }

func (s *sandbox) agent() *agentclient.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Restored reports whether the sandbox was restored from a pause.
func (s *sandbox) Restored() bool { return s.restored }

// reconnect replaces the client (closed for a pause that did not happen)
// and waits until the daemon answers.
func (s *sandbox) reconnect(ctx context.Context) error {
	token, err := os.ReadFile(filepath.Join(s.dir, tokenFile))
	if err != nil {
		return fmt.Errorf("sandbox token: %w", err)
	}
	client, err := agentclient.Dial(agentclient.Options{Address: "unix://" + filepath.Join(s.dir, runDir, socketName), Token: string(token), TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return err
	}
	if _, err := agentclient.WaitReady(ctx, client, agentclient.ReadyOptions{Timeout: s.p.cfg.ReadyTimeout}); err != nil {
		client.Close()
		return fmt.Errorf("the sandbox daemon does not answer again: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		client.Close()
		return nil
	}
	old := s.client
	s.client = client
	_ = old.Close()
	return nil
}

func (s *sandbox) State() (json.RawMessage, error) {
	ps := providerState{Dir: s.dir}
	if pausedAt(s.dir) {
		ps.Checkpoint, _ = checkpointPaths(s.dir)
	}
	return json.Marshal(ps)
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
	s.closeOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		s.closeErr = s.client.Close()
	})
	return s.closeErr
}

// stopSandbox ends the sandbox in dir: SIGTERM to its daemon (which kills
// its process groups and drains), then, if anything of the sandbox still
// runs after ctx ends or 10 s, SIGKILL to every process naming its socket
// (under bubblewrap that includes the pid namespace's init, whose death
// ends everything inside; under gVisor, the runsc processes, and with the
// sentry ends everything inside). Last, the sandbox's cgroup, when it has one, is
// killed and removed: whatever escaped the daemon's process groups, or
// outlived a daemon that died without draining, ends there.
func (p *Provider) stopSandbox(ctx context.Context, dir string) error {
	err := errors.Join(p.stopDaemon(ctx, dir), p.removeCgroup(ctx, dir))
	unmountNullNetNS(gvisorPathsOf(dir).root)
	p.stopEgress(dir)
	return err
}

// stopDaemon is stopSandbox's graceful part: SIGTERM to the daemon, and
// SIGKILL to the processes naming its socket if they do not end in time.
// A daemon inside gVisor is not in the host's process table: `runsc run`
// (the process the provider started, recorded in meta) gets the SIGTERM
// and forwards it to the daemon.
func (p *Provider) stopDaemon(ctx context.Context, dir string) error {
	markers := sandboxMarkers(dir)
	procs := sandboxProcesses(markers)
	signalled := false
	for _, pr := range procs {
		if pr.argv0 == p.cfg.AgentdPath {
			_ = syscall.Kill(pr.pid, syscall.SIGTERM)
			signalled = true
		}
	}
	if m, err := readMeta(dir); !signalled && err == nil {
		for _, pr := range procs {
			if pr.pid == m.PID {
				_ = syscall.Kill(pr.pid, syscall.SIGTERM)
				signalled = true
			}
		}
	}
	if !signalled {
		for _, pr := range procs {
			_ = syscall.Kill(pr.pid, syscall.SIGTERM)
		}
	}
	return waitNoDaemons(ctx, dir, markers)
}

// removeCgroup kills and removes the cgroups recorded in dir, if any (its
// v2 cgroup, and the v1 cgroups of its caps), and then the records. A
// record that does not pass validation is not acted on (only dropped,
// with a warning), nor is a cgroup this process may not touch (a harness
// without the rights of the one that made it): without usable cgroups a
// sandbox ends as it did before them. It fails when the cgroup's
// processes do not end in time.
func (p *Provider) removeCgroup(ctx context.Context, dir string) error {
	// The v2 cgroup first: killing it ends every process of the sandbox
	// at once; its v1 cgroups (caps.go) are then empty, or emptied by
	// their own kill.
	if err := p.removeCgroupV2(ctx, dir); err != nil {
		return err
	}
	record := filepath.Join(dir, cgroupsV1File)
	cgs, err := recordedCgroupsV1(dir)
	if err != nil {
		p.log.Warn("ignoring the sandbox's cgroup v1 record", zap.String("dir", dir), zap.Error(err))
	}
	for _, cg := range cgs {
		err := killCgroupV1(ctx, cg)
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

// removeCgroupV2 is removeCgroup for the sandbox's cgroup v2 directory.
func (p *Provider) removeCgroupV2(ctx context.Context, dir string) error {
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

// sandboxProcesses lists the live processes whose command line carries one
// of markers (sandboxMarkers).
func sandboxProcesses(markers [][]byte) []sandboxProc {
	var out []sandboxProc
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !hasMarker(cmdline, markers) || !alivePID(pid) {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		out = append(out, sandboxProc{pid: pid, argv0: string(argv0)})
	}
	return out
}

// waitNoDaemons waits until no live process's command line carries one of
// markers (the sandbox in dir's), killing what remains after ctx ends or
// 10 s pass.
func waitNoDaemons(ctx context.Context, dir string, markers [][]byte) error {
	deadline := time.Now().Add(10 * time.Second)
	killed := false
	for {
		procs := sandboxProcesses(markers)
		if len(procs) == 0 {
			return nil
		}
		if !killed && (time.Now().After(deadline) || ctx.Err() != nil) {
			for _, pr := range procs {
				_ = syscall.Kill(pr.pid, syscall.SIGKILL)
			}
			killed, deadline = true, time.Now().Add(5*time.Second)
		} else if killed && time.Now().After(deadline) {
			return fmt.Errorf("sandbox processes of %s survive SIGKILL", dir)
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

// rewind puts files the last start read (the seccomp filter's memfd,
// which bwrap reads to its end) back at their start.
func rewind(files []*os.File) error {
	for _, f := range files {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("restart the sandbox: rewind %s: %w", f.Name(), err)
		}
	}
	return nil
}

// bwrapStartAttempts bounds the starts of a bubblewrap sandbox whose
// process exits before its daemon serves.
const bwrapStartAttempts = 3

// bubblewrap returns bwrap's arguments for the sandbox in dir (those
// after the bwrap binary, up to "--"), with the descriptors they name: the
// host file system read-only, or, with Config.RootFS, the sandbox root
// file system instead (see rootfs.go); the workspace, the socket directory
// and the private etc writable; fresh /dev, /proc, /tmp and (without the
// host network) /run; and new namespaces. A root harness starts bwrap as
// root of a user namespace of the sandbox's own (Options.UserNS, see
// userns.go), which bwrap does not make itself; otherwise bwrap makes one
// mapping the harness user. With filter set, bwrap reads the seccomp
// filter (package seccomp) from it and installs it on the daemon, and so
// on everything the sandbox runs. The workspace is bound at root, the
// path the sandbox sees it at (see wsroot.go).
func (p *Provider) bubblewrap(dir, root string, filter *os.File) (*bwrapArgs, error) {
	b := &bwrapArgs{}
	// The daemon is the pid namespace's init (it reaps like one): when
	// it dies, for whatever reason, the kernel ends everything inside.
	b.add("--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
	agentd := p.cfg.AgentdPath
	base := p.layoutBase(root)
	if base != "" {
		// bwrap's own tmpfs root, with the root file system (or the
		// host's top-level entries) on it; what the sandbox needs that
		// the tree lacks (the workspace root's mount point; on a root
		// file system, the private directory and the daemon binary at
		// their host paths) is made there.
		if err := b.rootFS(base, p.layoutKeep(dir, agentd, root)); err != nil {
			return nil, err
		}
	} else {
		b.add("--ro-bind", "/", "/")
	}
	b.add("--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp")
	if !p.cfg.Network || p.rootFS != "" {
		// The host's /run holds its daemons' sockets (Docker's among
		// them): hide them behind a fresh tmpfs. (A sandbox on the host
		// network keeps /run: its resolver configuration may live there.)
		b.add("--perms", "0755", "--tmpfs", "/run")
	}
	if err := b.privateEtc(dir, p.rootFS); err != nil {
		return nil, err
	}
	// The sandbox sees of the state directory only its own workspace,
	// socket directory, accounts and homes: a fresh tmpfs hides the rest
	// (its token, other sandboxes and theirs) from the highest directory
	// that needs hiding (see hiddenTop), and the directories on the way
	// down are made 0711, so run_as accounts pass through to the workspace
	// even below a 0700 home. On a root file system of the sandbox's own,
	// nothing of the state directory is there to hide: the directories
	// are made from / down.
	top := "/"
	if p.rootFS == "" {
		if top = hiddenTop(p.cfg.StateDir, dir); top != "/tmp" {
			b.add("--perms", "0711", "--tmpfs", top)
		}
	}
	var chain []string
	for a := dir; a != top && a != filepath.Dir(a); a = filepath.Dir(a) {
		chain = append([]string{a}, chain...)
	}
	for _, a := range chain {
		b.add("--perms", "0711", "--dir", a)
	}
	home := filepath.Join(dir, homeDir)
	for _, d := range []string{filepath.Join(dir, runDir), filepath.Join(dir, "etc"), home} {
		b.bind(d, d, false)
	}
	// Homes: where the daemon creates them (below its etc root) and where
	// the accounts say they are; the host's /home is hidden.
	b.bind(home, "/home", false)
	// The workspace at its sandbox path, after every tmpfs (a root may lie
	// below /tmp).
	b.bind(filepath.Join(dir, "workspace"), root, false)
	// Last, after every tmpfs: the daemon binary may live below /tmp
	// or below the hidden directory (a root harness's ~/go/bin).
	b.bind(agentd, agentd, true)
	if base != "" {
		b.add("--remount-ro", "/")
	}
	// No --die-with-parent: the sandbox outlives the harness process so
	// a later one can resume it; stopSandbox ends it explicitly.
	b.add("--new-session")
	if !p.cfg.Network {
		b.add("--unshare-net")
	}
	if os.Geteuid() != 0 {
		b.add("--unshare-user")
	} else {
		// Root of the sandbox's user namespace has every capability
		// there (none on the host): keep only what the daemon needs to
		// act as run_as users, as the Docker provider does.
		b.add("--cap-drop", "ALL")
		for _, c := range daemonCapabilities {
			b.add("--cap-add", c)
		}
	}
	if filter != nil {
		b.add("--seccomp", strconv.Itoa(b.inherit(filter)))
	}
	return b, nil
}

// daemonCapabilities are what a root harness's isolated sandbox keeps:
// the daemon runs processes as other users (SETUID, SETGID), creates and
// chowns their files (CHOWN, DAC_OVERRIDE, FOWNER, FSETID) and signals
// their process groups (KILL); the same set as docker.DefaultCapabilities.
// Under bubblewrap they are capabilities of the sandbox's user namespace,
// over its own ids only.
var daemonCapabilities = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}

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

// seedEtc creates a private etc with copies of the account files of the
// directory base (the host's /etc, or the sandbox root file system's),
// keeping an existing one (a replacement sandbox keeps its accounts).
func seedEtc(etc, base string) error {
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("sandbox accounts: %w", err)
	}
	for _, name := range []string{"passwd", "group"} {
		dst := filepath.Join(etc, name)
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(base, name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sandbox accounts: %w", err)
		}
		if err := writeFileAtomic(dst, data, 0o644); err != nil {
			return fmt.Errorf("sandbox accounts: %w", err)
		}
	}
	return nil
}

// seedRunAs creates the manifest's run_as account in the sandbox's private
// etc before the daemon starts, when the manifest fixes its uid and names
// no groups for it (the account DefaultRunAs gives): requests that name no
// user run as it from the first one, even before the session materializes
// its manifest (which then finds the account there). Only a root harness
// can give the account's home to it: with idBase (a sandbox with a user
// namespace of its own), to the host ids its ids map to.
func seedRunAs(dir string, m *manifest.Manifest, idBase uint32) error {
	if m == nil || m.RunAs == "" || m.RunAs == "root" || os.Geteuid() != 0 {
		return nil
	}
	i := slices.IndexFunc(m.Users, func(u manifest.User) bool { return u.Name == m.RunAs })
	if i < 0 || m.Users[i].UID == nil || len(m.Users[i].Groups) > 0 || m.Users[i].Home != "" || m.Users[i].Shell != "" {
		return nil
	}
	db := userdb.New(dir)
	if _, err := db.Lookup(m.RunAs); err == nil {
		return nil // a replacement sandbox keeps its accounts
	}
	u, err := db.AddUser(userdb.NewUser{Name: m.RunAs, UID: m.Users[i].UID})
	if err != nil {
		return fmt.Errorf("sandbox account %s: %w", m.RunAs, err)
	}
	if idBase != 0 {
		if err := os.Lchown(filepath.Join(dir, u.Home), int(idBase+u.UID), int(idBase+u.GID)); err != nil {
			return fmt.Errorf("sandbox account %s: home: %w", m.RunAs, err)
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
	// A sandbox's own disk is unmounted and released first (see disk.go).
	if err := releaseDisk(dir); err != nil {
		return err
	}
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
