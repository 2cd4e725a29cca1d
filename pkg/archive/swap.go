package archive

import (
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Step names a point of the protocol of Restore and Recover at which the
// Fault hook of their options is called. Name is one of the Step
// constants (StepJournal followed by a phase for the journal's writes); N
// counts the calls with that Name in one Restore or Recover, from 1.
type Step struct {
	Name string
	N    int
}

// String returns "name" or "name#n".
func (s Step) String() string {
	if s.N <= 1 {
		return s.Name
	}
	return fmt.Sprintf("%s#%d", s.Name, s.N)
}

// The steps of a restore, in order. Between them, the workspace, the
// private area and the journal are in a state a recovery can finish.
const (
	// StepJournal + phase: the new journal is written and fsynced under
	// its temporary name, not yet renamed over the previous one. The
	// phases are "staging", "swap-out", "swap-in", "done", and for an
	// undone swap "undo-in" and "undo-out".
	StepJournal = "journal:"
	// StepExtract: the staging directory exists, empty; the archive is
	// about to be read into it.
	StepExtract = "extract"
	// StepStaged: the archive is extracted and checked; the journal still
	// says "staging".
	StepStaged = "staged"
	// StepOut: before the Nth move of a workspace entry into the backup.
	StepOut = "out"
	// StepIn: before the Nth move of a staged entry into the workspace (or
	// of the archive's metadata onto a kept directory).
	StepIn = "in"
	// StepUndoIn: before the Nth move of an entry moved in back to the
	// stage, undoing a failed swap.
	StepUndoIn = "undo-in"
	// StepUndoOut: before the Nth move of a backed-up entry back into the
	// workspace.
	StepUndoOut = "undo-out"
	// StepCleanup: before each removal once the restore is over: the
	// backup and the stage (in that order when it succeeded, the other way
	// when it was undone), then the journal, then the private directory.
	StepCleanup = "cleanup"
)

// swapper replaces the workspace's entries with the staged ones, or puts
// them back, one journaled phase at a time. Each phase is idempotent: what
// it has moved is no longer where it looks, so running it again after a
// crash carries on where it stopped. Within a phase the meaning of every
// entry is known from where it is: in swap-out every workspace entry is old
// (nothing has been moved in yet), in swap-in and undo-in every one is new.
//
// Entries at excluded paths, the workspace's temporary files and the
// private area stay where they are; directories that lead to a preserved
// excluded path (the spine) stay too and have their contents moved one by
// one.
type swapper struct {
	t      *tree
	j      *journal
	keep   excludeSet
	spine  map[string]bool
	after  map[string]dirRecord
	stage  string // root-relative path of the staging directory
	backup string // root-relative path of the backup directory
	log    *zap.Logger
	fault  func(Step) error
	counts map[string]int
}

// newSwapper prepares to drive the restore j recorded.
func newSwapper(t *tree, j *journal, log *zap.Logger, fault func(Step) error) (*swapper, error) {
	keep, err := newExcludeSet(opRestore, j.Exclude)
	if err != nil {
		return nil, err
	}
	s := &swapper{t: t, j: j, keep: keep, spine: make(map[string]bool, len(j.Spine)),
		stage: j.stagePath(), backup: j.backupPath(), log: log, fault: fault, counts: make(map[string]int)}
	for _, p := range j.Spine {
		s.spine[p] = true
	}
	s.setAfter(j.After)
	return s, nil
}

// setAfter records the archive's metadata for the spine.
func (s *swapper) setAfter(after []dirRecord) {
	s.j.After = after
	s.after = make(map[string]dirRecord, len(after))
	for _, d := range after {
		s.after[d.Path] = d
	}
}

// step numbers the next step called name and lets a test hook act there.
func (s *swapper) step(name string) error {
	s.counts[name]++
	if s.fault == nil {
		return nil
	}
	return s.fault(Step{Name: name, N: s.counts[name]})
}

// setPhase makes what the current phase did durable, then records the next
// phase in the journal.
func (s *swapper) setPhase(p phase) error {
	if err := s.t.sync(); err != nil {
		return pathErr(opRestore, ".", err)
	}
	next := *s.j
	next.Phase = p
	if err := s.t.writeJournal(&next, s.step); err != nil {
		return pathErr(opRestore, PrivateDir, err)
	}
	s.j.Phase = p
	return nil
}

// prepareStage makes sure the stage has a directory at every spine path,
// to receive the staged entries below it (the archive may not name
// them), before the swap begins.
func (s *swapper) prepareStage() error {
	for _, p := range s.j.Spine { // parents first
		dir, name := split(p)
		pfd, err := s.t.dir(under(s.stage, dir))
		if err != nil {
			return pathErr(opRestore, p, err)
		}
		var st unix.Stat_t
		err = ignoreEINTR(func() error { return unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			continue
		case err == nil:
			return refuse(opRestore, shown(p), errkind.ErrNotDirectory,
				"the archive has a non-directory where the workspace keeps a directory holding an excluded path")
		case !errors.Is(err, unix.ENOENT):
			return pathErr(opRestore, p, err)
		}
		if err := s.t.mkdirs(join(s.stage, p), 0o700); err != nil {
			return pathErr(opRestore, p, err)
		}
	}
	return nil
}

// forward completes the swap from the journal's phase (swap-out, swap-in
// or done) and removes the backup, the stage and the journal.
func (s *swapper) forward() error {
	if s.j.Phase == phaseSwapOut {
		if err := s.moveOut(""); err != nil {
			return err
		}
		if err := s.setPhase(phaseSwapIn); err != nil {
			return err
		}
	}
	if s.j.Phase == phaseSwapIn {
		if err := s.moveIn(""); err != nil {
			return err
		}
		if err := s.setPhase(phaseDone); err != nil {
			return err
		}
	}
	if s.j.Phase != phaseDone {
		return refuse(opRestore, ".", errkind.ErrInternal, "a restore in phase %s cannot be rolled forward", s.j.Phase)
	}
	s.cleanup(true)
	return nil
}

// backward undoes the swap from the journal's phase (staging, swap-out,
// swap-in or an undo phase), puts the kept directories' metadata back and
// removes the stage, the backup and the journal.
func (s *swapper) backward() error {
	if s.j.Phase == phaseSwapIn {
		if err := s.setPhase(phaseUndoIn); err != nil {
			return err
		}
	}
	if s.j.Phase == phaseUndoIn {
		if err := s.undoIn(""); err != nil {
			return err
		}
		if err := s.setPhase(phaseUndoOut); err != nil {
			return err
		}
	}
	if s.j.Phase == phaseSwapOut {
		if err := s.setPhase(phaseUndoOut); err != nil {
			return err
		}
	}
	if s.j.Phase == phaseUndoOut {
		if err := s.undoOut(""); err != nil {
			return err
		}
	}
	if s.j.Phase != phaseStaging && s.j.Phase != phaseUndoOut {
		return refuse(opRestore, ".", errkind.ErrInternal, "a restore in phase %s cannot be rolled back", s.j.Phase)
	}
	s.cleanup(false)
	return nil
}

// moveOut moves the workspace's entries in rel into the backup.
func (s *swapper) moveOut(rel string) error {
	names, err := s.t.listIfExists(rel)
	if err != nil {
		return pathErr(opRestore, orDot(rel), err)
	}
	slices.Sort(names)
	for _, name := range names {
		p := join(rel, name)
		switch {
		case skipName(rel, name), s.keep.has(p):
			continue
		case s.spine[p]:
			if err := s.moveOut(p); err != nil {
				return err
			}
			continue
		}
		if err := s.step(StepOut); err != nil {
			return pathErr(opRestore, p, err)
		}
		if err := s.t.mkdirs(under(s.backup, rel), 0o700); err != nil {
			return pathErr(opRestore, p, err)
		}
		if err := s.rename(p, join(s.backup, p)); err != nil {
			return pathErr(opRestore, p, err)
		}
	}
	return nil
}

// moveIn moves the staged entries in rel into the workspace, then gives a
// spine directory rel the archive's metadata.
func (s *swapper) moveIn(rel string) error {
	names, err := s.t.listIfExists(under(s.stage, rel))
	if err != nil {
		return pathErr(opRestore, orDot(rel), err)
	}
	slices.Sort(names)
	for _, name := range names {
		p := join(rel, name)
		if s.spine[p] {
			// Kept in place; recreated should a sandbox process have
			// removed it meanwhile.
			if err := s.t.mkdirs(p, 0o755); err != nil {
				return pathErr(opRestore, p, err)
			}
			if err := s.moveIn(p); err != nil {
				return err
			}
			continue
		}
		if err := s.step(StepIn); err != nil {
			return pathErr(opRestore, p, err)
		}
		if err := s.rename(join(s.stage, p), p); err != nil {
			return pathErr(opRestore, p, err)
		}
	}
	if d, ok := s.after[rel]; ok && rel != "" {
		if err := s.step(StepIn); err != nil {
			return pathErr(opRestore, rel, err)
		}
		if err := s.t.setDir(rel, d, s.j.Chown, true); err != nil {
			return pathErr(opRestore, rel, err)
		}
	}
	return nil
}

// undoIn moves the entries in rel that the swap moved in back into the
// stage. A spine directory gets its mode and owner back first, so that it
// can be written again.
func (s *swapper) undoIn(rel string) error {
	names, err := s.t.listIfExists(rel)
	if err != nil {
		return pathErr(opRestore, orDot(rel), err)
	}
	slices.Sort(names)
	for _, name := range names {
		p := join(rel, name)
		switch {
		case skipName(rel, name), s.keep.has(p):
			continue
		case s.spine[p]:
			if err := s.restoreBefore(p); err != nil {
				return pathErr(opRestore, p, err)
			}
			if err := s.undoIn(p); err != nil {
				return err
			}
			continue
		}
		if err := s.step(StepUndoIn); err != nil {
			return pathErr(opRestore, p, err)
		}
		if err := s.t.mkdirs(under(s.stage, rel), 0o700); err != nil {
			return pathErr(opRestore, p, err)
		}
		if err := s.rename(p, join(s.stage, p)); err != nil {
			return pathErr(opRestore, p, err)
		}
	}
	return nil
}

// undoOut moves the backed-up entries in rel back into the workspace.
func (s *swapper) undoOut(rel string) error {
	names, err := s.t.listIfExists(under(s.backup, rel))
	if err != nil {
		return pathErr(opRestore, orDot(rel), err)
	}
	slices.Sort(names)
	for _, name := range names {
		p := join(rel, name)
		if s.spine[p] { // a container the swap made in the backup
			if err := s.t.mkdirs(p, 0o755); err != nil {
				return pathErr(opRestore, p, err)
			}
			if err := s.undoOut(p); err != nil {
				return err
			}
			continue
		}
		if err := s.step(StepUndoOut); err != nil {
			return pathErr(opRestore, p, err)
		}
		if err := s.rename(join(s.backup, p), p); err != nil {
			return pathErr(opRestore, p, err)
		}
	}
	return nil
}

// restoreBefore gives the kept directory p the metadata it had before the
// restore (the root only its times).
func (s *swapper) restoreBefore(p string) error {
	for _, d := range s.j.Before {
		if d.Path == p {
			return s.t.setDir(p, d, p != "" && unix.Geteuid() == 0, p != "")
		}
	}
	return nil
}

// cleanup removes what the restore leaves once it is over: the backup and
// the stage, the journal (the restore is then over for a recovery too) and
// the private directory. When the restore was undone, the kept
// directories get their metadata back before the journal goes (the moves
// changed their times), and the root its times once more at the very end
// (the removals changed them). Failures are logged: what stays behind
// holds no part of the workspace, and a later recovery removes it.
func (s *swapper) cleanup(forward bool) {
	// What the last phase moved is made durable before anything is
	// removed: after a rollback the journal (undo-out) was written before
	// the backup's entries moved back, and its removal must not outlive
	// them.
	if err := s.t.sync(); err != nil {
		s.log.Warn("restore: could not make the last moves durable", zap.Error(err))
	}
	dirs := []string{s.backup, s.stage}
	if !forward {
		dirs = []string{s.stage, s.backup}
	}
	for _, name := range dirs {
		s.cleanupStep()
		if err := s.t.remove(name); err != nil {
			s.log.Warn("restore: could not remove a staging directory", zap.String("path", name), zap.Error(err))
		}
	}
	if !forward {
		for i := len(s.j.Spine) - 1; i >= -1; i-- { // deepest first, the root last
			p := ""
			if i >= 0 {
				p = s.j.Spine[i]
			}
			s.resetBefore(p)
		}
	}
	s.cleanupStep()
	if err := s.t.removeJournal(); err != nil {
		s.log.Warn("restore: could not remove the journal", zap.Error(err))
	}
	s.cleanupStep()
	if err := s.t.remove(PrivateDir); err != nil {
		s.log.Warn("restore: could not remove its private directory", zap.Error(err))
	}
	if !forward {
		s.resetBefore("")
	}
}

// resetBefore is restoreBefore with failures logged.
func (s *swapper) resetBefore(p string) {
	if err := s.restoreBefore(p); err != nil {
		s.log.Warn("restore: could not reset directory metadata", zap.String("path", shown(orDot(p))), zap.Error(err))
	}
}

// cleanupStep calls the fault hook before a removal; an error it returns
// is logged and ignored, as removal failures are.
func (s *swapper) cleanupStep() {
	if err := s.step(StepCleanup); err != nil {
		s.log.Warn("restore: cleanup step failed", zap.Error(err))
	}
}

// rename moves from to to (both relative to the root), never replacing an
// existing entry. A directory that its owner may not write (which the
// kernel requires to move it to another parent, unless we are root) is
// made writable for the move and given its mode back afterwards.
func (s *swapper) rename(from, to string) error {
	fromDir, fromName := split(from)
	toDir, toName := split(to)
	ffd, err := s.t.dir(fromDir)
	if err != nil {
		return err
	}
	tfd, err := s.t.dir(toDir)
	if err != nil {
		return err
	}
	s.t.touched[fromDir], s.t.touched[toDir] = true, true
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

// under returns the path of the workspace-relative rel ("" for the root)
// below the root-relative directory base.
func under(base, rel string) string {
	if rel == "" {
		return base
	}
	return base + "/" + rel
}
