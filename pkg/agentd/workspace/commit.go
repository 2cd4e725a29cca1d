package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// ChangeKind is the kind of one FileChange.
type ChangeKind int

// Change kinds.
const (
	// ChangeWrite creates Path or replaces its content with Content. A
	// symbolic link at Path is followed.
	ChangeWrite ChangeKind = iota + 1
	// ChangeDelete removes the file (or symbolic link) at Path.
	ChangeDelete
	// ChangeMove moves Path to NewPath, replacing a file there. With
	// Content nil the file is renamed as is; otherwise NewPath gets
	// Content and Path is removed (an update that also moves).
	ChangeMove
)

// FileChange is one step of a Commit.
type FileChange struct {
	Kind    ChangeKind
	Path    string
	NewPath string // ChangeMove only
	Content []byte
	// Mode holds permission bits; 0 keeps those of the file being replaced
	// (for a move with content: of Path), or DefaultFileMode.
	Mode fs.FileMode
}

// Commit applies changes in order, as user u, all or nothing: every path
// is resolved and checked first, every new content is written to a
// temporary file next to its target and synced, and only then are the
// renames and deletions made, keeping a backup (a hard link, or a renamed
// entry) of everything replaced or deleted. If any step fails, everything
// done so far is undone (replaced files are renamed back, created files
// and parent directories removed) and no file is changed. On success the
// backups are removed.
//
// A Commit is atomic with respect to errors, not to crashes: a daemon killed
// mid-commit can leave some changes applied, with backups and staged files
// named TempPrefix* beside them (CleanupTemp removes them).
//
// Each path may appear only once among all Path and NewPath values.
// Directories are neither deleted nor moved. Missing parent directories of
// written or moved-to files are created. Errors are *errkind.PathError with
// Op "commit" and the path of the change that failed.
func (w *Workspace) Commit(ctx context.Context, u *userdb.User, changes []FileChange) error {
	c := &commit{w: w, ctx: ctx, changes: changes, chown: u == nil && w.euid == 0, dirs: map[string]*os.File{}}
	err := w.runAs(ctx, u, c.run)
	if err == nil {
		c.finish()
		return nil
	}
	if rerr := c.rollback(); rerr != nil {
		w.log.Error("commit rollback incomplete", zap.Error(rerr))
		err = fmt.Errorf("%w; rollback incomplete: %v", classify(err), rerr)
	}
	c.closeDirs()
	var pe *errkind.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &errkind.PathError{Op: "commit", Path: c.failedPath, Err: classify(err)}
}

// commit is the state of one Commit.
type commit struct {
	w          *Workspace
	ctx        context.Context
	changes    []FileChange
	chown      bool // the daemon writes as root: keep owners of replaced files
	failedPath string

	plan    []commitOp
	dirs    map[string]*os.File // O_PATH parent directories, by mount and path
	created []entryRef          // parent directories made, in order
	temps   []entryRef          // staged files (gone once renamed into place)
	backups []entryRef          // backups, removed at the end
	undo    []func() error
}

// entryRef names one entry in an open directory.
type entryRef struct {
	dir  *os.File
	name string
}

// commitTarget is one checked path of a change.
type commitTarget struct {
	l      loc
	dir    *os.File
	name   string
	exists bool
	st     unix.Stat_t
	mkdir  bool // the parent directory is missing and will be created
}

// commitOp is one planned change.
type commitOp struct {
	c       *FileChange
	src     *commitTarget // ChangeDelete, ChangeMove
	dst     *commitTarget // ChangeWrite, ChangeMove
	tmpName string        // staged content, in dst.dir
}

// run validates, stages and applies the changes. It runs as the user.
func (c *commit) run() error {
	if err := c.validate(); err != nil {
		return err
	}
	if err := c.stage(); err != nil {
		return err
	}
	for i := range c.plan {
		op := &c.plan[i]
		c.failedPath = op.c.Path
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if h := c.w.hooks; h != nil && h.beforeCommitStep != nil {
			if err := h.beforeCommitStep(i); err != nil {
				return err
			}
		}
		if err := c.apply(op); err != nil {
			return err
		}
	}
	return nil
}

// validate resolves and checks every path before anything changes.
func (c *commit) validate() error {
	seen := map[string]bool{}
	claim := func(l loc) error {
		key := l.m.abs + "\x00" + l.rel
		if seen[key] {
			return errorf(errkind.ErrInvalidArgument, "the path is changed twice in one commit")
		}
		seen[key] = true
		return nil
	}
	for i := range c.changes {
		ch := &c.changes[i]
		c.failedPath = ch.Path
		if ch.Mode&^fs.ModePerm != 0 {
			return errorf(errkind.ErrInvalidArgument, "mode %v: only permission bits may be set", ch.Mode)
		}
		if c.w.maxWrite > 0 && int64(len(ch.Content)) > c.w.maxWrite {
			return errorf(errkind.ErrResourceExhausted, "the content exceeds the %d-byte write limit", c.w.maxWrite)
		}
		op := commitOp{c: ch}
		var err error
		switch ch.Kind {
		case ChangeWrite:
			if op.dst, err = c.target(ch.Path, true, claim); err != nil {
				return err
			}
		case ChangeDelete:
			if op.src, err = c.source(ch.Path, claim); err != nil {
				return err
			}
		case ChangeMove:
			if op.src, err = c.source(ch.Path, claim); err != nil {
				return err
			}
			c.failedPath = ch.NewPath
			if op.dst, err = c.target(ch.NewPath, false, claim); err != nil {
				return err
			}
			if ch.Content == nil && op.src.l.m != op.dst.l.m {
				return errorf(errkind.ErrInvalidArgument, "a move without content cannot cross between the workspace and a grant")
			}
		default:
			return errorf(errkind.ErrInvalidArgument, "unknown change kind %d", ch.Kind)
		}
		c.plan = append(c.plan, op)
	}
	return nil
}

// source checks a path that is deleted or moved away: an existing
// non-directory, not followed.
func (c *commit) source(path string, claim func(loc) error) (*commitTarget, error) {
	l, err := c.w.locate(path, false)
	if err != nil {
		return nil, err
	}
	if err := c.w.movable(l); err != nil {
		return nil, err
	}
	if err := claim(l); err != nil {
		return nil, err
	}
	t := &commitTarget{l: l, name: l.base()}
	if t.dir, err = c.parent(l); err != nil {
		return nil, err
	}
	if t.st, err = fstatat(t.dir, t.name); err != nil {
		return nil, err
	}
	if fileTypeOf(t.st.Mode) == TypeDirectory {
		return nil, errorf(errkind.ErrIsDirectory, "a commit does not delete or move directories")
	}
	t.exists = true
	return t, nil
}

// target checks a path that receives content or a moved file.
func (c *commit) target(path string, follow bool, claim func(loc) error) (*commitTarget, error) {
	l, err := c.w.locate(path, follow)
	if err != nil {
		return nil, err
	}
	if err := c.w.movable(l); err != nil {
		if l.isRoot() {
			return nil, unix.EISDIR
		}
		return nil, err
	}
	if err := claim(l); err != nil {
		return nil, err
	}
	t := &commitTarget{l: l, name: l.base()}
	t.dir, err = c.parent(l)
	if errors.Is(err, unix.ENOENT) {
		t.mkdir = true // nothing below a missing directory exists
		return t, nil
	}
	if err != nil {
		return nil, err
	}
	t.st, err = fstatat(t.dir, t.name)
	if errors.Is(err, unix.ENOENT) {
		return t, nil
	}
	if err != nil {
		return nil, err
	}
	t.exists = true
	switch fileTypeOf(t.st.Mode) {
	case TypeRegular:
		return t, checkWritable(t.dir, t.name)
	case TypeSymlink:
		if follow {
			return nil, errorf(errkind.ErrConflict, "the target was replaced by a symbolic link concurrently")
		}
		return t, nil
	default:
		return nil, writableType(t.st.Mode)
	}
}

// parent opens (once) the directory holding l.
func (c *commit) parent(l loc) (*os.File, error) {
	key := l.m.abs + "\x00" + l.dir()
	if d, ok := c.dirs[key]; ok {
		return d, nil
	}
	d, _, err := l.openParent()
	if err != nil {
		return nil, err
	}
	c.dirs[key] = d
	return d, nil
}

// stage creates missing parent directories and writes every new content to
// a synced temporary file beside its target.
func (c *commit) stage() error {
	for i := range c.plan {
		op := &c.plan[i]
		c.failedPath = op.c.Path
		if op.dst == nil {
			continue
		}
		if op.c.Kind == ChangeMove {
			c.failedPath = op.c.NewPath
		}
		if op.dst.mkdir {
			if err := c.mkdirs(op.dst); err != nil {
				return err
			}
		}
		if op.c.Kind == ChangeMove && op.c.Content == nil {
			continue
		}
		f, name, err := createTemp(op.dst.dir)
		if err != nil {
			return err
		}
		c.temps = append(c.temps, entryRef{op.dst.dir, name})
		op.tmpName = name
		mode, owner := op.c.Mode, op.dst
		if op.c.Kind == ChangeMove {
			owner = op.src
		}
		if mode == 0 {
			mode = DefaultFileMode
			if owner.exists && fileTypeOf(owner.st.Mode) == TypeRegular {
				mode = fs.FileMode(owner.st.Mode & 0o777)
			}
		}
		_, err = f.Write(op.c.Content)
		if err == nil {
			err = finishTemp(f, mode, c.chown && owner.exists, owner.st.Uid, owner.st.Gid)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mkdirs creates the missing directories above t, one at a time, recording
// each for rollback, and opens t's parent.
func (c *commit) mkdirs(t *commitTarget) error {
	parts := strings.Split(t.l.dir(), "/")
	for i := range parts {
		l := loc{m: t.l.m, rel: strings.Join(parts[:i+1], "/")}
		d, err := c.parent(l)
		if err != nil {
			return err
		}
		err = ignoringEINTR(func() error { return unix.Mkdirat(int(d.Fd()), l.base(), 0o755) })
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return err
		}
		c.created = append(c.created, entryRef{d, l.base()})
	}
	var err error
	t.dir, err = c.parent(t.l)
	t.mkdir = false
	return err
}

// apply performs one planned change, recording how to undo it.
func (c *commit) apply(op *commitOp) error {
	switch op.c.Kind {
	case ChangeWrite:
		return c.install(op.dst, op.dst.dir, op.tmpName)
	case ChangeDelete:
		return c.setAside(op.src)
	default: // ChangeMove
		c.failedPath = op.c.NewPath
		if op.c.Content != nil {
			if err := c.install(op.dst, op.dst.dir, op.tmpName); err != nil {
				return err
			}
			c.failedPath = op.c.Path
			return c.setAside(op.src)
		}
		return c.install(op.dst, op.src.dir, op.src.name)
	}
}

// install renames from (a staged file, or a moved source) over t, backing
// up what t held.
func (c *commit) install(t *commitTarget, fromDir *os.File, from string) error {
	if !t.exists {
		if err := renameNoReplace(fromDir, from, t.dir, t.name); err != nil {
			return err
		}
		c.undo = append(c.undo, func() error { return renameAt(t.dir, t.name, fromDir, from) })
		return nil
	}
	if err := c.backup(t, true); err != nil {
		return err
	}
	if err := renameAt(fromDir, from, t.dir, t.name); err != nil {
		return err
	}
	c.undo = append(c.undo, func() error { return renameAt(t.dir, t.name, fromDir, from) })
	return nil
}

// setAside moves t to a backup name (a deletion that can be undone).
func (c *commit) setAside(t *commitTarget) error {
	return c.backup(t, false)
}

// backup keeps t's current entry under a temporary name and records how to
// put it back. With link, the entry stays in place (a hard link is made),
// so readers never miss it; without, or where hard links are not
// supported, it is renamed away.
func (c *commit) backup(t *commitTarget, link bool) error {
	bak := newTempName()
	var err error
	if link && fileTypeOf(t.st.Mode) == TypeRegular {
		err = linkAt(t.dir, t.name, t.dir, bak)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EMLINK) {
			link = false
		}
	} else {
		link = false
	}
	if !link {
		err = renameNoReplace(t.dir, t.name, t.dir, bak)
	}
	if err != nil {
		return err
	}
	c.backups = append(c.backups, entryRef{t.dir, bak})
	// Renaming the backup over the name restores the old entry whether the
	// name now holds new content or nothing. (When it still holds the same
	// inode, rename does nothing and the backup link is removed later.)
	c.undo = append(c.undo, func() error { return renameAt(t.dir, bak, t.dir, t.name) })
	return nil
}

// finish removes the backups after success and syncs the directories.
func (c *commit) finish() {
	for _, b := range c.backups {
		if err := unlinkAt(b.dir, b.name, false); err != nil {
			c.w.log.Warn("remove commit backup", zap.Error(err))
		}
	}
	for _, d := range c.dirs {
		if err := syncDir(d); err != nil {
			c.w.log.Debug("sync directory after commit", zap.Error(err))
		}
	}
	c.closeDirs()
}

// rollback undoes the applied steps in reverse and removes staged files,
// leftover backups and created directories. It runs as the daemon, on
// descriptors and names the commit made itself, so it cannot be redirected
// and does not depend on the user's permissions (a directory made
// read-only midway does not block it).
func (c *commit) rollback() error {
	var errs []error
	for i := len(c.undo) - 1; i >= 0; i-- {
		if err := c.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	for _, list := range [][]entryRef{c.temps, c.backups} {
		for _, t := range list {
			if err := unlinkAt(t.dir, t.name, false); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
		}
	}
	// Directories made for new files go if they are still empty
	// directories; anything else there is no longer the commit's.
	for i := len(c.created) - 1; i >= 0; i-- {
		d := c.created[i]
		if err := unlinkAt(d.dir, d.name, true); err != nil && !errors.Is(err, unix.ENOENT) {
			c.w.log.Debug("commit rollback: keep directory", zap.Error(err))
		}
	}
	if len(errs) > 0 {
		return classify(errors.Join(errs...))
	}
	return nil
}

func (c *commit) closeDirs() {
	for k, d := range c.dirs {
		_ = d.Close()
		delete(c.dirs, k)
	}
}
