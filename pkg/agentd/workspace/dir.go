package workspace

import (
	"context"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Page sizes for ListDir.
const (
	DefaultPageSize = 1000
	MaxPageSize     = 10000
)

// DefaultDirMode is the mode of a directory made without a Mode.
const DefaultDirMode fs.FileMode = 0o755

// ListOptions selects one page of a directory listing.
type ListOptions struct {
	// PageToken is the NextPageToken of the previous page ("" for the
	// first page).
	PageToken string
	// PageSize is the most entries returned (0: DefaultPageSize; at most
	// MaxPageSize).
	PageSize int
}

// ListResult is one page of a directory listing.
type ListResult struct {
	// Entries are sorted by name, byte-wise. Symbolic links are described
	// themselves (lstat semantics).
	Entries []FileInfo
	// NextPageToken continues the listing; "" when this page is the last.
	NextPageToken string
	// Total is the number of entries in the directory when the page was
	// read.
	Total int
}

// ListDir lists the directory at path (links followed) as user u, one page
// at a time. Pages are keyed by the last name returned, so entries added or
// removed between pages neither repeat nor shift the listing. The
// workspace's own temporary files (TempPrefix) are not listed.
func (w *Workspace) ListDir(ctx context.Context, u *userdb.User, path string, opts ListOptions) (ListResult, error) {
	size := opts.PageSize
	switch {
	case size < 0:
		return ListResult{}, pathErr("list", path, errorf(errkind.ErrInvalidArgument, "negative page size"))
	case size == 0:
		size = DefaultPageSize
	case size > MaxPageSize:
		size = MaxPageSize
	}
	var after string
	if opts.PageToken != "" {
		b, err := base64.RawURLEncoding.DecodeString(opts.PageToken)
		if err != nil || len(b) == 0 {
			return ListResult{}, pathErr("list", path, errorf(errkind.ErrInvalidArgument, "malformed page token"))
		}
		after = string(b)
	}
	var res ListResult
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, true)
		if err != nil {
			return err
		}
		d, err := l.m.root.OpenFile(l.rel, os.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer d.Close()
		all, err := d.Readdirnames(-1)
		if err != nil {
			return err
		}
		names := slices.DeleteFunc(all, IsTempName)
		sort.Strings(names)
		res.Total = len(names)
		start := 0
		if after != "" {
			start = sort.SearchStrings(names, after)
			if start < len(names) && names[start] == after {
				start++
			}
		}
		prefix := strings.TrimSuffix(path, "/") + "/"
		if path == "." || path == "./" {
			prefix = ""
		}
		for _, name := range names[start:] {
			if len(res.Entries) == size {
				res.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(res.Entries[len(res.Entries)-1].Name))
				break
			}
			st, err := fstatat(d, name)
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			if err != nil {
				return err
			}
			fi := statInfo(name, &st)
			fi.Path = prefix + name
			if fi.Type == TypeSymlink {
				if fi.LinkTarget, err = readlinkat(d, name); err != nil && !errors.Is(err, unix.ENOENT) {
					return err
				}
			}
			res.Entries = append(res.Entries, fi)
		}
		return nil
	})
	if err != nil {
		return ListResult{}, pathErr("list", path, err)
	}
	n := newNamer(w.users)
	for i := range res.Entries {
		n.fill(&res.Entries[i])
	}
	return res, nil
}

// readlinkat reads the symbolic link name in d.
func readlinkat(d *os.File, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(int(d.Fd()), name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// MakeDir creates the directory path as user u with the permission bits
// mode (0: DefaultDirMode), applied exactly. With parents, missing parents
// are created (DefaultDirMode, subject to the umask) and an existing
// directory is not an error; without, an existing entry is
// errkind.ErrAlreadyExists. A symbolic link in the final component is not
// followed.
func (w *Workspace) MakeDir(ctx context.Context, u *userdb.User, path string, mode fs.FileMode, parents bool) error {
	if mode&^fs.ModePerm != 0 {
		return pathErr("mkdir", path, errorf(errkind.ErrInvalidArgument, "mode %v: only permission bits may be set", mode))
	}
	if mode == 0 {
		mode = DefaultDirMode
	}
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, false)
		if err != nil {
			return err
		}
		if err := l.writable(); err != nil {
			return err
		}
		if l.isRoot() {
			if parents {
				return nil
			}
			return syscall.EEXIST
		}
		if parents && l.dir() != "." {
			if err := l.m.root.MkdirAll(l.dir(), DefaultDirMode); err != nil {
				return err
			}
		}
		d, name, err := l.openParent()
		if err != nil {
			return err
		}
		defer d.Close()
		err = ignoringEINTR(func() error { return unix.Mkdirat(int(d.Fd()), name, 0o700) })
		if errors.Is(err, unix.EEXIST) && parents {
			if fi, serr := l.m.root.Stat(l.rel); serr == nil && fi.IsDir() {
				return nil
			}
		}
		if err != nil {
			return err
		}
		return chmodDirAt(d, name, mode)
	})
	return pathErr("mkdir", path, err)
}

// chmodDirAt sets the mode of the directory name in d through a descriptor
// (never through a name that could have been swapped for a link).
func chmodDirAt(d *os.File, name string, mode fs.FileMode) error {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, uint32(mode))
}
