package local

// A root file system of the sandboxes' own (Config.RootFS): the tree
// `make rootfs` writes (images/build.sh rootfs: the small sandbox image's
// root file system), shared read-only by every sandbox, instead of the
// host's /. Under bubblewrap the sandbox's / is bwrap's own tmpfs (made
// read-only once set up) with every top-level entry of the tree bound
// read-only on it, except along the few paths the sandbox needs at their
// host paths (its private directory's parts, the daemon binary) and along
// the workspace root (see wsroot.go): there the tree's directories are
// recreated on the tmpfs and their other entries bound one by one (see
// bwrapArgs.rootFS). So every path the harness and the daemon share
// (socket, accounts, egress socket) is the same inside and out, the
// workspace is where the manifest says, and nothing of the host is
// reachable: not its files, not the state directory's other sandboxes,
// not the harness's own files. Under gVisor the same layout is bound on an
// OCI root holding the mount points (see gvisorRoot and gvisorSpec). A
// sandbox on the host's files whose workspace root has no mount point on
// the host is laid out the same way from the host's /.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// rootFSHint says how to make a root file system.
const rootFSHint = "write one with `make rootfs` (bin/rootfs) or `images/build.sh rootfs DIR` (needs busybox-static, git, wget and ca-certificates)"

// checkRootFS validates Config.RootFS and returns its absolute, resolved
// path: a directory owned by root (or by the harness's user) that neither
// its group nor others may write, as are its top-level entries (a sticky
// one, such as tmp, excepted: sandboxes get a fresh /tmp), with a bin/sh.
func checkRootFS(dir string) (string, error) {
	fail := func(format string, args ...any) (string, error) {
		return "", fmt.Errorf("%w: sandbox root file system %s: %s; %s", compute.ErrFailedPrecondition, dir, fmt.Sprintf(format, args...), rootFSHint)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fail("%v", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return fail("%v", errors.Unwrap(err))
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return fail("%v", err)
	}
	if !fi.IsDir() {
		return fail("not a directory")
	}
	check := func(path string, fi fs.FileInfo) error {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner", path)
		}
		if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("%s is owned by uid %d, not by root", path, st.Uid)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("%s is writable by other users (mode %v)", path, fi.Mode().Perm())
		}
		return nil
	}
	if err := check(abs, fi); err != nil {
		return fail("%v", err)
	}
	entries, err := os.ReadDir(abs)
	if err != nil {
		return fail("%v", err)
	}
	for _, e := range entries {
		efi, err := e.Info()
		if err != nil {
			return fail("%v", err)
		}
		if err := check(filepath.Join(abs, e.Name()), efi); err != nil {
			return fail("%v", err)
		}
	}
	if _, err := os.Lstat(filepath.Join(abs, "bin", "sh")); err != nil {
		return fail("no bin/sh in it")
	}
	return abs, nil
}

// bwrapArgs is a bubblewrap command line being built (after the bwrap
// binary, up to "--"), with the descriptors it names, which bwrap
// inherits as 4, 5, ... in order (the token's is 3).
type bwrapArgs struct {
	args  []string
	files []*os.File
}

// add appends arguments.
func (b *bwrapArgs) add(args ...string) { b.args = append(b.args, args...) }

// inherit adds f to the inherited descriptors and returns its number in
// bwrap.
func (b *bwrapArgs) inherit(f *os.File) int {
	b.files = append(b.files, f)
	return 3 + len(b.files)
}

// bind binds the host path src at dest, read-only with ro. (bwrap looks
// source paths up by name, those of --bind-fd descriptors included: in a
// root harness's sandbox it does so as the sandbox's root, which is no
// host root, so every source must be reachable by any user: New checks the
// state directory and the root file system, and reachableAgentd the
// daemon binary.)
func (b *bwrapArgs) bind(src, dest string, ro bool) {
	if ro {
		b.add("--ro-bind", src, dest)
	} else {
		b.add("--bind", src, dest)
	}
}

// rootEntry is one step of laying a root file system out on an empty
// root (see rootLayout).
type rootEntry struct {
	dest string // the path in the sandbox
	// src is, for a bind, the host path bound (read-only) at dest, and,
	// for a symbolic link, its target; "" for a directory made at dest.
	src  string
	link bool        // a symbolic link
	dir  bool        // a directory: made (src "") or bound
	perm fs.FileMode // a made directory's mode
}

// rootLayout lays the tree at rootfs out as a sandbox's / on an empty
// root: every top-level entry bound read-only (symbolic links recreated),
// except the directories on the way to each path of keep (absolute, clean
// sandbox paths), which are made empty (with the tree's modes) so that the
// path can be created there, and whose other entries are laid out the
// same way, one by one. Entries in the way of a keep path that are not
// directories, and devices, sockets and fifos, are left out. Parents come
// before their children.
func rootLayout(rootfs string, keep []string) ([]rootEntry, error) {
	var out []rootEntry
	var walk func(hostDir, dest string, keep []string) error
	walk = func(hostDir, dest string, keep []string) error {
		entries, err := os.ReadDir(hostDir)
		if err != nil {
			return fmt.Errorf("sandbox root file system: %w", err)
		}
		for _, e := range entries {
			src, at := filepath.Join(hostDir, e.Name()), filepath.Join(dest, e.Name())
			var below []string // the keep paths that go through at
			onPath := false
			for _, k := range keep {
				if k == at {
					onPath = true
				} else if strings.HasPrefix(k, at+"/") {
					onPath = true
					below = append(below, k)
				}
			}
			switch {
			case onPath && (!e.IsDir() || len(below) == 0):
				// Left out: the path itself is made later (a file or
				// directory of the tree in its way is not the sandbox's).
			case onPath:
				fi, err := e.Info()
				if err != nil {
					return fmt.Errorf("sandbox root file system: %w", err)
				}
				out = append(out, rootEntry{dest: at, dir: true, perm: fi.Mode().Perm()})
				if err := walk(src, at, below); err != nil {
					return err
				}
			case e.Type()&fs.ModeSymlink != 0:
				target, err := os.Readlink(src)
				if err != nil {
					return fmt.Errorf("sandbox root file system: %w", err)
				}
				out = append(out, rootEntry{dest: at, src: target, link: true})
			case e.IsDir() || e.Type().IsRegular():
				out = append(out, rootEntry{dest: at, src: src, dir: e.IsDir()})
			}
		}
		return nil
	}
	if err := walk(rootfs, "/", keep); err != nil {
		return nil, err
	}
	return out, nil
}

// rootFS lays the tree at rootfs out as the sandbox's / on bwrap's own
// tmpfs root (see rootLayout).
func (b *bwrapArgs) rootFS(rootfs string, keep []string) error {
	layout, err := rootLayout(rootfs, keep)
	if err != nil {
		return err
	}
	for _, e := range layout {
		switch {
		case e.link:
			b.add("--symlink", e.src, e.dest)
		case e.src == "":
			b.add("--perms", fmt.Sprintf("%04o", e.perm), "--dir", e.dest)
		default:
			b.bind(e.src, e.dest, true)
		}
	}
	return nil
}

// privateEtc gives the sandbox an /etc of its own, on a tmpfs made
// read-only once filled: passwd and group are symbolic links to the
// sandbox's private copies (<dir>/etc, which the daemon edits by rename,
// so a bind of the files themselves would go stale), and every other
// entry is the base /etc's (the host's, or the sandbox root file
// system's), through one read-only bind of it at /etc/.host and a
// symbolic link per entry (a bind per entry costs a mount each: about
// 20 ms more per sandbox). Processes then resolve the sandbox's accounts
// by name, as in a container. Without a root file system of its own, an
// unreadable host /etc leaves the host's in place (read-only).
func (b *bwrapArgs) privateEtc(dir, rootfs string) error {
	base := filepath.Join(rootfs, "etc")
	if rootfs == "" {
		base = "/etc"
	}
	entries, err := os.ReadDir(base)
	if err != nil {
		if rootfs == "" {
			return nil
		}
		return fmt.Errorf("sandbox root file system: %w", err)
	}
	b.add("--perms", "0755", "--tmpfs", "/etc")
	b.bind(base, "/etc/"+hostEtc, true)
	for _, e := range entries {
		name := e.Name()
		if name == "passwd" || name == "group" || name == hostEtc {
			continue
		}
		target := hostEtc + "/" + name
		if e.Type()&fs.ModeSymlink != 0 {
			// The base's own link, so that a relative target still
			// resolves from /etc.
			if target, err = os.Readlink(filepath.Join(base, name)); err != nil {
				continue // gone meanwhile
			}
		}
		b.add("--symlink", target, filepath.Join("/etc", name))
	}
	for _, name := range []string{"passwd", "group"} {
		b.add("--symlink", filepath.Join(dir, "etc", name), filepath.Join("/etc", name))
	}
	b.add("--remount-ro", "/etc")
	return nil
}
