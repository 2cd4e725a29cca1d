package archive

import (
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// tree is a workspace opened for a restore or a recovery: the os.Root the
// extraction works through, and the descriptors of the
// directories the swap and the journal work in. Every directory is reached
// from the root one component at a time with O_NOFOLLOW, so a symbolic
// link a sandbox process planted where a directory was is refused (ELOOP
// or ENOTDIR), never followed, not even to another place inside the root.
type tree struct {
	root *os.Root
	top  *os.File            // the root directory itself
	dirs map[string]*os.File // by root-relative path, "" excluded
	// touched are the directories whose entries changed since the last
	// sync (renames, mkdirs), to fsync before the journal moves on.
	touched map[string]bool
}

// openTree opens the directory descriptors of the workspace rt.
func openTree(rt *os.Root) (*tree, error) {
	top, err := rt.Open(".")
	if err != nil {
		return nil, err
	}
	return &tree{root: rt, top: top, dirs: make(map[string]*os.File), touched: make(map[string]bool)}, nil
}

// close releases every descriptor (not the os.Root).
func (t *tree) close() {
	for _, f := range t.dirs {
		_ = f.Close()
	}
	t.dirs = nil
	_ = t.top.Close()
}

// dir returns a descriptor of the directory rel ("" for the root), kept
// until close or forget. Each component is opened without following
// symbolic links.
func (t *tree) dir(rel string) (int, error) {
	if rel == "" {
		return int(t.top.Fd()), nil
	}
	if f, ok := t.dirs[rel]; ok {
		return int(f.Fd()), nil
	}
	parent, name := split(rel)
	pfd, err := t.dir(parent)
	if err != nil {
		return -1, err
	}
	fd, err := openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, err
	}
	t.dirs[rel] = os.NewFile(uintptr(fd), rel)
	return fd, nil
}

// forget closes the cached descriptors of rel and everything below it
// (after they were removed, or found untrustworthy).
func (t *tree) forget(rel string) {
	for p, f := range t.dirs {
		if p == rel || strings.HasPrefix(p, rel+"/") {
			_ = f.Close()
			delete(t.dirs, p)
		}
	}
}

// mkdirs makes sure the directory rel exists, creating the missing
// components with mode perm (without following symbolic links: a
// component that is not a directory is an error).
func (t *tree) mkdirs(rel string, perm uint32) error {
	if rel == "" {
		return nil
	}
	if _, err := t.dir(rel); !errors.Is(err, unix.ENOENT) {
		return err
	}
	parent, name := split(rel)
	if err := t.mkdirs(parent, perm); err != nil {
		return err
	}
	pfd, err := t.dir(parent)
	if err != nil {
		return err
	}
	if err := ignoreEINTR(func() error { return unix.Mkdirat(pfd, name, perm) }); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	t.touched[parent] = true
	_, err = t.dir(rel)
	return err
}

// list returns the names in the directory rel, read through a fresh
// descriptor (the cached one's offset is left alone).
func (t *tree) list(rel string) ([]string, error) {
	fd, err := t.dir(rel)
	if err != nil {
		return nil, err
	}
	lfd, err := openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(lfd), rel)
	defer f.Close()
	return f.Readdirnames(-1)
}

// listIfExists is list, with a missing directory listed as empty.
func (t *tree) listIfExists(rel string) ([]string, error) {
	names, err := t.list(rel)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	return names, err
}

// sync fsyncs the directories touched since the last sync, so that the
// renames and mkdirs a phase made are durable before the journal records
// the next phase.
func (t *tree) sync() error {
	for rel := range t.touched {
		fd, err := t.dir(rel)
		if errors.Is(err, unix.ENOENT) { // removed since (a cleanup)
			delete(t.touched, rel)
			continue
		}
		if err != nil {
			return err
		}
		if err := ignoreEINTR(func() error { return unix.Fsync(fd) }); err != nil {
			return err
		}
		delete(t.touched, rel)
	}
	return nil
}

// remove removes rel and everything below it, like os.RemoveAll but never
// descending into another mount: a mount point found below rel is left in
// place, with the directories leading to it, and reported (errMountPoint).
// Directories without owner write or search permission are made
// accessible first (the process may not be root). rel's parent is reached
// without following symbolic links. A missing rel is not an error.
func (t *tree) remove(rel string) error {
	defer t.forget(rel)
	parent, base := split(rel)
	pfd, err := t.dir(parent)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	mnt, err := statMount(pfd, "")
	if err != nil {
		return err
	}
	return removeAt(pfd, base, mnt)
}
