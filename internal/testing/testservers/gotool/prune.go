package gotool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// StaleAfter is how long a cache entry of another version may go unused
// before PruneStale removes it: long enough that switching between two
// checkouts does not rebuild (a Kubernetes build is ~12 CPU-minutes), short
// enough that superseded versions (~1 GB each for Kubernetes) do not pile
// up in developers' caches.
const StaleAfter = 30 * 24 * time.Hour

// usedMark is the file whose modification time says when an entry was last
// used; it is refreshed at most once per usedEvery.
const (
	usedMark  = ".used"
	usedEvery = time.Hour
)

// MarkUsed records that the cache entry dir is in use now, so PruneStale
// keeps it. It writes at most once an hour and ignores failures (a
// read-only cache is still usable; its entries are just never pruned as
// unused by another process).
func MarkUsed(dir string, now time.Time) {
	mark := filepath.Join(dir, usedMark)
	if fi, err := os.Stat(mark); err == nil && now.Sub(fi.ModTime()) < usedEvery {
		return
	}
	f, err := os.OpenFile(mark, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	f.Close()
	_ = os.Chtimes(mark, now, now)
}

// lastUsed is when entry was last marked used, or else when it was last
// changed (built).
func lastUsed(entry string) (time.Time, error) {
	if fi, err := os.Stat(filepath.Join(entry, usedMark)); err == nil {
		return fi.ModTime(), nil
	}
	fi, err := os.Stat(entry)
	if err != nil {
		return time.Time{}, err
	}
	return fi.ModTime(), nil
}

// PruneStale removes the cache entries in base whose names start with
// prefix, other than keep, that were not used for maxAge: the builds of
// versions (or build recipes) a checkout no longer asks for. An entry is
// first renamed out of the way (so no Cached call sees it half removed),
// then removed; a program already running from it is not disturbed. It
// returns the names it removed.
func PruneStale(base, prefix, keep string, maxAge time.Duration, now time.Time) ([]string, error) {
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("prune %s: %w", base, err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() && strings.HasPrefix(name, ".stale-") {
			_ = os.RemoveAll(filepath.Join(base, name)) // a prune that died half way
			continue
		}
		if !e.IsDir() || name == keep || !strings.HasPrefix(name, prefix) {
			continue
		}
		entry := filepath.Join(base, name)
		used, err := lastUsed(entry)
		if err != nil || now.Sub(used) < maxAge {
			continue
		}
		gone, err := os.MkdirTemp(base, ".stale-")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Rename(entry, filepath.Join(gone, name)); err != nil {
			_ = os.Remove(gone)
			errs = append(errs, fmt.Errorf("prune %s: %w", name, err))
			continue
		}
		if err := os.RemoveAll(gone); err != nil {
			errs = append(errs, fmt.Errorf("prune %s: %w", name, err))
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
