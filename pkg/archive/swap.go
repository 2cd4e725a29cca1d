package archive

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// undoKind says how to undo one step of the swap.
type undoKind uint8

const (
	undoMovedOut undoKind = iota + 1 // the entry was moved into the backup
	undoMovedIn                      // the staged entry was moved into place
	undoMeta                         // a kept directory got the archive's metadata
)

// undo is one journal record of the swap.
type undo struct {
	kind undoKind
	path string
	old  savedMeta
}

// savedMeta is the metadata of an entry before the swap changed it.
type savedMeta struct {
	mode         fs.FileMode
	uid, gid     int
	atime, mtime time.Time
}

// swapper replaces the workspace's entries with the staged ones, journaling
// every step so that rollback can put everything back. Entries at excluded
// paths, the workspace's temporary files and Restore's own directories stay
// where they are; directories that lead to a preserved excluded path
// (spine) stay too and have their contents swapped one by one.
type swapper struct {
	root   *os.Root
	stage  string // name of the staging directory in root
	backup string // name of the backup directory in root
	keep   excludeSet
	spine  map[string]bool
	meta   map[string]dirMeta // the archive's metadata for spine directories
	chown  bool
	hook   func(step int) error
	log    *zap.Logger

	step       int
	backupMade map[string]bool // backup directories already made
	dirs       map[string]*os.File
	journal    []undo
}

// run performs the swap. On error the caller calls rollback.
func (s *swapper) run() error {
	s.backupMade = make(map[string]bool)
	s.dirs = make(map[string]*os.File)
	return s.swapDir("")
}

// swapDir swaps the contents of the directory rel ("" for the root).
func (s *swapper) swapDir(rel string) error {
	current, err := s.list(rel)
	if err != nil {
		return pathErr(opRestore, orDot(rel), err)
	}
	for _, name := range current {
		p := join(rel, name)
		switch {
		case skipName(rel, name), s.keep.has(p):
			continue
		case s.spine[p]:
			if err := s.stagedDir(p); err != nil {
				return pathErr(opRestore, p, err)
			}
			if err := s.swapDir(p); err != nil {
				return err
			}
		default:
			if err := s.moveOut(p); err != nil {
				return pathErr(opRestore, p, err)
			}
		}
	}
	staged, err := s.list(join(s.stage, rel))
	if err != nil {
		return pathErr(opRestore, orDot(rel), err)
	}
	for _, name := range staged {
		p := join(rel, name)
		if s.spine[p] {
			continue
		}
		if err := s.moveIn(p); err != nil {
			return pathErr(opRestore, p, err)
		}
	}
	if rel != "" {
		if err := s.applyMeta(rel); err != nil {
			return pathErr(opRestore, rel, err)
		}
	}
	return nil
}

// moveOut moves the workspace entry p into the backup.
func (s *swapper) moveOut(p string) error {
	if err := s.next(); err != nil {
		return err
	}
	dir, _ := split(p)
	if !s.backupMade[dir] {
		if err := s.root.MkdirAll(join(s.backup, dir), 0o700); err != nil {
			return err
		}
		s.backupMade[dir] = true
	}
	if err := s.rename(p, join(s.backup, p)); err != nil {
		return err
	}
	s.journal = append(s.journal, undo{kind: undoMovedOut, path: p})
	return nil
}

// moveIn moves the staged entry p into place.
func (s *swapper) moveIn(p string) error {
	if err := s.next(); err != nil {
		return err
	}
	if err := s.rename(join(s.stage, p), p); err != nil {
		return err
	}
	s.journal = append(s.journal, undo{kind: undoMovedIn, path: p})
	return nil
}

// stagedDir makes sure the staging tree has a directory at the spine path
// p, to receive the staged entries below it.
func (s *swapper) stagedDir(p string) error {
	fi, err := s.root.Lstat(join(s.stage, p))
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("%w: staged entry is not a directory", syscall.ENOTDIR)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return s.root.Mkdir(join(s.stage, p), 0o700)
}

// applyMeta gives the kept spine directory rel the archive's metadata, if
// the archive named it.
func (s *swapper) applyMeta(rel string) error {
	d, ok := s.meta[rel]
	if !ok {
		return nil
	}
	if err := s.next(); err != nil {
		return err
	}
	old, err := saveMeta(s.root, rel)
	if err != nil {
		return err
	}
	s.journal = append(s.journal, undo{kind: undoMeta, path: rel, old: old})
	return applyDirMeta(s.root, d, s.chown)
}

// next numbers the next step and lets a test hook fail it.
func (s *swapper) next() error {
	s.step++
	if s.hook != nil {
		return s.hook(s.step)
	}
	return nil
}

// rollback undoes the journal, last step first, and reports every step it
// could not undo.
func (s *swapper) rollback() error {
	var errs []error
	for i := len(s.journal) - 1; i >= 0; i-- {
		u := s.journal[i]
		var err error
		switch u.kind {
		case undoMovedOut:
			err = s.rename(join(s.backup, u.path), u.path)
		case undoMovedIn:
			err = s.rename(u.path, join(s.stage, u.path))
		case undoMeta:
			err = restoreMeta(s.root, u.path, u.old)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", shown(u.path), classify(err)))
		}
	}
	s.journal = nil
	return errors.Join(errs...)
}

// close releases the directory descriptors the swap opened.
func (s *swapper) close() {
	for _, f := range s.dirs {
		_ = f.Close()
	}
	s.dirs = nil
}

// list returns the sorted names in the directory rel of the root.
func (s *swapper) list(rel string) ([]string, error) {
	f, err := s.root.Open(orDot(rel))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	slices.Sort(names)
	return names, err
}

// dir returns a descriptor of the directory rel of the root, kept for the
// duration of the swap.
func (s *swapper) dir(rel string) (int, error) {
	if f, ok := s.dirs[rel]; ok {
		return int(f.Fd()), nil
	}
	f, err := s.root.Open(orDot(rel))
	if err != nil {
		return -1, err
	}
	s.dirs[rel] = f
	return int(f.Fd()), nil
}

// rename moves from to to (both relative to the root), never replacing an
// existing entry. A directory that its owner may not write (which the
// kernel requires to move it to another parent, unless we are root) is
// made writable for the move and given its mode back afterwards.
func (s *swapper) rename(from, to string) error {
	fromDir, fromName := split(from)
	toDir, toName := split(to)
	ffd, err := s.dir(fromDir)
	if err != nil {
		return err
	}
	tfd, err := s.dir(toDir)
	if err != nil {
		return err
	}
	err = renameNoReplace(ffd, fromName, tfd, toName)
	if !errors.Is(err, unix.EACCES) {
		return err
	}
	var st unix.Stat_t
	if unix.Fstatat(ffd, fromName, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
		st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Mode&0o200 != 0 {
		return err
	}
	mode := st.Mode & 0o7777
	if unix.Fchmodat(ffd, fromName, mode|0o200, 0) != nil {
		return err
	}
	err = renameNoReplace(ffd, fromName, tfd, toName)
	dfd, name := tfd, toName
	if err != nil {
		dfd, name = ffd, fromName
	}
	if cerr := unix.Fchmodat(dfd, name, mode, 0); cerr != nil {
		s.log.Warn("restore: could not give a moved directory its mode back",
			zap.String("path", shown(to)), zap.Error(cerr))
	}
	return err
}

// renameNoReplace renames with RENAME_NOREPLACE, or, on a filesystem that
// lacks it, after checking that the target does not exist.
func renameNoReplace(fromfd int, from string, tofd int, to string) error {
	err := ignoreEINTR(func() error { return unix.Renameat2(fromfd, from, tofd, to, unix.RENAME_NOREPLACE) })
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	var st unix.Stat_t
	if serr := unix.Fstatat(tofd, to, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil {
		return unix.EEXIST
	}
	return ignoreEINTR(func() error { return unix.Renameat(fromfd, from, tofd, to) })
}

// saveMeta reads the metadata restoreMeta puts back.
func saveMeta(r *os.Root, name string) (savedMeta, error) {
	fi, err := r.Lstat(orDot(name))
	if err != nil {
		return savedMeta{}, err
	}
	m := savedMeta{mode: fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		m.uid, m.gid = int(st.Uid), int(st.Gid)
		m.atime = time.Unix(st.Atim.Sec, st.Atim.Nsec)
	}
	return m, nil
}

// restoreMeta puts back what saveMeta read.
func restoreMeta(r *os.Root, name string, m savedMeta) error {
	name = orDot(name)
	if os.Geteuid() == 0 {
		if err := r.Lchown(name, m.uid, m.gid); err != nil {
			return err
		}
	}
	if err := r.Chmod(name, m.mode); err != nil {
		return err
	}
	return r.Chtimes(name, m.atime, m.mtime)
}
