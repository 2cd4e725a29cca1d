package local

// One workspace path on every provider: an isolated sandbox (bubblewrap or
// gVisor) sees its workspace at the manifest's root (manifest.DefaultRoot,
// /workspace, unless the manifest sets `root`), as a Docker or Kubernetes
// sandbox does, never at its host path (<state dir>/<id>/workspace). The
// host directory is bound there, and the daemon is told that path
// (--workspace): processes start there, and Info, ListDir, Stat, patches
// and error messages name it. The harness's own host-side steps (disk
// caps, snapshots of a paused sandbox, removal) keep using the host path.
// A plain sandbox (IsolationNone) has no mount namespace: it sees the
// host path, the only one there is.
//
// The mount point: when every directory of the root exists on the host
// (and none is a symbolic link), the host's / is bound read-only as
// before and the workspace bound over the root. Otherwise (the usual
// /workspace) the sandbox's / is the wrapper's own empty root with the
// host's top-level entries bound read-only on it (rootLayout, as for a
// root file system of the sandboxes' own), the directories on the way to
// the root recreated, so that the mount point can be made there; it is
// made read-only once set up. A root file system of the sandboxes' own
// (Config.RootFS) is laid out so already: the root is one more path it
// keeps.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// reservedRoots are the paths an isolated sandbox makes of its own: a
// workspace root may be none of them, nor lie below one.
var reservedRoots = []string{"/proc", "/dev", "/sys", "/etc", "/run", "/home"}

// sandboxRoot returns where the sandbox of a session with manifest m (nil:
// the defaults) sees its workspace: the manifest's root for an isolated
// sandbox, "" (the host path) for a plain one. A root the sandbox cannot
// have is refused (compute.ErrInvalidArgument) without naming a host path.
func (p *Provider) sandboxRoot(m *manifest.Manifest) (string, error) {
	if !p.Isolated() {
		return "", nil
	}
	root := manifest.DefaultRoot
	if m != nil {
		root = m.WorkspaceRoot()
	}
	refuse := func(why string) (string, error) {
		return "", fmt.Errorf("%w: workspace root %q: %s; choose another (the default is %s)", compute.ErrInvalidArgument, root, why, manifest.DefaultRoot)
	}
	if !filepath.IsAbs(root) || filepath.Clean(root) != root || root == "/" {
		return refuse("not a clean absolute path below /")
	}
	for _, r := range reservedRoots {
		if root == r || below(root, r) {
			return refuse(fmt.Sprintf("%s is the sandbox's own", r))
		}
	}
	if root == "/tmp" {
		return refuse("/tmp is the sandbox's private temporary directory")
	}
	for what, path := range map[string]string{"the sandbox's private directories": p.cfg.StateDir, "the sandbox daemon": p.cfg.AgentdPath} {
		if root == path || below(path, root) || below(root, path) {
			return refuse("a workspace there would cover " + what)
		}
	}
	return root, nil
}

// below reports whether path lies strictly below dir (both clean and
// absolute).
func below(path, dir string) bool {
	return strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// hostMountPoint reports whether root can be mounted on a read-only bind
// of the host's /: every directory on the way to it, itself included,
// exists on the host and is no symbolic link.
func hostMountPoint(root string) bool {
	for d := root; d != "/"; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// layoutBase returns the tree an isolated sandbox's / is laid out from on
// an empty root (rootLayout) for a workspace at root: the sandbox root
// file system, or the host's / when root has no mount point there; ""
// when the host's / is bound whole.
func (p *Provider) layoutBase(root string) string {
	switch {
	case p.rootFS != "":
		return p.rootFS
	case hostMountPoint(root):
		return ""
	default:
		return "/"
	}
}

// layoutKeep are the paths a sandbox laid out on an empty root needs made
// there (see rootLayout): on the sandbox root file system, the private
// directory in dir and the daemon binary agentd as well as the workspace
// root; on the host's own, only the root (the rest is the host's).
func (p *Provider) layoutKeep(dir, agentd, root string) []string {
	if p.rootFS == "" {
		return []string{root}
	}
	return []string{dir, agentd, root}
}
