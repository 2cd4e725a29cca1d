package materializer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// walkHost expands the host path src (relative to base) into plan entries
// below the workspace path dest. Every component is checked with Lstat: a
// symbolic link anywhere is refused (unless allowLinks, for git checkouts,
// where links that stay inside become symlink entries), as is anything that
// is neither a file nor a directory. base is opened as an os.Root, so
// nothing outside it can be reached even if the tree changes meanwhile; each
// file is opened with O_NOFOLLOW when streamed and must still be the same
// file (device and inode) that was planned.
func walkHost(ctx context.Context, base, src, dest string, dir, allowLinks bool, cleanup *[]func()) ([]*agentclient.MaterializeEntry, map[string]source, error) {
	rt, err := os.OpenRoot(base)
	if err != nil {
		return nil, nil, fmt.Errorf("entry %s: open base directory: %w", dest, errkind.ClassifyFS(err))
	}
	*cleanup = append(*cleanup, func() { _ = rt.Close() })
	hostErr := func(p string, err error) error {
		return &errkind.PathError{Op: "read host source", Path: p, Err: err}
	}
	// The parents of src must be real directories.
	if src != "." {
		parts := strings.Split(src, "/")
		for i := 1; i < len(parts); i++ {
			p := strings.Join(parts[:i], "/")
			fi, err := rt.Lstat(p)
			if err != nil {
				return nil, nil, hostErr(p, errkind.ClassifyFS(err))
			}
			if !fi.IsDir() {
				return nil, nil, hostErr(p, errkind.Errorf(errkind.ErrPermissionDenied, "not a plain directory (symbolic links are refused)"))
			}
		}
	}
	fi, err := rt.Lstat(src)
	if err != nil {
		return nil, nil, hostErr(src, errkind.ClassifyFS(err))
	}
	w := &hostWalk{ctx: ctx, rt: rt, allowLinks: allowLinks, sources: map[string]source{}}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, nil, hostErr(src, errkind.Errorf(errkind.ErrPermissionDenied, "is a symbolic link; host sources must be plain files and directories"))
	case dir && !fi.IsDir():
		return nil, nil, hostErr(src, errkind.Errorf(errkind.ErrNotDirectory, "local_dir source is not a directory"))
	case !dir && !fi.Mode().IsRegular():
		return nil, nil, hostErr(src, errkind.Errorf(errkind.ErrInvalidArgument, "local_file source is not a regular file"))
	case !dir:
		w.file(src, dest, fi)
		return w.entries, w.sources, nil
	}
	w.entries = append(w.entries, &agentclient.MaterializeEntry{Path: dest, Kind: agentclient.EntryDirectory, Mode: uint32(fi.Mode().Perm())})
	if err := w.dir(src, dest, src == "." && allowLinks); err != nil {
		return nil, nil, err
	}
	return w.entries, w.sources, nil
}

// hostWalk accumulates the entries of a host directory tree.
type hostWalk struct {
	ctx        context.Context
	rt         *os.Root
	allowLinks bool
	entries    []*agentclient.MaterializeEntry
	sources    map[string]source
}

func (w *hostWalk) dir(src, dest string, top bool) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	d, err := w.rt.Open(src)
	if err != nil {
		return &errkind.PathError{Op: "read host source", Path: src, Err: errkind.ClassifyFS(err)}
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return &errkind.PathError{Op: "read host source", Path: src, Err: errkind.ClassifyFS(err)}
	}
	slices.Sort(names)
	for _, name := range names {
		if top && name == ".git" {
			continue
		}
		hp, wp := path.Join(src, name), path.Join(dest, name)
		fi, err := w.rt.Lstat(hp)
		if err != nil {
			return &errkind.PathError{Op: "read host source", Path: hp, Err: errkind.ClassifyFS(err)}
		}
		switch {
		case fi.IsDir():
			w.entries = append(w.entries, &agentclient.MaterializeEntry{Path: wp, Kind: agentclient.EntryDirectory, Mode: uint32(fi.Mode().Perm())})
			if err := w.dir(hp, wp, false); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			w.file(hp, wp, fi)
		case fi.Mode()&fs.ModeSymlink != 0 && w.allowLinks:
			target, err := w.rt.Readlink(hp)
			if err != nil {
				return &errkind.PathError{Op: "read host source", Path: hp, Err: errkind.ClassifyFS(err)}
			}
			joined := path.Join(path.Dir(wp), target)
			if strings.HasPrefix(target, "/") || joined == ".." || strings.HasPrefix(joined, "../") {
				return &errkind.PathError{Op: "read host source", Path: hp, Err: errkind.Errorf(errkind.ErrPathEscape, "symbolic link to %q leaves the workspace", target)}
			}
			w.entries = append(w.entries, &agentclient.MaterializeEntry{Path: wp, Kind: agentclient.EntrySymlink, LinkTarget: target})
		case fi.Mode()&fs.ModeSymlink != 0:
			return &errkind.PathError{Op: "read host source", Path: hp, Err: errkind.Errorf(errkind.ErrPermissionDenied, "is a symbolic link; host sources must be plain files and directories")}
		default:
			return &errkind.PathError{Op: "read host source", Path: hp, Err: errkind.Errorf(errkind.ErrInvalidArgument, "is not a file or directory (%v)", fi.Mode().Type())}
		}
	}
	return nil
}

// file plans one regular file.
func (w *hostWalk) file(hp, wp string, fi fs.FileInfo) {
	st, _ := fi.Sys().(*syscall.Stat_t)
	rt := w.rt
	w.entries = append(w.entries, &agentclient.MaterializeEntry{Path: wp, Kind: agentclient.EntryFile, Mode: uint32(fi.Mode().Perm()), Size: fi.Size()})
	w.sources[wp] = source{path: wp, size: fi.Size(), open: func() (io.ReadCloser, int64, error) {
		f, err := rt.OpenFile(hp, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			if errors.Is(err, syscall.ELOOP) {
				return nil, 0, errkind.Errorf(errkind.ErrConflict, "%s became a symbolic link", hp)
			}
			return nil, 0, errkind.ClassifyFS(err)
		}
		now, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, errkind.ClassifyFS(err)
		}
		nst, _ := now.Sys().(*syscall.Stat_t)
		if st != nil && nst != nil && (st.Dev != nst.Dev || st.Ino != nst.Ino) || !now.Mode().IsRegular() {
			f.Close()
			return nil, 0, errkind.Errorf(errkind.ErrConflict, "%s was replaced while materializing", hp)
		}
		return f, now.Size(), nil
	}}
}

// sliceReader is an io.Reader over inline content.
type sliceReader struct{ b []byte }

func bytesReader(b []byte) io.Reader { return &sliceReader{b: b} }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}
