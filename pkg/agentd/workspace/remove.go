package workspace

import (
	"context"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Remove removes path as user u. A symbolic link is removed itself, never
// its target. A directory is removed only when empty, unless recursive (a
// non-empty directory without recursive is errkind.ErrNotEmpty). The
// workspace root, grant roots and directories holding a grant root are
// refused with errkind.ErrPermissionDenied.
func (w *Workspace) Remove(ctx context.Context, u *userdb.User, path string, recursive bool) error {
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, false)
		if err != nil {
			return err
		}
		if err := w.movable(l); err != nil {
			return err
		}
		d, name, err := l.openParent()
		if err != nil {
			return err
		}
		defer d.Close()
		st, err := fstatat(d, name)
		if err != nil {
			return err
		}
		if fileTypeOf(st.Mode) != TypeDirectory {
			return unlinkAt(d, name, false)
		}
		if recursive {
			return l.m.root.RemoveAll(l.rel)
		}
		err = unlinkAt(d, name, true)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return errorf(errkind.ErrNotEmpty, "the directory is not empty and the removal is not recursive")
		}
		return err
	})
	return pathErr("remove", path, err)
}

// movable refuses removing or renaming a read-only path, a root, or a
// directory holding another mount's root.
func (w *Workspace) movable(l loc) error {
	if err := l.writable(); err != nil {
		return err
	}
	if l.isRoot() {
		return errorf(errkind.ErrPermissionDenied, "the workspace root and grant roots cannot be removed or renamed")
	}
	abs := l.abs()
	for _, m := range w.mounts.Load().list {
		if m != l.m {
			if _, inside := within([]string{abs}, m.abs); inside {
				return errorf(errkind.ErrPermissionDenied, "the directory holds a grant or the workspace root")
			}
		}
	}
	return nil
}

// Rename renames from to to as user u. Neither final component is followed:
// a symbolic link is renamed, or replaced, itself. Without overwrite an
// existing target is errkind.ErrAlreadyExists (checked atomically with
// renameat2(RENAME_NOREPLACE) where the filesystem has it); with overwrite
// the kernel's rules apply (a directory replaces only an empty directory).
// Both paths must lie in the same root: moving between the workspace and a
// grant is errkind.ErrInvalidArgument.
func (w *Workspace) Rename(ctx context.Context, u *userdb.User, from, to string, overwrite bool) error {
	err := w.runAs(ctx, u, func() error {
		lf, err := w.locate(from, false)
		if err != nil {
			return err
		}
		lt, err := w.locate(to, false)
		if err != nil {
			return &errkind.PathError{Op: "rename", Path: to, Err: classify(err)}
		}
		if err := w.movable(lf); err != nil {
			return err
		}
		if err := w.movable(lt); err != nil {
			return &errkind.PathError{Op: "rename", Path: to, Err: classify(err)}
		}
		if lf.m != lt.m {
			return errorf(errkind.ErrInvalidArgument, "cannot rename between the workspace and a grant, or between grants")
		}
		od, on, err := lf.openParent()
		if err != nil {
			return err
		}
		defer od.Close()
		nd, nn, err := lt.openParent()
		if err != nil {
			return &errkind.PathError{Op: "rename", Path: to, Err: classify(err)}
		}
		defer nd.Close()
		if _, err := fstatat(od, on); err != nil {
			return err
		}
		if overwrite {
			err = renameAt(od, on, nd, nn)
		} else {
			err = renameNoReplace(od, on, nd, nn)
		}
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EISDIR) {
			// The target is the problem.
			return &errkind.PathError{Op: "rename", Path: to, Err: classify(err)}
		}
		return err
	})
	return pathErr("rename", from, err)
}
