package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// gVisor isolation: the daemon runs as the init of a gVisor sandbox
// (`runsc run` of an OCI bundle written into the sandbox's private
// directory), so every system call of the sandbox's processes is served
// by gVisor's user-space kernel, not the host's. The sandbox sees the
// same file system as under bubblewrap (the host's read-only, or
// Config.RootFS laid out on an empty root, its own workspace, socket
// directory, accounts and homes writable, the rest of the state directory
// hidden) and, by default, no network but loopback.
//
// The daemon's socket lives in the bound run directory: runsc's
// --host-uds=create lets the daemon create it as a host socket the
// harness dials; with egress control, --host-uds=all also lets the
// daemon's relay connect to the harness's proxy socket there. /run is a
// fresh tmpfs, so the host's own daemons' sockets (Docker's, for one)
// are not reachable through the read-only root. runsc is started with
// --ignore-cgroups: the sandbox stays in the cgroups the provider starts
// it in (see cgroup.go), where they exist, which hold its caps (caps.go).

// Accounts: the daemon runs as root inside gVisor, with the capabilities
// a bubblewrap sandbox's daemon keeps (daemonCapabilities), and, as under
// bubblewrap, acts as the manifest's run_as account (the provider's
// default account when the manifest names none: DefaultRunAs) for files
// and processes. gVisor's root is the sentry's, not the host's: the
// sandbox gets no host privilege from it. gVisor lacks setfsuid and
// setfsgid (gvisor.dev/issue/260); sandbox-agentd notices and switches a
// thread's effective ids instead (see workspace.credSwitch). A non-root
// harness runs runsc rootless: root inside maps to the harness's own uid.

// gvisorDir is where, in a sandbox's private directory, runsc keeps its
// bundle, its state and the sandbox's /etc view; the sandbox never sees it.
const gvisorDir = "gvisor"

// gvisorPaths are a sandbox's runsc directories.
type gvisorPaths struct {
	root    string // runsc --root: container state
	bundle  string // config.json
	rootfs  string // an empty directory: the OCI root, with / bound over it
	etcView string // the sandbox's /etc: symbolic links (see gvisorEtc)
	uid     string // the daemon's account, recorded by earlier versions (see gvisorOwner)
}

func gvisorPathsOf(dir string) gvisorPaths {
	g := filepath.Join(dir, gvisorDir)
	return gvisorPaths{root: filepath.Join(g, "state"), bundle: filepath.Join(g, "bundle"),
		rootfs: filepath.Join(g, "rootfs"), etcView: filepath.Join(g, "etc"), uid: filepath.Join(g, "uid")}
}

// gvisorMarker is the argument every runsc process of the sandbox in dir
// carries (runsc passes its global flags to the gofer and the sentry):
// how stopDaemon and running find them, since the daemon itself runs
// inside gVisor, out of the host's process table.
func gvisorMarker(dir string) string { return "--root=" + gvisorPathsOf(dir).root }

// gvisorContainerID is the OCI container id of the sandbox in dir.
func gvisorContainerID(dir string) string {
	id := []byte("bulkhead-" + filepath.Base(dir))
	for i, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			id[i] = '_'
		}
	}
	return string(id)
}

// gvisorArgv is the runsc command that runs the bundle gvisorPrepare
// wrote, passing the token pipe through as descriptor 3.
func (p *Provider) gvisorArgv(dir string) []string {
	g := gvisorPathsOf(dir)
	argv := []string{p.runsc, gvisorMarker(dir), "--ignore-cgroups"}
	if p.cfg.Network {
		argv = append(argv, "--network=host")
	} else {
		argv = append(argv, "--network=none")
	}
	if p.cfg.Egress != nil {
		argv = append(argv, "--host-uds=all") // create the daemon's socket, open the proxy's
	} else {
		argv = append(argv, "--host-uds=create")
	}
	if os.Geteuid() != 0 {
		argv = append(argv, "--rootless")
	}
	argv = append(argv, p.cfg.GVisorFlags...)
	return append(argv, "run", "--bundle", g.bundle, "--pass-fd", "3:3", gvisorContainerID(dir))
}

// gvisorForgetAccount drops the record of an unprivileged daemon account
// that earlier versions ran a gVisor sandbox's daemon as (see
// gvisorOwner): the sandbox in dir is about to be launched with a root
// daemon, which acts as the manifest's accounts itself.
func gvisorForgetAccount(dir string) error {
	if err := os.Remove(gvisorPathsOf(dir).uid); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gvisor: drop the old sandbox account record: %w", err)
	}
	return nil
}

// gvisorOwner returns the uid of the unprivileged account recorded in dir
// by earlier versions, which ran the daemon itself as it, and whether
// there is one: such a daemon, still running, is the one that connects to
// the egress proxy's socket.
func gvisorOwner(dir string) (int, bool) {
	data, err := os.ReadFile(gvisorPathsOf(dir).uid)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil || n < minSandboxUID || n >= maxSandboxUID {
		return 0, false
	}
	return int(n), true
}

// gvisorPrepare writes the OCI bundle that runs daemonArgv in the sandbox
// in dir, its workspace at root (see wsroot.go), with a fresh /etc view, and drops the state a dead runsc left
// (the caller made sure no daemon of dir runs). With maxProcs, the
// sandbox's processes are capped at that many per uid inside gVisor
// (RLIMIT_NPROC, which the sentry enforces; see caps.go).
func (p *Provider) gvisorPrepare(dir, root string, daemonArgv []string, maxProcs int64) error {
	g := gvisorPathsOf(dir)
	unmountNullNetNS(g.root)
	if err := os.RemoveAll(g.root); err != nil {
		return fmt.Errorf("gvisor: drop stale runsc state: %w", err)
	}
	if err := os.RemoveAll(g.rootfs); err != nil {
		return fmt.Errorf("gvisor: drop the old root: %w", err)
	}
	for _, d := range []string{g.root, g.bundle, g.rootfs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("gvisor: %w", err)
		}
	}
	baseEtc := "/etc"
	if p.rootFS != "" {
		baseEtc = filepath.Join(p.rootFS, "etc")
	}
	if base := p.layoutBase(root); base != "" {
		if err := p.gvisorRoot(dir, root, base, daemonArgv[0]); err != nil {
			return err
		}
	}
	if err := gvisorEtc(g.etcView, dir, baseEtc); err != nil {
		return err
	}
	spec, err := p.gvisorSpec(dir, root, daemonArgv)
	if err != nil {
		return err
	}
	if maxProcs > 0 {
		spec.Process.Rlimits = append(spec.Process.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: uint64(maxProcs), Soft: uint64(maxProcs)})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("gvisor: OCI spec: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(g.bundle, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	return nil
}

// gvisorEtc makes view the sandbox's /etc: a symbolic link per entry of
// the base /etc (the host's, or the sandbox root file system's) to the
// same entry below /etc/.host (where the base is bound read-only), and
// passwd and group linked to the sandbox's private copies in dir/etc,
// which the daemon edits by rename (as privateEtc does for bubblewrap,
// with links made on the host since an OCI spec cannot make them).
func gvisorEtc(view, dir, base string) error {
	if err := os.RemoveAll(view); err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(view, hostEtc), 0o755); err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	if err := os.Chmod(view, 0o755); err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	entries, err := os.ReadDir(base)
	if err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "passwd" || name == "group" || name == hostEtc {
			continue
		}
		target := hostEtc + "/" + name
		if e.Type()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(filepath.Join(base, name)); err != nil {
				continue // gone meanwhile
			}
		}
		if err := os.Symlink(target, filepath.Join(view, name)); err != nil {
			return fmt.Errorf("gvisor: /etc view: %w", err)
		}
	}
	for _, name := range []string{"passwd", "group"} {
		if err := os.Symlink(filepath.Join(dir, "etc", name), filepath.Join(view, name)); err != nil {
			return fmt.Errorf("gvisor: /etc view: %w", err)
		}
	}
	return nil
}

// ociSpec is the part of the OCI runtime spec (config.json) runsc reads
// that a sandbox needs.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociProcess struct {
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	Capabilities    ociCapabilities `json:"capabilities"`
	Rlimits         []ociRlimit     `json:"rlimits,omitempty"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces []ociNamespace `json:"namespaces"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

// gvisorSpec is the sandbox in dir as an OCI spec running daemonArgv as
// root of the sandbox (inside gVisor) with the capabilities the daemon
// needs and no more, its workspace at root.
func (p *Provider) gvisorSpec(dir, root string, daemonArgv []string) (ociSpec, error) {
	g := gvisorPathsOf(dir)
	bind := func(src, dst string, rw bool) ociMount {
		mode := "ro"
		if rw {
			mode = "rw"
		}
		return ociMount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", mode}}
	}
	tmpfs := func(dst, mode string) ociMount {
		return ociMount{Destination: dst, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=" + mode}}
	}
	// The host's file system read-only, bound over an empty root (runsc
	// mishandles later binds below a root path of / itself: they come out
	// read-only), or the entries of the sandbox root file system (or of
	// the host's, when the workspace root has no mount point there) bound
	// on a root holding their mount points (see gvisorRoot); then gVisor's
	// own /proc, /dev and /sys.
	var mounts []ociMount
	if base := p.layoutBase(root); base == "" {
		mounts = append(mounts, bind("/", "/", false))
	} else {
		layout, err := rootLayout(base, p.layoutKeep(dir, daemonArgv[0], root))
		if err != nil {
			return ociSpec{}, err
		}
		for _, e := range layout {
			if e.src != "" && !e.link {
				mounts = append(mounts, bind(e.src, e.dest, false))
			}
		}
	}
	mounts = append(mounts, []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		tmpfs("/tmp", "1777"),
		tmpfs("/run", "0755"),
	}...)
	// As under bubblewrap: the state directory hidden from its highest
	// directory that needs hiding (on a root file system of the sandbox's
	// own, there is nothing to hide), then the sandbox's own parts.
	if top := hiddenTop(p.cfg.StateDir, dir); top != "/tmp" && p.rootFS == "" {
		mounts = append(mounts, tmpfs(top, "0711"))
	}
	home := filepath.Join(dir, homeDir)
	for _, d := range []string{filepath.Join(dir, runDir), filepath.Join(dir, "etc"), home} {
		mounts = append(mounts, bind(d, d, true))
	}
	baseEtc := "/etc"
	if p.rootFS != "" {
		baseEtc = filepath.Join(p.rootFS, "etc")
	}
	if fi, err := os.Stat("/home"); p.rootFS != "" || err == nil && fi.IsDir() {
		mounts = append(mounts, bind(home, "/home", true))
	}
	mounts = append(mounts, bind(g.etcView, "/etc", false), bind(baseEtc, "/etc/"+hostEtc, false),
		// The workspace at its sandbox path, after every tmpfs (a root
		// may lie below /tmp).
		bind(filepath.Join(dir, "workspace"), root, true),
		// Last, after every tmpfs: the daemon binary may live below /tmp
		// or below the hidden directory.
		bind(daemonArgv[0], daemonArgv[0], false))
	mounts = dropShadowedMounts(mounts)
	namespaces := []ociNamespace{{"pid"}, {"ipc"}, {"uts"}, {"mount"}}
	if !p.cfg.Network {
		namespaces = append(namespaces, ociNamespace{"network"})
	}
	var rlimits []ociRlimit
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err == nil {
		rlimits = append(rlimits, ociRlimit{Type: "RLIMIT_NOFILE", Hard: nofile.Max, Soft: nofile.Max})
	}
	caps := slices.Clone(daemonCapabilities)
	return ociSpec{
		Version: "1.0.2",
		Process: ociProcess{
			User:         ociUser{UID: 0, GID: 0},
			Args:         daemonArgv,
			Env:          []string{"PATH=" + os.Getenv("PATH")}, // as the plain and bubblewrap daemons get
			Cwd:          "/",
			Capabilities: ociCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:      rlimits,
			// No set-uid escalation inside; the daemon changes users by
			// its own capabilities, and its children keep none.
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: g.rootfs, Readonly: true},
		Hostname: "sandbox",
		Mounts:   mounts,
		Linux:    ociLinux{Namespaces: namespaces},
	}, nil
}

// dropShadowedMounts drops a mount that a later one at the same
// destination hides entirely (the root file system's /proc under gVisor's
// own, say): runsc's restore compares a checkpoint's mounts by
// destination, one each, and refuses duplicates that differ. A mount is
// kept when a mount below its destination comes between it and the one
// hiding it.
func dropShadowedMounts(mounts []ociMount) []ociMount {
	out := make([]ociMount, 0, len(mounts))
	for i, m := range mounts {
		shadowed := false
		for j := i + 1; j < len(mounts); j++ {
			d := mounts[j].Destination
			if d == m.Destination {
				shadowed = true
				break
			}
			if strings.HasPrefix(d, strings.TrimSuffix(m.Destination, "/")+"/") {
				break // something is mounted on it first
			}
		}
		if !shadowed {
			out = append(out, m)
		}
	}
	return out
}

// gvisorRoot makes the OCI root of the gVisor sandbox in dir laid out
// from the tree at base (the sandbox root file system, or the host's /:
// see layoutBase): an empty tree holding the mount points of the tree's
// entries (see rootLayout), of the sandbox's own parts, its workspace at
// wsRoot included, of the daemon binary agentd and of gVisor's /proc,
// /dev, /sys, /tmp, /run, /etc and /home, which gvisorSpec mounts there.
func (p *Provider) gvisorRoot(dir, wsRoot, base, agentd string) error {
	root := gvisorPathsOf(dir).rootfs
	layout, err := rootLayout(base, p.layoutKeep(dir, agentd, wsRoot))
	if err != nil {
		return err
	}
	fail := func(err error) error { return fmt.Errorf("gvisor: sandbox root: %w", err) }
	// The sandbox's /: every account passes through it (its host
	// directory, below the private gvisor directory, is made 0700).
	if err := os.Chmod(root, 0o755); err != nil {
		return fail(err)
	}
	mkdir := func(path string, perm fs.FileMode) error {
		if err := os.MkdirAll(filepath.Join(root, path), 0o755); err != nil {
			return err
		}
		return os.Chmod(filepath.Join(root, path), perm)
	}
	for _, e := range layout {
		at := filepath.Join(root, e.dest)
		switch {
		case e.link:
			err = os.Symlink(e.src, at)
		case e.src == "":
			err = mkdir(e.dest, e.perm)
		case e.dir:
			err = mkdir(e.dest, 0o755)
		default:
			err = os.WriteFile(at, nil, 0o644)
		}
		if err != nil {
			return fail(err)
		}
	}
	for _, d := range []string{"/proc", "/dev", "/sys", "/tmp", "/run", "/etc", "/home", wsRoot} {
		if _, err := os.Lstat(filepath.Join(root, d)); err == nil {
			continue // laid out already (never follow a link of the tree's)
		}
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fail(err)
		}
	}
	if p.rootFS == "" {
		// Laid out from the host's /: the private directory and the
		// daemon binary are on the host's trees bound there (or on a
		// tmpfs above them, where gVisor makes their mount points).
		return nil
	}
	for _, d := range []string{filepath.Join(dir, runDir), filepath.Join(dir, "etc"), filepath.Join(dir, homeDir), filepath.Dir(agentd)} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fail(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, agentd), nil, 0o755); err != nil {
		return fail(err)
	}
	return nil
}

// unmountNullNetNS unmounts the empty network namespace runsc
// --network=none binds into its state root (every bind, should runs have
// raced), so that the root can be removed.
func unmountNullNetNS(stateRoot string) {
	path := filepath.Join(stateRoot, "null-netns")
	for range 64 {
		if unix.Unmount(path, unix.MNT_DETACH) != nil {
			return
		}
	}
}

// sandboxMarkers are the strings whose presence in a process's command
// line makes it a process of the sandbox in dir: its socket (the daemon's
// argv, plain or under bubblewrap) or, under gVisor, runsc's state root.
func sandboxMarkers(dir string) [][]byte {
	return [][]byte{[]byte(filepath.Join(dir, runDir, socketName)), []byte(gvisorMarker(dir))}
}

// hasMarker reports whether cmdline carries one of markers.
func hasMarker(cmdline []byte, markers [][]byte) bool {
	for _, m := range markers {
		if bytes.Contains(cmdline, m) {
			return true
		}
	}
	return false
}

// errNoRunsc says how to get runsc.
var errNoRunsc = errors.New("runsc (gVisor) is neither Config.Runsc nor on PATH; gVisor builds from the Go module proxy: " +
	"`CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@go` (internal/testing/testservers/runsc pins a pseudo-version of that branch)")
