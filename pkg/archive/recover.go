package archive

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// RecoverOptions configures Recover.
type RecoverOptions struct {
	// Logger receives what the recovery did (restore ids, phases, paths,
	// never contents). Nil means no logging.
	Logger *zap.Logger
	// Fault is RestoreOptions.Fault for the steps of the recovery, so that
	// tests can interrupt a recovery too. Nil in production.
	Fault func(Step) error
}

// Outcome says what Recover did with an interrupted restore.
type Outcome int

const (
	// OutcomeNone: no restore was interrupted.
	OutcomeNone Outcome = iota
	// OutcomeRolledForward: the workspace now holds the archive.
	OutcomeRolledForward
	// OutcomeRolledBack: the workspace holds what it held before the
	// restore.
	OutcomeRolledBack
)

// String returns "none", "rolled forward" or "rolled back".
func (o Outcome) String() string {
	switch o {
	case OutcomeRolledForward:
		return "rolled forward"
	case OutcomeRolledBack:
		return "rolled back"
	default:
		return "none"
	}
}

// Recovery reports what Recover did.
type Recovery struct {
	// ID names the interrupted restore ("" when there was none) and Phase
	// is the phase its journal recorded.
	ID    string
	Phase string
	// Outcome is what became of it.
	Outcome Outcome
	// Removed counts leftovers removed that belonged to no restore in
	// progress: a private directory without a journal (or an entry that
	// is not the restore's own at its name), and the top-level staging
	// and backup directories of versions that kept them there.
	Removed int
}

// Recover finishes or undoes a Restore of root that a crash interrupted,
// as its journal says, and removes the leftovers of earlier ones. A
// process that restores workspaces calls it when it starts, before it
// serves anything; Restore calls it itself before it begins, and Write and
// Fingerprint refuse to run while an interrupted restore is incomplete
// (Pending).
//
// A restore whose staging directory was complete (its journal says
// swap-out or later) is rolled forward: the rest of the workspace's
// entries move into the backup and the rest of the staged ones into the
// workspace, so the workspace ends up exactly as the restore would have
// left it. One interrupted earlier (staging) is rolled back: the stage is
// removed and the workspace was never touched. One interrupted while it
// undid a failed swap is undone to the end. The single exception to
// rolling forward is a mount point that appeared since, at a path the
// swap would move: the restore is then rolled back, so that the mount is
// not carried into the backup.
//
// Every directory is reached from root one component at a time without
// following symbolic links, so a link a sandbox process planted in the
// workspace makes the recovery fail (naming it), never leads it elsewhere.
// The journal and the private directory are only trusted when they belong
// to the calling process's effective uid (see PrivateDir).
//
// When the restore cannot be completed (an entry a sandbox process created
// meanwhile is in the way, a planted link, a disk error), Recover returns
// an error wrapping errkind.ErrFailedPrecondition that names the restore
// and the path concerned, and keeps the journal and every directory: call
// it again once the cause is gone. Recover, like Restore, must not run
// concurrently with a Restore of the same workspace.
func Recover(root string, opts RecoverOptions) (Recovery, error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	rt, err := os.OpenRoot(root)
	if err != nil {
		return Recovery{}, pathErr(opRestore, ".", err)
	}
	defer rt.Close()
	t, err := openTree(rt)
	if err != nil {
		return Recovery{}, pathErr(opRestore, ".", err)
	}
	defer t.close()
	return t.recover(log, opts.Fault)
}

// Pending returns the id of an interrupted restore that root's private
// area records, "" when there is none (entries that are not the calling
// process's own are ignored). A journal that cannot be read is an error
// wrapping errkind.ErrFailedPrecondition.
func Pending(root string) (string, error) {
	rt, err := os.OpenRoot(root)
	if err != nil {
		return "", pathErr(opRestore, ".", err)
	}
	defer rt.Close()
	t, err := openTree(rt)
	if err != nil {
		return "", pathErr(opRestore, ".", err)
	}
	defer t.close()
	j, err := t.pending()
	if err != nil {
		return "", unreadableJournal(opRestore, err)
	}
	if j == nil {
		return "", nil
	}
	return j.ID, nil
}

// pending reads the journal of an interrupted restore without acting on
// anything: nil when there is none or when what is there is not ours.
func (t *tree) pending() (*journal, error) {
	pfd, state, err := t.openPrivate()
	if err != nil || state != privateTrusted {
		return nil, err
	}
	j, err := readJournal(pfd)
	if errors.Is(err, errUntrustedJournal) {
		return nil, nil
	}
	return j, err
}

// refuseIncomplete returns the error with which op refuses to read the
// workspace root while an interrupted restore is incomplete, or nil. A
// root that cannot be opened is left for the operation to report.
func refuseIncomplete(op, root string) error {
	rt, err := os.OpenRoot(root)
	if err != nil {
		return nil
	}
	defer rt.Close()
	t, err := openTree(rt)
	if err != nil {
		return nil
	}
	defer t.close()
	j, err := t.pending()
	switch {
	case err != nil:
		return unreadableJournal(op, err)
	case j != nil:
		return incomplete(op, j, nil)
	}
	return nil
}

// incomplete is the error of op when the restore j is incomplete and,
// if cause is set, cannot be completed.
func incomplete(op string, j *journal, cause error) error {
	path := "."
	msg := fmt.Sprintf("restore %s was interrupted (phase %s) and is incomplete", j.ID, j.Phase)
	if cause != nil {
		var pe *errkind.PathError
		if errors.As(cause, &pe) {
			path = pe.Path
			cause = pe.Err
		}
		msg += fmt.Sprintf("; it cannot be completed: %s: %v", orDot(path), cause)
	} else {
		msg += "; Recover completes or undoes it (the daemon does when it starts, and before each archive, fingerprint and restore)"
	}
	return &errkind.PathError{Op: op, Path: path, Err: errkind.Errorf(errkind.ErrFailedPrecondition, "%s", msg)}
}

// unreadableJournal is the error of op when the journal of an interrupted
// restore cannot be read.
func unreadableJournal(op string, err error) error {
	return &errkind.PathError{Op: op, Path: PrivateDir + "/" + journalName, Err: errkind.Errorf(errkind.ErrFailedPrecondition,
		"the journal of an interrupted restore cannot be read (%v); its directories are kept", classify(err))}
}

// recover is Recover on an open tree.
func (t *tree) recover(log *zap.Logger, fault func(Step) error) (Recovery, error) {
	var rec Recovery
	pfd, state, err := t.openPrivate()
	if err != nil {
		return rec, pathErr(opRestore, PrivateDir, err)
	}
	switch state {
	case privateUntrusted:
		log.Warn("restore: removing an entry it does not own at the name of its private directory", zap.String("path", PrivateDir))
		if err := t.remove(PrivateDir); err != nil {
			return rec, refuse(opRestore, PrivateDir, errkind.ErrFailedPrecondition,
				"an entry the restore does not own holds the name of its private directory and cannot be removed (%v)", classify(err))
		}
		rec.Removed++
	case privateTrusted:
		j, err := readJournal(pfd)
		switch {
		case errors.Is(err, errUntrustedJournal):
			log.Warn("restore: ignoring a journal file it does not own", zap.String("path", PrivateDir+"/"+journalName))
			j = nil
		case err != nil:
			return rec, unreadableJournal(opRestore, err)
		}
		if j != nil {
			rec.ID, rec.Phase = j.ID, string(j.Phase)
			rec.Outcome, err = t.settle(j, log, fault)
			if err != nil {
				rec.Outcome = OutcomeNone
				log.Error("restore: an interrupted restore cannot be completed; archive, fingerprint and restore are refused until it is",
					zap.String("restore", j.ID), zap.String("phase", string(j.Phase)), zap.Error(err))
				return rec, incomplete(opRestore, j, err)
			}
			log.Info("restore: recovered an interrupted restore", zap.String("restore", j.ID),
				zap.String("phase", string(j.Phase)), zap.Stringer("outcome", rec.Outcome))
		}
		// Whatever is left belongs to no restore.
		if _, state, err := t.openPrivate(); err == nil && state == privateTrusted {
			if err := t.remove(PrivateDir); err != nil {
				log.Warn("restore: could not remove a private directory without a journal", zap.Error(err))
			} else {
				rec.Removed++
			}
		}
	}
	// The staging and backup directories of versions without a journal
	// (nothing says which tree they hold).
	names, err := t.list("")
	if err != nil {
		log.Warn("restore: could not list the workspace for leftovers", zap.Error(err))
		return rec, nil
	}
	for _, name := range names {
		if !strings.HasPrefix(name, ReservedPrefix+stagePrefix) && !strings.HasPrefix(name, ReservedPrefix+backupPrefix) {
			continue
		}
		if err := t.remove(name); err != nil {
			log.Warn("restore: could not remove a leftover staging directory", zap.String("path", name), zap.Error(err))
			continue
		}
		log.Info("restore: removed a leftover staging directory", zap.String("path", name))
		rec.Removed++
	}
	return rec, nil
}

// settle drives the restore j to its end: forward when its stage was
// complete, else back.
func (t *tree) settle(j *journal, log *zap.Logger, fault func(Step) error) (Outcome, error) {
	s, err := newSwapper(t, j, log, fault)
	if err != nil {
		return OutcomeNone, err
	}
	forward := j.Phase == phaseSwapOut || j.Phase == phaseSwapIn || j.Phase == phaseDone
	if j.Phase == phaseSwapOut {
		// A mount point that appeared since (a restarted sandbox mounts
		// its volumes again) must not be carried into the backup.
		p, err := findMount(t.root, s.keep, s.spine)
		if err != nil {
			return OutcomeNone, pathErr(opRestore, ".", err)
		}
		if p != "" {
			log.Warn("restore: a mount point that is not excluded would be moved; rolling the interrupted restore back",
				zap.String("restore", j.ID), zap.String("path", shown(p)))
			forward = false
		}
	}
	if forward {
		return OutcomeRolledForward, s.forward()
	}
	return OutcomeRolledBack, s.backward()
}
