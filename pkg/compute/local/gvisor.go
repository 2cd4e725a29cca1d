package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// gVisor isolation: the daemon runs as the init of a gVisor sandbox
// (`runsc run` of an OCI bundle written into the sandbox's private
// directory), so every system call of the sandbox's processes is served
// by gVisor's user-space kernel, not the host's. The sandbox sees the
// same file system as under bubblewrap (the host's read-only, its own
// workspace, socket directory, accounts and homes writable, the rest of
// the state directory hidden) and, by default, no network but loopback.
//
// The daemon's socket lives in the bound run directory: runsc's
// --host-uds=create lets the daemon create it as a host socket the
// harness dials; with egress control, --host-uds=all also lets the
// daemon's relay connect to the harness's proxy socket there. /run is a
// fresh tmpfs, so the host's own daemons' sockets (Docker's, for one)
// are not reachable through the read-only root. runsc is started with
// --ignore-cgroups: the sandbox stays in the cgroup the provider starts
// it in (see cgroup.go), where one exists.

// Accounts: gVisor does not implement setfsuid and setfsgid (they fail
// with ENOSYS, gvisor.dev/issue/260), which sandbox-agentd uses to act as
// a run_as user on files, so a gVisor sandbox cannot switch accounts.
// Instead, a root harness runs the daemon itself, and so everything it
// runs, as an unprivileged account of the sandbox's own (a uid drawn as
// DefaultRunAs draws one, kept in the private directory so that a
// replacement sandbox keeps it), with no capabilities; its directories
// are chowned to it on the host. A manifest that names run_as root gets a
// root daemon (inside gVisor, with the daemon's usual capabilities), and
// one that names another account is refused. A non-root harness runs
// runsc rootless: root inside maps to the harness's own uid.

// gvisorDir is where, in a sandbox's private directory, runsc keeps its
// bundle, its state and the sandbox's /etc view; the sandbox never sees it.
const gvisorDir = "gvisor"

// gvisorPaths are a sandbox's runsc directories.
type gvisorPaths struct {
	root    string // runsc --root: container state
	bundle  string // config.json
	rootfs  string // an empty directory: the OCI root, with / bound over it
	etcView string // the sandbox's /etc: symbolic links (see gvisorEtc)
	uid     string // the sandbox account's uid (a root harness's)
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

// gvisorAccount is who the daemon of the sandbox in dir runs as inside
// gVisor (see Accounts above): root (with daemonCapabilities) for a
// non-root harness or a manifest whose run_as is root, else the sandbox's
// own unprivileged account, made on first use and recorded in dir.
func gvisorAccount(dir string, m *manifest.Manifest) (uid uint32, root bool, err error) {
	runAs := ""
	if m != nil {
		runAs = m.RunAs
	}
	g := gvisorPathsOf(dir)
	if os.Geteuid() != 0 || runAs == "root" {
		if err := os.Remove(g.uid); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, false, fmt.Errorf("gvisor: sandbox account: %w", err)
		}
		return 0, true, nil
	}
	if runAs != "" {
		return 0, false, fmt.Errorf("%w: gVisor sandboxes cannot run as account %q: gVisor lacks setfsuid/setfsgid (gvisor.dev/issue/260), "+
			"which sandbox-agentd uses to act as a user; leave run_as unset (the sandbox's own unprivileged account) or use bubblewrap isolation",
			compute.ErrFailedPrecondition, runAs)
	}
	if data, err := os.ReadFile(g.uid); err == nil {
		n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
		if err != nil || n < minSandboxUID || n >= maxSandboxUID {
			return 0, false, fmt.Errorf("gvisor: bad sandbox account record %s", g.uid)
		}
		return uint32(n), false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, false, fmt.Errorf("gvisor: sandbox account: %w", err)
	}
	if uid, err = randomUID(); err != nil {
		return 0, false, err
	}
	if err := os.MkdirAll(filepath.Dir(g.uid), 0o700); err != nil {
		return 0, false, fmt.Errorf("gvisor: %w", err)
	}
	if err := writeFileAtomic(g.uid, []byte(strconv.FormatUint(uint64(uid), 10)), 0o600); err != nil {
		return 0, false, fmt.Errorf("gvisor: %w", err)
	}
	return uid, false, nil
}

// gvisorOwner returns the uid of the sandbox account recorded in dir, and
// whether there is one.
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

// chownTree gives every file below root (not following symbolic links)
// to uid:uid.
func chownTree(root string, uid int) error {
	return filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, uid)
	})
}

// gvisorPrepare writes the OCI bundle that runs daemonArgv in the sandbox
// in dir as uid (or root: see gvisorAccount), with a fresh /etc view,
// gives the sandbox's directories to its account, and drops the state a dead runsc left (the caller made sure no
// daemon of dir runs).
func (p *Provider) gvisorPrepare(dir string, uid uint32, root bool, daemonArgv []string) error {
	g := gvisorPathsOf(dir)
	if !root {
		for _, d := range []string{filepath.Join(dir, "workspace"), filepath.Join(dir, runDir), filepath.Join(dir, "etc"), filepath.Join(dir, homeDir)} {
			if err := chownTree(d, int(uid)); err != nil {
				return fmt.Errorf("gvisor: give the sandbox account its files: %w", err)
			}
		}
	}
	unmountNullNetNS(g.root)
	if err := os.RemoveAll(g.root); err != nil {
		return fmt.Errorf("gvisor: drop stale runsc state: %w", err)
	}
	for _, d := range []string{g.root, g.bundle, g.rootfs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("gvisor: %w", err)
		}
	}
	if err := gvisorEtc(g.etcView, dir); err != nil {
		return err
	}
	spec := p.gvisorSpec(dir, daemonArgv, uid, root)
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
// the host's /etc to the same entry below /etc/.host (where the host's
// /etc is bound read-only), and passwd and group linked to the sandbox's
// private copies in dir/etc, which the daemon edits by rename (as
// privateEtc does for bubblewrap, with links made on the host since an
// OCI spec cannot make them).
func gvisorEtc(view, dir string) error {
	if err := os.RemoveAll(view); err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(view, hostEtc), 0o755); err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	if err := os.Chmod(view, 0o755); err != nil {
		return fmt.Errorf("gvisor: /etc view: %w", err)
	}
	entries, err := os.ReadDir("/etc")
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
			if target, err = os.Readlink(filepath.Join("/etc", name)); err != nil {
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
// uid, with no capabilities, or, with root, as root of the sandbox (inside
// gVisor) with the capabilities the daemon needs and no more.
func (p *Provider) gvisorSpec(dir string, daemonArgv []string, uid uint32, root bool) ociSpec {
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
	// read-only), then gVisor's own /proc, /dev and /sys.
	mounts := []ociMount{
		bind("/", "/", false),
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		tmpfs("/tmp", "1777"),
		tmpfs("/run", "0755"),
	}
	// As under bubblewrap: the state directory hidden from its highest
	// directory that needs hiding, then the sandbox's own parts.
	if top := hiddenTop(p.cfg.StateDir, dir); top != "/tmp" {
		mounts = append(mounts, tmpfs(top, "0711"))
	}
	home := filepath.Join(dir, homeDir)
	for _, d := range []string{filepath.Join(dir, "workspace"), filepath.Join(dir, runDir), filepath.Join(dir, "etc"), home} {
		mounts = append(mounts, bind(d, d, true))
	}
	if fi, err := os.Stat("/home"); err == nil && fi.IsDir() {
		mounts = append(mounts, bind(home, "/home", true))
	}
	mounts = append(mounts, bind(g.etcView, "/etc", false), bind("/etc", "/etc/"+hostEtc, false),
		// Last, after every tmpfs: the daemon binary may live below /tmp
		// or below the hidden directory.
		bind(daemonArgv[0], daemonArgv[0], false))
	namespaces := []ociNamespace{{"pid"}, {"ipc"}, {"uts"}, {"mount"}}
	if !p.cfg.Network {
		namespaces = append(namespaces, ociNamespace{"network"})
	}
	var rlimits []ociRlimit
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err == nil {
		rlimits = append(rlimits, ociRlimit{Type: "RLIMIT_NOFILE", Hard: nofile.Max, Soft: nofile.Max})
	}
	caps := []string{}
	if root {
		caps = append(caps, daemonCapabilities...)
		uid = 0
	}
	return ociSpec{
		Version: "1.0.2",
		Process: ociProcess{
			User:         ociUser{UID: uid, GID: uid},
			Args:         daemonArgv,
			Env:          []string{"PATH=" + os.Getenv("PATH")}, // as the plain and bubblewrap daemons get
			Cwd:          "/",
			Capabilities: ociCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:      rlimits,
			// No set-uid escalation inside; the daemon changes users by
			// its own capabilities.
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: g.rootfs, Readonly: true},
		Hostname: "sandbox",
		Mounts:   mounts,
		Linux:    ociLinux{Namespaces: namespaces},
	}
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
	"`CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@go` (internal/testservers/runsc pins a pseudo-version of that branch)")
