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
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Restore replaces the contents of the workspace at root with the archive
// read from r (plain tar or zstd-compressed tar, detected from the stream),
// keeping the entries at opts.Exclude. See the package documentation for
// the checks, the limits and how the swap works.
//
// Restore is all or nothing: when it returns an error, root holds exactly
// what it held before (entries, contents, modes, owners, times), and no
// private area, staging or backup directory is left behind. The one
// exception is a rollback that itself fails (a disk error while moving
// entries back): the error then says so and wraps errkind.ErrInternal, and
// the journal keeps the restore, with its backup, for Recover to finish;
// until then Write and Fingerprint refuse. A crash at any point leaves a
// workspace Recover turns into exactly the old or exactly the new tree
// (see the package documentation); Restore begins by running it, and
// fails with errkind.ErrFailedPrecondition when an interrupted restore
// cannot be completed.
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
	t, err := openTree(rt)
	if err != nil {
		return Stats{}, pathErr(opRestore, ".", err)
	}
	defer t.close()

	// A restore a crash interrupted is finished (or undone) first.
	if _, err := t.recover(log, opts.Fault); err != nil {
		return Stats{}, err
	}

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
	// The metadata of the directories whose contents change in place, to
	// put back if the restore is undone.
	kept := slices.Sorted(maps.Keys(spine))
	before := make([]dirRecord, 0, len(kept)+1)
	for _, p := range append([]string{""}, kept...) {
		d, err := t.statDir(p)
		if err != nil {
			return Stats{}, pathErr(opRestore, orDot(p), err)
		}
		before = append(before, d)
	}

	id, err := randomID()
	if err != nil {
		return Stats{}, pathErr(opRestore, ".", err)
	}
	chown := opts.PreserveOwnership && os.Geteuid() == 0
	j := &journal{Version: journalVersion, ID: id, Phase: phaseStaging, Stage: stagePrefix + id, Backup: backupPrefix + id,
		Exclude: slices.Sorted(maps.Keys(exclude)), Spine: kept, Chown: chown, Before: before}
	sw, err := newSwapper(t, j, log, opts.Fault)
	if err != nil {
		return Stats{}, err
	}
	// Until the journal says swap-out, undoing means removing the stage.
	fail := func(err error) error {
		if rbErr := sw.backward(); rbErr != nil {
			log.Warn("restore: could not undo the extraction", zap.Error(rbErr))
		}
		return err
	}
	if _, err := t.makePrivate(); err != nil {
		return Stats{}, fail(pathErr(opRestore, PrivateDir, err))
	}
	if err := sw.setPhase(phaseStaging); err != nil {
		return Stats{}, fail(err)
	}
	stage, err := sw.openStage()
	if err != nil {
		return Stats{}, fail(err)
	}
	if err := sw.step(StepExtract); err != nil {
		_ = stage.Close()
		return Stats{}, fail(pathErr(opRestore, ".", err))
	}
	x := &extractor{ctx: ctx, opts: &opts, lim: lim, log: log, exclude: exclude, spine: spine, stage: stage, chown: chown}
	err = x.run(r)
	_ = stage.Close()
	if err != nil {
		return x.stats, fail(err)
	}
	after := make([]dirRecord, 0, len(x.spineMeta))
	for _, p := range kept {
		if d, ok := x.spineMeta[p]; ok {
			after = append(after, recordOf(d))
		}
	}
	sw.setAfter(after)
	if err := sw.prepareStage(); err != nil {
		return x.stats, fail(err)
	}
	if err := sw.step(StepStaged); err != nil {
		return x.stats, fail(pathErr(opRestore, ".", err))
	}
	// From here a crash rolls the restore forward.
	if err := sw.setPhase(phaseSwapOut); err != nil {
		return x.stats, fail(err)
	}
	if err := sw.forward(); err != nil {
		if rbErr := sw.backward(); rbErr != nil {
			log.Error("restore: rollback failed; the journal keeps the restore for a recovery",
				zap.String("restore", id), zap.Error(rbErr))
			return x.stats, &errkind.PathError{Op: opRestore, Path: ".", Err: fmt.Errorf(
				"%w: the swap failed (%v) and so did its rollback (%v); restore %s stays incomplete, and archives and fingerprints are refused, until a recovery completes it",
				errkind.ErrInternal, err, rbErr, id)}
		}
		return x.stats, err
	}
	return x.stats, nil
}

// openStage creates the staging directory in the private area and opens
// it as the os.Root the extraction writes through, checking that the
// root it opened is the directory it created.
func (s *swapper) openStage() (*os.Root, error) {
	pfd, err := s.t.dir(PrivateDir)
	if err != nil {
		return nil, pathErr(opRestore, PrivateDir, err)
	}
	if err := ignoreEINTR(func() error { return unix.Mkdirat(pfd, s.j.Stage, 0o700) }); err != nil {
		return nil, pathErr(opRestore, PrivateDir, err)
	}
	// Its entry is fsynced with the rest of the stage's, before the
	// journal says swap-out.
	s.t.touched[PrivateDir] = true
	fd, err := s.t.dir(s.stage)
	if err != nil {
		return nil, pathErr(opRestore, PrivateDir, err)
	}
	stage, err := s.t.root.OpenRoot(s.stage)
	if err != nil {
		return nil, pathErr(opRestore, PrivateDir, err)
	}
	var want unix.Stat_t
	err = unix.Fstat(fd, &want)
	var fi fs.FileInfo
	if err == nil {
		fi, err = stage.Stat(".")
	}
	if got, ok := sysStat(fi); err == nil && (!ok || uint64(want.Dev) != got.Dev || want.Ino != got.Ino) {
		err = errkind.Errorf(errkind.ErrFailedPrecondition, "the staging directory was replaced while it was opened")
	}
	if err != nil {
		_ = stage.Close()
		return nil, pathErr(opRestore, PrivateDir, err)
	}
	return stage, nil
}

// sysStat returns the stat_t behind fi.
func sysStat(fi fs.FileInfo) (*syscall.Stat_t, bool) {
	if fi == nil {
		return nil, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return st, ok
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
