package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Limits on the paths the resolver accepts.
const (
	// MaxPathBytes is the longest path accepted (PATH_MAX).
	MaxPathBytes = 4096
	// MaxNameBytes is the longest path component accepted (NAME_MAX).
	MaxNameBytes = 255
	// maxSymlinks bounds the links followed while resolving one path
	// (Linux's MAXSYMLINKS).
	maxSymlinks = 40
)

// Location is a resolved path.
type Location struct {
	// Path is the absolute path inside the sandbox, with symbolic links
	// resolved (the final one only when asked to follow it).
	Path string
	// RootPath is the absolute path of the workspace root or grant holding
	// Path, and Rel is Path relative to it ("." for the root itself).
	RootPath string
	Rel      string
	// Root is the confined handle for RootPath. It belongs to the Workspace:
	// do not close it. It is closed when the grant is removed.
	Root *os.Root
	// ReadOnly is set when Path lies in a read-only grant.
	ReadOnly bool
	// Grant is set when Path lies in a grant rather than the workspace.
	Grant bool
}

// loc is a resolved path: a mount and a path relative to it.
type loc struct {
	m   *mount
	rel string // clean, relative, "." for the mount root
}

func (l loc) abs() string {
	if l.rel == "." {
		return l.m.abs
	}
	return l.m.abs + "/" + l.rel
}

func (l loc) isRoot() bool { return l.rel == "." }

func (l loc) dir() string { return filepath.Dir(l.rel) }

func (l loc) base() string { return filepath.Base(l.rel) }

// writable refuses changes in a read-only grant, and to the daemon's own
// entries at the workspace root (ReservedPrefix: a restore's journal, stage
// and backup), which no request may create, change, move or remove.
func (l loc) writable() error {
	if l.m.readOnly {
		return errorf(errkind.ErrReadOnly, "the path lies in a read-only grant")
	}
	if !l.m.grant && IsReservedPath(l.rel) {
		return errorf(errkind.ErrPermissionDenied, "names starting with %q at the workspace root are the daemon's own", ReservedPrefix)
	}
	return nil
}

// location exports l.
func (l loc) location() Location {
	return Location{Path: l.abs(), RootPath: l.m.abs, Rel: l.rel, Root: l.m.root, ReadOnly: l.m.readOnly, Grant: l.m.grant}
}

// openParent opens the directory holding l (O_PATH, through the mount's
// os.Root) and returns it with l's final name. The pair is how operations
// os.Root lacks (renameat2, openat with O_NOFOLLOW, fstatat) stay confined:
// the directory was reached through the root, and the name has no slash.
func (l loc) openParent() (*os.File, string, error) {
	if l.isRoot() {
		return nil, "", errorf(errkind.ErrInvalidArgument, "the operation does not apply to a workspace or grant root")
	}
	d, err := l.m.root.OpenFile(l.dir(), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", err
	}
	return d, l.base(), nil
}

// Resolve resolves path for the run_as user u (nil: the daemon's identity)
// and returns where it lies. followFinal decides whether a symbolic link in
// the final component is followed. Components are looked up with u's
// permissions. The path need not exist: missing components are kept as
// given.
func (w *Workspace) Resolve(ctx context.Context, u *userdb.User, path string, followFinal bool) (Location, error) {
	var out Location
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, followFinal)
		out = l.location()
		return err
	})
	return out, pathErr("resolve", path, err)
}

// ResolveDir resolves the working directory of a process started for u and
// returns its absolute path, with symbolic links resolved so that the kernel
// reaches the directory that was checked. It must be an existing directory
// that u may enter. An empty path means the workspace root.
//
// The check does not confine the process itself: it runs as u and may
// change directory wherever u may.
func (w *Workspace) ResolveDir(ctx context.Context, u *userdb.User, path string) (string, error) {
	if path == "" {
		path = "."
	}
	if path == "." && w.isSelf(u) {
		// The root of the workspace, for the daemon itself: nothing to
		// resolve and nothing to check (process starts mostly ask this).
		if l, err := w.locate(path, true); err == nil && l.isRoot() {
			return l.abs(), nil
		}
	}
	var out string
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, true)
		if err != nil {
			return err
		}
		d, err := l.m.root.OpenFile(l.rel, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer d.Close()
		// Looking up "." needs search permission on the directory itself.
		fd, err := unix.Openat(int(d.Fd()), ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		_ = unix.Close(fd)
		out = l.abs()
		return nil
	})
	return out, pathErr("resolve", path, err)
}

// locate resolves the caller's path p against the current mounts.
func (w *Workspace) locate(p string, followLast bool) (loc, error) {
	abs, err := w.inputPath(p)
	if err != nil {
		return loc{}, err
	}
	return w.mounts.Load().walk(abs, followLast)
}

// inputPath validates a caller's path and returns it as a clean absolute
// path. ".." is resolved lexically here: a relative path must stay inside
// the workspace, an absolute one is judged after cleaning.
func (w *Workspace) inputPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errorf(errkind.ErrInvalidArgument, "empty path")
	case strings.IndexByte(p, 0) >= 0:
		return "", errorf(errkind.ErrInvalidArgument, "path contains a NUL byte")
	case len(p) > MaxPathBytes:
		return "", errorf(errkind.ErrInvalidArgument, "path is longer than %d bytes", MaxPathBytes)
	}
	for _, c := range strings.Split(p, "/") {
		if len(c) > MaxNameBytes {
			return "", errorf(errkind.ErrInvalidArgument, "a path component is longer than %d bytes", MaxNameBytes)
		}
	}
	if filepath.IsAbs(p) {
		return filepath.Clean(p), nil
	}
	if !filepath.IsLocal(p) {
		return "", errorf(errkind.ErrPathEscape, "the relative path leaves the workspace")
	}
	return filepath.Join(w.ws.abs, p), nil
}

// walk resolves the clean absolute path abs component by component, as the
// kernel would, following symbolic links (the last one only if followLast)
// but looking only inside mounts, each through its os.Root. Components
// outside every mount (such as "/" on the way to a grant) are passed
// lexically; the final path must lie in a mount.
func (ms *mounts) walk(abs string, followLast bool) (loc, error) {
	comps := splitPath(abs)
	var done []string // resolved components below "/"
	links := 0
	for len(comps) > 0 {
		c := comps[0]
		comps = comps[1:]
		if c == ".." {
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		next := append(done[:len(done):len(done)], c)
		m, rel := ms.find("/" + strings.Join(next, "/"))
		if m == nil || rel == "." || (len(comps) == 0 && !followLast) {
			done = next
			continue
		}
		fi, err := m.root.Lstat(rel)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return loc{}, err
			}
			// Nothing below a missing component exists either. Keep the
			// rest as given, unless it climbs back out of the missing
			// directory, which the kernel would refuse.
			if slices.Contains(comps, "..") {
				return loc{}, syscall.ENOENT
			}
			done = append(next, comps...)
			break
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			links++
			if links > maxSymlinks {
				return loc{}, syscall.ELOOP
			}
			target, err := m.root.Readlink(rel)
			if errors.Is(err, syscall.EINVAL) {
				// No longer a link: it changed since the lstat. Look again
				// (the link count bounds the retries).
				comps = append([]string{c}, comps...)
				continue
			}
			if err != nil {
				return loc{}, err
			}
			if target == "" {
				return loc{}, syscall.ENOENT
			}
			if filepath.IsAbs(target) {
				done = nil
			}
			comps = append(splitPath(target), comps...)
		case !fi.IsDir() && len(comps) > 0:
			return loc{}, syscall.ENOTDIR
		default:
			done = next
		}
	}
	m, rel := ms.find("/" + strings.Join(done, "/"))
	if m == nil {
		return loc{}, errorf(errkind.ErrPathEscape, "the path resolves outside the workspace and its grants")
	}
	return loc{m: m, rel: rel}, nil
}

// splitPath splits p into its components, dropping empty ones and ".".
func splitPath(p string) []string {
	parts := strings.Split(p, "/")
	out := parts[:0]
	for _, s := range parts {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}
