package archive

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"unicode/utf8"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// kind is the type of a workspace entry or archive member.
type kind uint8

const (
	kindDir kind = iota + 1
	kindFile
	kindSymlink
	kindHardLink
)

// entry is one workspace entry met by the walk.
type entry struct {
	rel  string // workspace-relative, slash-separated
	kind kind
	// st is the lstat of the entry; for a regular file, the fstat of the
	// descriptor it was opened with.
	st unix.Stat_t
	// target is a symbolic link's target, or for a hard link the name under
	// which the file was met first.
	target string
	// file is a kindFile entry opened for reading.
	file *rawFile
}

// fileID identifies an inode.
type fileID struct{ dev, ino uint64 }

// walker visits the entries of a workspace in archive order: depth first,
// each directory before its contents, siblings in byte-wise order.
type walker struct {
	ctx     context.Context
	op      string
	exclude excludeSet
	log     *zap.Logger
	visit   func(*entry) error
	links   map[fileID]string
	skipped int64
}

// walk opens root with os.OpenRoot and visits everything below it. Every
// entry is reached through a directory descriptor obtained from that root
// and one name, without following symbolic links.
func (w *walker) walk(root string) error {
	if w.log == nil {
		w.log = zap.NewNop()
	}
	w.links = make(map[fileID]string)
	rt, err := os.OpenRoot(root)
	if err != nil {
		return pathErr(w.op, ".", err)
	}
	defer rt.Close()
	dir, err := rt.Open(".")
	if err != nil {
		return pathErr(w.op, ".", err)
	}
	defer dir.Close()
	return w.walkDir(dir, "")
}

// walkDir visits the contents of the open directory dir, at rel.
func (w *walker) walkDir(dir *os.File, rel string) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return pathErr(w.op, orDot(rel), err)
	}
	slices.Sort(names)
	fd := int(dir.Fd())
	for _, name := range names {
		p := join(rel, name)
		if err := w.ctx.Err(); err != nil {
			return pathErr(w.op, orDot(rel), err)
		}
		if skipName(rel, name) || w.exclude.has(p) {
			continue
		}
		if err := w.walkEntry(fd, name, p); err != nil {
			return err
		}
	}
	return nil
}

// walkEntry visits the entry name of the directory dirfd, at p.
func (w *walker) walkEntry(dirfd int, name, p string) error {
	var st unix.Stat_t
	if err := ignoreEINTR(func() error { return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
		if errors.Is(err, unix.ENOENT) { // removed since the directory was read
			return nil
		}
		return pathErr(w.op, p, err)
	}
	if !utf8.ValidString(p) {
		w.skip(p, "name is not valid UTF-8")
		return nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := w.visit(&entry{rel: p, kind: kindDir, st: st}); err != nil {
			return err
		}
		cfd, err := openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			if changedMeanwhile(err) {
				w.log.Debug("directory changed while archiving", zap.String("path", p))
				return nil
			}
			return pathErr(w.op, p, err)
		}
		child := os.NewFile(uintptr(cfd), p)
		defer child.Close()
		return w.walkDir(child, p)
	case unix.S_IFREG:
		return w.walkFile(dirfd, name, p)
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, name, st.Size)
		if err != nil {
			if changedMeanwhile(err) {
				return nil
			}
			return pathErr(w.op, p, err)
		}
		if !utf8.ValidString(target) {
			w.skip(p, "symbolic link target is not valid UTF-8")
			return nil
		}
		return w.visit(&entry{rel: p, kind: kindSymlink, st: st, target: target})
	default:
		w.skip(p, "not a regular file, directory or symbolic link")
		return nil
	}
}

// walkFile opens and visits the regular file name of dirfd, at p, or a
// hard link when its inode was met before.
func (w *walker) walkFile(dirfd int, name, p string) error {
	// O_NONBLOCK: should the name have become a FIFO since the lstat, the
	// open must not wait for a writer.
	fd, err := openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		if changedMeanwhile(err) {
			return nil
		}
		return pathErr(w.op, p, err)
	}
	f := &rawFile{fd: fd}
	defer f.Close()
	e := &entry{rel: p, kind: kindFile, file: f}
	if err := unix.Fstat(fd, &e.st); err != nil {
		return pathErr(w.op, p, err)
	}
	if e.st.Mode&unix.S_IFMT != unix.S_IFREG {
		w.skip(p, "not a regular file")
		return nil
	}
	if e.st.Nlink > 1 {
		id := fileID{dev: uint64(e.st.Dev), ino: e.st.Ino}
		if first, ok := w.links[id]; ok {
			e.kind, e.target, e.file = kindHardLink, first, nil
		} else {
			w.links[id] = p
		}
	}
	return w.visit(e)
}

// skip counts an entry that cannot be archived.
func (w *walker) skip(p, why string) {
	w.skipped++
	w.log.Debug("entry not archived", zap.String("path", shown(p)), zap.String("reason", why))
}

// changedMeanwhile reports whether err means that an entry was removed or
// replaced by another type between the directory read and its use.
func changedMeanwhile(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)
}

// openat opens name in dirfd with O_CLOEXEC, retrying on EINTR.
func openat(dirfd int, name string, flags int, perm uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags|unix.O_CLOEXEC, perm)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// readlinkat reads the target of the symbolic link name in dirfd.
func readlinkat(dirfd int, name string, size int64) (string, error) {
	n := int(size) + 1
	if n < 128 || n > 1<<20 {
		n = 128
	}
	for {
		buf := make([]byte, n)
		got, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if got < len(buf) {
			return string(buf[:got]), nil
		}
		if n >= 1<<20 {
			return "", unix.ENAMETOOLONG
		}
		n *= 2
	}
}

// ignoreEINTR runs f until it fails with something other than EINTR.
func ignoreEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// rawFile reads a descriptor directly, without the runtime poller (regular
// files cannot be polled anyway).
type rawFile struct{ fd int }

// Read implements io.Reader.
func (f *rawFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := unix.Read(f.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		default:
			return n, nil
		}
	}
}

// Close closes the descriptor once.
func (f *rawFile) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return err
}
