package archive

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// syncLog records, in order, the fsyncs of a restore's staged entries
// (through the sync hook, from the syncer's goroutines) and the steps of
// its protocol (through the Fault hook).
type syncLog struct {
	mu     sync.Mutex
	events []string
	fail   []string // staged paths whose fsync fails ("" for the stage)
}

func (l *syncLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *syncLog) options(opts RestoreOptions) RestoreOptions {
	opts.hooks.sync = func(rel string) error {
		l.add("sync " + orDot(rel))
		if slices.Contains(l.fail, rel) {
			return errInjectedSync
		}
		return nil
	}
	opts.Fault = func(s Step) error { l.add("step " + s.String()); return nil }
	return opts
}

var errInjectedSync = errors.New("injected fsync failure")

// TestRestoreSyncsStageBeforeSwapOut checks that a restore makes the
// staged tree durable before its journal records swap-out (from which a
// crash, a power loss included, rolls the restore forward and moves the
// stage in): every regular file and every directory of the archive, and
// the staging directory itself, is fsynced once, after the extraction
// began and before the stage is declared complete (StepStaged, then the
// swap-out journal).
func TestRestoreSyncsStageBeforeSwapOut(t *testing.T) {
	root, data, opts := swapFixture(t)
	var l syncLog
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), l.options(opts)); err != nil {
		t.Fatal(err)
	}
	// The fixture's archive, less what its excludes (a/mnt) leave out:
	// files a/new, b and c/d/e; directories a, c and c/d (a stays in the
	// workspace, its staged entries move in one by one); the link l is an
	// entry of the staging directory.
	want := []string{"sync .", "sync a", "sync a/new", "sync b", "sync c", "sync c/d", "sync c/d/e"}
	extract := slices.Index(l.events, "step "+StepExtract)
	staged := slices.Index(l.events, "step "+StepStaged)
	swapOut := slices.Index(l.events, "step "+StepJournal+string(phaseSwapOut))
	if extract < 0 || staged < 0 || swapOut < staged {
		t.Fatalf("steps missing or out of order: %q", l.events)
	}
	var synced []string
	for i, e := range l.events {
		if !strings.HasPrefix(e, "sync ") {
			continue
		}
		if i < extract || i > staged {
			t.Errorf("%s at event %d, want it between %s (%d) and %s (%d): %q", e, i, StepExtract, extract, StepStaged, staged, l.events)
		}
		synced = append(synced, e)
	}
	slices.Sort(synced)
	if !slices.Equal(synced, want) {
		t.Errorf("fsynced %q, want %q", synced, want)
	}
}

// TestRestoreSyncFailureRollsBack checks that a staged entry whose fsync
// fails fails the restore before its swap: the workspace is left as it
// was, with nothing of the restore behind.
func TestRestoreSyncFailureRollsBack(t *testing.T) {
	for _, fail := range []string{"c/d/e", "c/d", ""} {
		t.Run(orDot(fail), func(t *testing.T) {
			root, data, opts := swapFixture(t)
			before := describe(t, root)
			l := syncLog{fail: []string{fail}}
			_, err := Restore(context.Background(), root, bytes.NewReader(data), l.options(opts))
			if !errors.Is(err, errInjectedSync) {
				t.Fatalf("restore with a failing fsync of %s: %v, want the failure", orDot(fail), err)
			}
			if slices.Contains(l.events, "step "+StepStaged) {
				t.Errorf("the stage was declared complete after a failed fsync: %q", l.events)
			}
			requireSame(t, "after a failed fsync", before, describe(t, root))
			requireNoStaging(t, root)
		})
	}
}
