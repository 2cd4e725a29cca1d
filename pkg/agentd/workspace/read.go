package workspace

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// FileReader streams part of a regular file. It reads the file that was
// opened, even if the path is replaced meanwhile (atomic writes rename a new
// file over the old one, so a reader sees one version whole).
type FileReader struct {
	// Info describes the file as opened.
	Info FileInfo
	// Offset is where reading starts.
	Offset int64
	// Length is the most the reader delivers: the size at open time past
	// Offset, capped by the requested limit and Config.MaxReadBytes. A file
	// that shrinks meanwhile delivers less.
	Length int64
	// Truncated is set when Config.MaxReadBytes made Length shorter than
	// what was asked for.
	Truncated bool

	path string
	f    *os.File
	r    *io.SectionReader
}

// Read implements io.Reader.
func (r *FileReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = pathErr("read", r.path, err)
	}
	return n, err
}

// Close closes the file.
func (r *FileReader) Close() error {
	return pathErr("read", r.path, r.f.Close())
}

// ReadFile opens path for user u and returns a reader over limit bytes from
// offset (limit 0: to the end), bounded by Config.MaxReadBytes. Symbolic
// links are followed (inside the workspace and grants only). Directories
// are errkind.ErrIsDirectory; FIFOs, sockets and devices are
// errkind.ErrInvalidArgument, refused without blocking and, unless the path
// is swapped concurrently, without being opened.
func (w *Workspace) ReadFile(ctx context.Context, u *userdb.User, path string, offset, limit int64) (*FileReader, error) {
	if offset < 0 || limit < 0 {
		return nil, pathErr("read", path, errorf(errkind.ErrInvalidArgument, "offset and limit must not be negative"))
	}
	var (
		f    *os.File
		st   unix.Stat_t
		base string
	)
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, true)
		if err != nil {
			return err
		}
		if l.isRoot() {
			return syscall.EISDIR
		}
		d, name, err := l.openParent()
		if err != nil {
			return err
		}
		defer d.Close()
		pre, err := fstatat(d, name)
		if err != nil {
			return err
		}
		if err := readable(pre.Mode); err != nil {
			return err
		}
		var fd int
		err = ignoringEINTR(func() error {
			fd, err = unix.Openat(int(d.Fd()), name,
				unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			return err
		})
		if err != nil {
			return err
		}
		if err := unix.Fstat(fd, &st); err != nil {
			_ = unix.Close(fd)
			return err
		}
		if err := readable(st.Mode); err != nil {
			_ = unix.Close(fd)
			return err
		}
		if err := unix.SetNonblock(fd, false); err != nil {
			_ = unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		base = filepath.Base(l.abs())
		return nil
	})
	if err != nil {
		return nil, pathErr("read", path, err)
	}
	info := statInfo(base, &st)
	info.Path = path
	newNamer(w.users).fill(&info)
	length := max(info.Size-offset, 0)
	if limit > 0 {
		length = min(length, limit)
	}
	truncated := false
	if w.maxRead > 0 && length > w.maxRead {
		length, truncated = w.maxRead, true
	}
	return &FileReader{
		Info:      info,
		Offset:    offset,
		Length:    length,
		Truncated: truncated,
		path:      path,
		f:         f,
		r:         io.NewSectionReader(f, offset, length),
	}, nil
}

// readable refuses anything but a regular file.
func readable(mode uint32) error {
	switch t := fileTypeOf(mode); t {
	case TypeRegular:
		return nil
	case TypeDirectory:
		return syscall.EISDIR
	case TypeSymlink:
		// Resolution followed every link; a link here was swapped in
		// concurrently.
		return errorf(errkind.ErrConflict, "the file was replaced by a symbolic link while being opened")
	default:
		return errorf(errkind.ErrInvalidArgument, "not a regular file (%s)", t)
	}
}
