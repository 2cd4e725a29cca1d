package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// pinTimes gives every entry below root (not root itself) the same
// modification and access time, so that two instances of a fixture
// describe alike.
func pinTimes(t testing.TB, root string) {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err == nil && p != root {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := []unix.Timespec{{Sec: 1600000000}, {Sec: 1600000000}}
	for i := len(paths) - 1; i >= 0; i-- { // children before their parents
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
}

// crashFixture is a swapFixture whose instances are identical: the old
// tree it starts with, the new tree an uninterrupted restore makes of it,
// and every step that restore goes through.
type crashFixture struct {
	data     []byte
	opts     RestoreOptions
	old, new map[string]string
	steps    []Step
}

// newCrashFixture builds the fixture and runs the reference restore.
func newCrashFixture(t *testing.T) *crashFixture {
	t.Helper()
	root, data, opts := swapFixture(t)
	pinTimes(t, root)
	f := &crashFixture{data: data, opts: opts, old: describe(t, root)}
	o := opts
	o.Fault = func(s Step) error { f.steps = append(f.steps, s); return nil }
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), o); err != nil {
		t.Fatal(err)
	}
	f.new = describe(t, root)
	if len(diff(f.old, f.new)) == 0 {
		t.Fatal("the restore changes nothing")
	}
	return f
}

// instance returns a fresh workspace holding the old tree.
func (f *crashFixture) instance(t *testing.T) string {
	t.Helper()
	root, _, _ := swapFixture(t)
	pinTimes(t, root)
	requireSame(t, "a new instance of the fixture", f.old, describe(t, root))
	return root
}

// index returns the position of s among the reference restore's steps.
func (f *crashFixture) index(t *testing.T, s Step) int {
	t.Helper()
	i := slices.Index(f.steps, s)
	if i < 0 {
		t.Fatalf("the restore has no step %v", s)
	}
	return i
}

// stopsAt returns a Fault hook that ends the calling goroutine at step
// at, as if the process died there: nothing after it runs, not even a
// rollback (deferred descriptor closes aside).
func stopsAt(at Step) func(Step) error {
	return func(s Step) error {
		if s == at {
			runtime.Goexit()
		}
		return nil
	}
}

// runDying runs f in its own goroutine and reports whether it died in a
// Fault hook (runtime.Goexit) rather than returning.
func runDying(f func()) (died bool) {
	done := make(chan bool)
	go func() {
		returned := false
		defer func() { done <- !returned }()
		f()
		returned = true
	}()
	return <-done
}

// restoreDyingAt runs a restore of the fixture into root that dies at
// step at (or at what fault decides when it is set), and fails unless it
// did die.
func (f *crashFixture) restoreDyingAt(t *testing.T, root string, fault func(Step) error) {
	t.Helper()
	opts := f.opts
	opts.Fault = fault
	var err error
	if !runDying(func() { _, err = Restore(context.Background(), root, bytes.NewReader(f.data), opts) }) {
		t.Fatalf("the restore did not die (error %v)", err)
	}
}

// requireRecovered runs Recover as a restarted daemon does and checks that
// the workspace is exactly the old or the new tree, as want says, with no
// leftover and no pending restore.
func (f *crashFixture) requireRecovered(t *testing.T, what, root string, wantNew bool) Recovery {
	t.Helper()
	rec, err := Recover(root, RecoverOptions{})
	if err != nil {
		t.Fatalf("%s: Recover: %v", what, err)
	}
	want, name := f.old, "the old tree"
	if wantNew {
		want, name = f.new, "the new tree"
	}
	if d := diff(want, describe(t, root)); len(d) > 0 {
		t.Fatalf("%s: the workspace is not exactly %s:\n%s", what, name, strings.Join(d, "\n"))
	}
	requireNoStaging(t, root)
	if id, err := Pending(root); id != "" || err != nil {
		t.Fatalf("%s: Pending = %q, %v after the recovery", what, id, err)
	}
	return rec
}

// requireRefused checks that Write and Fingerprint refuse with
// errkind.ErrFailedPrecondition naming the restore id.
func requireRefused(t *testing.T, what, root, id string) {
	t.Helper()
	var buf bytes.Buffer
	_, werr := Write(context.Background(), root, &buf, WriteOptions{})
	_, ferr := Fingerprint(context.Background(), root, FingerprintOptions{})
	for _, err := range []error{werr, ferr} {
		if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), id) {
			t.Fatalf("%s: %v, want a failed precondition naming restore %s", what, err, id)
		}
	}
	if buf.Len() != 0 {
		t.Fatalf("%s: Write wrote %d bytes before refusing", what, buf.Len())
	}
}

// TestCrashAtEveryStepRecovers kills a restore at every step it goes
// through (every move of the swap included) and recovers as a restarted
// daemon does: the workspace is then exactly the old tree when the stage
// was not yet complete, exactly the new one after, and nothing is left
// behind. Until the recovery, Write and Fingerprint refuse.
func TestCrashAtEveryStepRecovers(t *testing.T) {
	f := newCrashFixture(t)
	forwardFrom := f.index(t, Step{Name: StepJournal + string(phaseSwapOut), N: 1}) + 1
	journaled := f.index(t, Step{Name: StepJournal + string(phaseStaging), N: 1}) + 1
	journalGone := f.index(t, Step{Name: StepCleanup, N: 4})
	for i, at := range f.steps {
		root := f.instance(t)
		f.restoreDyingAt(t, root, stopsAt(at))
		id, err := Pending(root)
		if err != nil {
			t.Fatalf("crash at %v: Pending: %v", at, err)
		}
		if (id != "") != (i >= journaled && i < journalGone) {
			t.Fatalf("crash at %v: Pending = %q", at, id)
		}
		if id != "" {
			requireRefused(t, "crash at "+at.String(), root, id)
		}
		rec := f.requireRecovered(t, "crash at "+at.String(), root, i >= forwardFrom)
		if id != "" && (rec.ID != id || (rec.Outcome == OutcomeRolledForward) != (i >= forwardFrom)) {
			t.Fatalf("crash at %v: recovery %+v", at, rec)
		}
	}
}

// TestCrashDuringRecoveryRecovers kills a restore mid-swap, then kills its
// recovery at every step, and recovers again: the workspace ends exactly
// the new tree.
func TestCrashDuringRecoveryRecovers(t *testing.T) {
	f := newCrashFixture(t)
	for _, first := range []Step{{Name: StepOut, N: 2}, {Name: StepIn, N: 2}} {
		// The steps of a recovery from this point.
		var steps []Step
		root := f.instance(t)
		f.restoreDyingAt(t, root, stopsAt(first))
		if _, err := Recover(root, RecoverOptions{Fault: func(s Step) error { steps = append(steps, s); return nil }}); err != nil {
			t.Fatal(err)
		}
		if len(steps) < 5 {
			t.Fatalf("recovery from %v: only steps %v", first, steps)
		}
		for _, second := range steps {
			what := "crash at " + first.String() + " then at " + second.String()
			root := f.instance(t)
			f.restoreDyingAt(t, root, stopsAt(first))
			if !runDying(func() { _, _ = Recover(root, RecoverOptions{Fault: stopsAt(second)}) }) {
				t.Fatalf("%s: the recovery did not die", what)
			}
			f.requireRecovered(t, what, root, true)
		}
	}
}

// TestCrashDuringRollbackRecovers fails a swap (so that Restore undoes
// it) and kills the rollback at every step: once the journal records the
// rollback, the recovery finishes it and the workspace is exactly the old
// tree; killed before (while that journal is being written), the journal
// still says the stage is complete, and the recovery rolls forward to
// exactly the new tree.
func TestCrashDuringRollbackRecovers(t *testing.T) {
	f := newCrashFixture(t)
	injected := errors.New("injected failure")
	for _, fail := range []Step{{Name: StepOut, N: 3}, {Name: StepIn, N: 3}} {
		failing := func(record func(Step)) func(Step) error {
			return func(s Step) error {
				if s == fail {
					return injected
				}
				record(s)
				return nil
			}
		}
		var undo []Step
		root := f.instance(t)
		opts := f.opts
		opts.Fault = failing(func(s Step) {
			if strings.HasPrefix(s.Name, "undo") || strings.HasPrefix(s.Name, StepJournal+"undo") || s.Name == StepCleanup {
				undo = append(undo, s)
			}
		})
		if _, err := Restore(context.Background(), root, bytes.NewReader(f.data), opts); !errors.Is(err, injected) {
			t.Fatalf("failing at %v: %v", fail, err)
		}
		requireSame(t, "after a failed swap", f.old, describe(t, root))
		if len(undo) < 4 || !strings.HasPrefix(undo[0].Name, StepJournal) {
			t.Fatalf("failing at %v: rollback steps %v", fail, undo)
		}
		for i, at := range undo {
			what := "failing at " + fail.String() + ", crash at " + at.String()
			root := f.instance(t)
			f.restoreDyingAt(t, root, failing(func(s Step) {
				if s == at {
					runtime.Goexit()
				}
			}))
			f.requireRecovered(t, what, root, i == 0)
		}
	}
}

// TestBadArchiveLeavesOldTreeAndNoLeftovers restores archives that fail
// (garbage, truncated, a member that escapes, too many members): each
// time the workspace is exactly as it was, with no private area, staging
// or backup directory left and no restore pending.
func TestBadArchiveLeavesOldTreeAndNoLeftovers(t *testing.T) {
	f := newCrashFixture(t)
	root := f.instance(t)
	for name, c := range map[string]struct {
		data []byte
		opts RestoreOptions
	}{
		"garbage":   {data: []byte("not an archive at all"), opts: f.opts},
		"truncated": {data: f.data[:len(f.data)/2], opts: f.opts},
		"escape":    {data: craft(t, true, tm{name: "ok", body: "1"}, tm{name: "../out", body: "2"}), opts: f.opts},
		"too many": {data: craft(t, false, tm{name: "x1", body: "1"}, tm{name: "x2", body: "2"}, tm{name: "x3", body: "3"}),
			opts: RestoreOptions{Exclude: f.opts.Exclude, Limits: Limits{MaxMembers: 2}}},
	} {
		if _, err := Restore(context.Background(), root, bytes.NewReader(c.data), c.opts); err == nil {
			t.Fatalf("%s: no error", name)
		}
		requireSame(t, name, f.old, describe(t, root))
		requireNoStaging(t, root)
		if id, err := Pending(root); id != "" || err != nil {
			t.Fatalf("%s: Pending = %q, %v", name, id, err)
		}
	}
}

// TestRecoverRemovesLeftovers checks that a recovery reclaims what no
// journal accounts for: a private directory without a journal (with its
// stage and backup) and the top-level staging and backup directories
// earlier versions left, and nothing else.
func TestRecoverRemovesLeftovers(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "keep.txt"), "kept\n", 0o644)
	writeFile(t, filepath.Join(root, ReservedPrefix+"stage-0123456789abcdef/f"), "staged\n", 0o644)
	writeFile(t, filepath.Join(root, ReservedPrefix+"backup-0123456789abcdef/d/f"), "backed up\n", 0o644)
	writeFile(t, filepath.Join(root, PrivateDir, "stage-fedcba9876543210/f"), "x\n", 0o644)
	writeFile(t, filepath.Join(root, PrivateDir, "backup-fedcba9876543210/f"), "x\n", 0o644)
	writeFile(t, filepath.Join(root, PrivateDir, journalTemp), "{", 0o600)
	if err := os.Chmod(filepath.Join(root, PrivateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	rec, err := Recover(root, RecoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Removed != 3 || rec.ID != "" || rec.Outcome != OutcomeNone {
		t.Fatalf("recovery %+v, want 3 leftovers removed", rec)
	}
	requireNoStaging(t, root)
	if b, err := os.ReadFile(filepath.Join(root, "keep.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("keep.txt: %q, %v", b, err)
	}
}

// TestArchiveRefusedWhileRestoreIncomplete checks that Write and
// Fingerprint refuse while a killed restore is incomplete, and work again
// once it is recovered.
func TestArchiveRefusedWhileRestoreIncomplete(t *testing.T) {
	f := newCrashFixture(t)
	root := f.instance(t)
	f.restoreDyingAt(t, root, stopsAt(Step{Name: StepOut, N: 2}))
	id, err := Pending(root)
	if err != nil || id == "" {
		t.Fatalf("Pending = %q, %v", id, err)
	}
	requireRefused(t, "mid-swap", root, id)
	f.requireRecovered(t, "mid-swap", root, true)
	if _, err := Write(context.Background(), root, &bytes.Buffer{}, WriteOptions{}); err != nil {
		t.Fatalf("Write after the recovery: %v", err)
	}
}

// TestRecoverRefusesWhatIsInTheWay creates, after a crash mid-swap, an
// entry where a staged one must go (a sandbox process writing during the
// restore): the recovery refuses, naming it and the restore, and keeps
// everything; so do Write, Fingerprint and a new Restore. Once the entry
// is gone the recovery completes the restore.
func TestRecoverRefusesWhatIsInTheWay(t *testing.T) {
	f := newCrashFixture(t)
	root := f.instance(t)
	f.restoreDyingAt(t, root, stopsAt(Step{Name: StepIn, N: 1}))
	id, _ := Pending(root)
	writeFile(t, filepath.Join(root, "b"), "written by a sandbox process meanwhile\n", 0o644)
	_, err := Recover(root, RecoverOptions{})
	requirePathError(t, err, errkind.ErrFailedPrecondition, "b")
	if !strings.Contains(err.Error(), id) {
		t.Fatalf("the error %q does not name restore %s", err, id)
	}
	requireRefused(t, "blocked recovery", root, id)
	_, err = Restore(context.Background(), root, bytes.NewReader(f.data), f.opts)
	requirePathError(t, err, errkind.ErrFailedPrecondition, "b")
	if err := os.Remove(filepath.Join(root, "b")); err != nil {
		t.Fatal(err)
	}
	f.requireRecovered(t, "once the way is clear", root, true)
}

// TestRecoveryNeverFollowsPlantedSymlink replaces, after a crash mid-swap,
// a directory the recovery must enter (one that holds an excluded path)
// with a symbolic link to a directory outside the workspace: the recovery
// refuses, naming it, and writes nothing outside. With the directory put
// back the recovery completes.
func TestRecoveryNeverFollowsPlantedSymlink(t *testing.T) {
	f := newCrashFixture(t)
	root := f.instance(t)
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "mnt/sentinel"), "outside\n", 0o644)
	outBefore := describe(t, outside)
	f.restoreDyingAt(t, root, stopsAt(Step{Name: StepIn, N: 1}))
	if err := os.Rename(filepath.Join(root, "a"), filepath.Join(root, "a-moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	_, err := Recover(root, RecoverOptions{})
	requirePathError(t, err, errkind.ErrFailedPrecondition, "a")
	requireSame(t, "outside the workspace", outBefore, describe(t, outside))
	if id, _ := Pending(root); id == "" {
		t.Fatal("the refused recovery dropped the journal")
	}
	if err := os.Remove(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "a-moved"), filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	f.requireRecovered(t, "with the directory back", root, true)
	requireSame(t, "outside the workspace", outBefore, describe(t, outside))
}

// TestForgedJournalIsIgnored plants journals a sandbox process could
// write: a private directory others may write (or a link to one outside
// the workspace), and a journal file that is not the restorer's own. A
// trusted journal like these would move the planted stage's entries into
// the workspace; the recovery removes them instead, and the workspace is
// untouched. Neither makes Write refuse.
func TestForgedJournalIsIgnored(t *testing.T) {
	forge := func(t *testing.T, dir string) {
		const id = "0123456789abcdef"
		writeFile(t, filepath.Join(dir, stagePrefix+id, "pwned"), "from the forger\n", 0o644)
		j := &journal{Version: journalVersion, ID: id, Phase: phaseSwapIn, Stage: stagePrefix + id, Backup: backupPrefix + id}
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, journalName), string(b), 0o600)
	}
	cases := map[string]func(t *testing.T, root string){
		"private directory open to others": func(t *testing.T, root string) {
			forge(t, filepath.Join(root, PrivateDir))
			if err := os.Chmod(filepath.Join(root, PrivateDir), 0o777); err != nil {
				t.Fatal(err)
			}
		},
		"link to a directory outside": func(t *testing.T, root string) {
			outside := t.TempDir()
			forge(t, outside)
			if err := os.Chmod(outside, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(root, PrivateDir)); err != nil {
				t.Fatal(err)
			}
			before := describe(t, outside)
			t.Cleanup(func() { requireSame(t, "the directory the link led to", before, describe(t, outside)) })
		},
		"journal open to others": func(t *testing.T, root string) {
			forge(t, filepath.Join(root, PrivateDir))
			if err := os.Chmod(filepath.Join(root, PrivateDir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(root, PrivateDir, journalName), 0o666); err != nil {
				t.Fatal(err)
			}
		},
	}
	if os.Geteuid() == 0 {
		cases["private directory of another user"] = func(t *testing.T, root string) {
			forge(t, filepath.Join(root, PrivateDir))
			p := filepath.Join(root, PrivateDir)
			if err := os.Chmod(p, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{p, filepath.Join(p, journalName)} {
				if err := os.Lchown(q, 4242, 4242); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for name, plant := range cases {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			writeFile(t, filepath.Join(root, "work.txt"), "the workspace\n", 0o644)
			plant(t, root)
			if id, err := Pending(root); id != "" || err != nil {
				t.Fatalf("Pending = %q, %v", id, err)
			}
			if _, err := Write(context.Background(), root, &bytes.Buffer{}, WriteOptions{}); err != nil {
				t.Fatalf("Write: %v", err)
			}
			rec, err := Recover(root, RecoverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rec.ID != "" || rec.Outcome != OutcomeNone || rec.Removed != 1 {
				t.Fatalf("recovery %+v", rec)
			}
			if _, err := os.Lstat(filepath.Join(root, "pwned")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the forged stage reached the workspace: %v", err)
			}
			requireNoStaging(t, root)
			if b, err := os.ReadFile(filepath.Join(root, "work.txt")); err != nil || string(b) != "the workspace\n" {
				t.Fatalf("work.txt: %q, %v", b, err)
			}
		})
	}
}

// TestRecoverRollsBackOverNewMount mounts a filesystem, after a crash in
// swap-out, on a directory the swap has yet to move (a restarted sandbox
// mounting its volumes again): the recovery rolls the restore back rather
// than carry the mount into the backup, and the mount stays in place.
func TestRecoverRollsBackOverNewMount(t *testing.T) {
	f := newCrashFixture(t)
	root := f.instance(t)
	f.restoreDyingAt(t, root, stopsAt(Step{Name: StepOut, N: 1}))
	mountTmpfs(t, filepath.Join(root, "ro"))
	writeFile(t, filepath.Join(root, "ro/mounted"), "on the mount\n", 0o600)
	rec, err := Recover(root, RecoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != OutcomeRolledBack {
		t.Fatalf("recovery %+v, want rolled back", rec)
	}
	if b, err := os.ReadFile(filepath.Join(root, "ro/mounted")); err != nil || string(b) != "on the mount\n" {
		t.Fatalf("mounted file: %q, %v", b, err)
	}
	if err := unix.Unmount(filepath.Join(root, "ro"), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	requireSame(t, "the workspace once unmounted", f.old, describe(t, root))
	requireNoStaging(t, root)
}
