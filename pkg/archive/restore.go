package archive

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"syscall"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Restore replaces the contents of the workspace at root with the archive
// read from r (plain tar or zstd-compressed tar, detected from the stream),
// keeping the entries at opts.Exclude. See the package documentation for
// the checks, the limits and how the swap works.
//
// Restore is all or nothing: when it returns an error, root holds exactly
// what it held before (entries, contents, modes, owners, times), and no
// staging or backup directory is left behind. The one exception is a
// rollback that itself fails (a disk error while moving entries back): the
// error then says so, wraps errkind.ErrInternal, and the backup directory
// is kept so that nothing is lost.
//
// Before anything is written, Restore checks that no directory it would
// move is a mount point: moving one would carry the mounted filesystem into
// the backup, and removing the backup would empty it. Such a restore fails
// with errkind.ErrFailedPrecondition naming the mount point, which belongs
// in opts.Exclude. (Removal never descends into another mount either.)
//
// Errors that concern a member are *errkind.PathError values whose Path is
// the member's name as the archive spells it (quoted when it is not
// printable UTF-8, cut when very long); errors about the stream as a whole
// name "(archive)". Refused members wrap errkind.ErrInvalidArgument or,
// when they would reach outside the workspace, errkind.ErrPathEscape;
// crossed limits wrap errkind.ErrResourceExhausted. Cancelling ctx stops
// the extraction (errkind.ErrCanceled); once the swap has begun it runs to
// its end, which is quick. A zstd stream is read by a decompressing
// goroutine, and Restore waits for its pending Read before returning, so r
// should return when ctx is done (gRPC streams do).
//
// The Stats count what was extracted, also when the restore failed and was
// undone.
func Restore(ctx context.Context, root string, r io.Reader, opts RestoreOptions) (Stats, error) {
	lim, err := opts.Limits.resolve()
	if err != nil {
		return Stats{}, err
	}
	exclude, err := newExcludeSet(opRestore, opts.Exclude)
	if err != nil {
		return Stats{}, err
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	rt, err := os.OpenRoot(root)
	if err != nil {
		return Stats{}, pathErr(opRestore, ".", err)
	}
	defer rt.Close()

	spine, err := spineOf(rt, exclude)
	if err != nil {
		return Stats{}, err
	}
	switch p, err := findMount(rt, exclude, spine); {
	case err != nil:
		return Stats{}, pathErr(opRestore, ".", err)
	case p != "":
		return Stats{}, refuse(opRestore, shown(p), errkind.ErrFailedPrecondition,
			"a mount point that is not excluded would be moved; exclude it to preserve it")
	}
	// The times of the directories whose contents change in place, to put
	// back on failure.
	kept := append([]string{""}, slices.Sorted(maps.Keys(spine))...)
	times := make(map[string]savedMeta, len(kept))
	for _, p := range kept {
		m, err := saveMeta(rt, p)
		if err != nil {
			return Stats{}, pathErr(opRestore, orDot(p), err)
		}
		times[p] = m
	}

	id, err := randomID()
	if err != nil {
		return Stats{}, pathErr(opRestore, ".", err)
	}
	stageName, backupName := ReservedPrefix+"stage-"+id, ReservedPrefix+"backup-"+id
	if err := rt.Mkdir(stageName, 0o700); err != nil {
		return Stats{}, pathErr(opRestore, ".", err)
	}
	undo := func() {
		for _, name := range []string{stageName, backupName} {
			if err := removeTree(rt, name); err != nil {
				log.Warn("restore: could not remove a staging directory", zap.String("path", name), zap.Error(err))
			}
		}
		for _, p := range kept {
			if err := rt.Chtimes(orDot(p), times[p].atime, times[p].mtime); err != nil {
				log.Warn("restore: could not reset directory times", zap.String("path", shown(orDot(p))), zap.Error(err))
			}
		}
	}

	stage, err := rt.OpenRoot(stageName)
	if err != nil {
		undo()
		return Stats{}, pathErr(opRestore, ".", err)
	}
	chown := opts.PreserveOwnership && os.Geteuid() == 0
	x := &extractor{ctx: ctx, opts: &opts, lim: lim, log: log, exclude: exclude, spine: spine, stage: stage, chown: chown}
	err = x.run(r)
	_ = stage.Close()
	if err != nil {
		undo()
		return x.stats, err
	}

	sw := &swapper{root: rt, stage: stageName, backup: backupName, keep: exclude, spine: spine,
		meta: x.spineMeta, chown: chown, hook: opts.hooks.swapStep, log: log}
	err = sw.run()
	if err != nil {
		rbErr := sw.rollback()
		sw.close()
		if rbErr != nil {
			log.Error("restore: rollback failed; the previous entries are kept in the backup directory",
				zap.String("backup", backupName), zap.Error(rbErr))
			return x.stats, &errkind.PathError{Op: opRestore, Path: ".", Err: fmt.Errorf(
				"%w: the swap failed (%v) and so did its rollback (%v); the previous entries are kept in %s",
				errkind.ErrInternal, err, rbErr, backupName)}
		}
		undo()
		return x.stats, err
	}
	sw.close()
	for _, name := range []string{backupName, stageName} {
		if err := removeTree(rt, name); err != nil {
			log.Warn("restore: could not remove a staging directory", zap.String("path", name), zap.Error(err))
		}
	}
	return x.stats, nil
}

// spineOf returns the proper ancestors of the excluded paths that exist in
// the workspace below real directories: the directories that must stay in
// place so that those paths are preserved.
func spineOf(rt *os.Root, exclude excludeSet) (map[string]bool, error) {
	spine := make(map[string]bool)
	for e := range exclude {
		if exclude.coveredByAncestor(e) {
			continue
		}
		ok, err := preservable(rt, e)
		if err != nil {
			return nil, pathErr(opRestore, e, err)
		}
		if !ok {
			continue
		}
		for i := 0; i < len(e); i++ {
			if e[i] == '/' {
				spine[e[:i]] = true
			}
		}
	}
	return spine, nil
}

// preservable reports whether the workspace has an entry at p whose
// ancestors are all real directories (not symbolic links).
func preservable(rt *os.Root, p string) (bool, error) {
	for i := 0; i <= len(p); i++ {
		if i < len(p) && p[i] != '/' {
			continue
		}
		fi, err := rt.Lstat(p[:i])
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
			return false, nil
		case err != nil:
			return false, err
		case i < len(p) && !fi.IsDir():
			return false, nil
		}
	}
	return true, nil
}

// randomID returns 16 random hex digits.
func randomID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}
