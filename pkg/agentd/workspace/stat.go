package workspace

import (
	"context"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Stat describes path as user u sees it (u nil: the daemon's identity).
// A symbolic link in the final component is described itself, with its
// target; links in earlier components are followed.
func (w *Workspace) Stat(ctx context.Context, u *userdb.User, path string) (FileInfo, error) {
	var fi FileInfo
	err := w.runAs(ctx, u, func() error {
		l, err := w.locate(path, false)
		if err != nil {
			return err
		}
		fi, err = lstatLoc(l)
		return err
	})
	if err != nil {
		return FileInfo{}, pathErr("stat", path, err)
	}
	fi.Path = path
	newNamer(w.users).fill(&fi)
	return fi, nil
}

// lstatLoc describes l itself, reading a symlink's target.
func lstatLoc(l loc) (FileInfo, error) {
	st, err := l.m.root.Lstat(l.rel)
	if err != nil {
		return FileInfo{}, err
	}
	fi := osInfo(filepath.Base(l.abs()), st)
	if fi.Type == TypeSymlink {
		if fi.LinkTarget, err = l.m.root.Readlink(l.rel); err != nil {
			return FileInfo{}, err
		}
	}
	return fi, nil
}

// fstatat stats name in directory d without following a final symlink.
func fstatat(d *os.File, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := ignoringEINTR(func() error {
		return unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	})
	return st, err
}

// ignoringEINTR retries fn while it fails with EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}
