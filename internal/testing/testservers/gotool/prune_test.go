package gotool

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestPruneStale removes the entries of other versions unused for longer
// than the limit, keeps the current one however old, a recently used old
// one, other programs' entries and plain files, and clears a prune that
// died half way.
func TestPruneStale(t *testing.T) {
	base := t.TempDir()
	now := time.Now()
	old := now.Add(-2 * StaleAfter)
	mk := func(name string, modTime time.Time) string {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "prog"), []byte("bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(dir, modTime, modTime); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	mk("prog-v2-linux-amd64", old)           // the current version: kept however old
	mk("prog-v1-linux-amd64", old)           // stale: removed
	recent := mk("prog-v0-linux-amd64", old) // built long ago but used lately: kept
	mk("other-v1-linux-amd64", old)          // another program: not this prune's
	mk(".stale-123", now)                    // a prune that died half way: removed
	if err := os.WriteFile(filepath.Join(base, "prog-v1.lock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	MarkUsed(recent, now.Add(-time.Hour))
	if err := os.Chtimes(recent, old, old); err != nil { // MarkUsed touched the directory
		t.Fatal(err)
	}

	removed, err := PruneStale(base, "prog-", "prog-v2-linux-amd64", StaleAfter, now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{"prog-v1-linux-amd64"}) {
		t.Errorf("removed %q, want only prog-v1-linux-amd64", removed)
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"other-v1-linux-amd64", "prog-v0-linux-amd64", "prog-v1.lock", "prog-v2-linux-amd64"}
	if !slices.Equal(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}

	// MarkUsed refreshes a mark an hour old, and not one a minute old.
	MarkUsed(recent, now)
	mark := filepath.Join(recent, usedMark)
	if fi, err := os.Stat(mark); err != nil || !fi.ModTime().Equal(now) {
		t.Fatalf("a mark an hour old was not refreshed: %v", err)
	}
	MarkUsed(recent, now.Add(time.Minute))
	if fi, _ := os.Stat(mark); !fi.ModTime().Equal(now) {
		t.Errorf("MarkUsed rewrote a fresh mark: %v", fi.ModTime())
	}

	// A missing cache is not an error.
	if got, err := PruneStale(filepath.Join(base, "none"), "prog-", "", StaleAfter, now); err != nil || got != nil {
		t.Errorf("missing base: %q, %v", got, err)
	}
}
