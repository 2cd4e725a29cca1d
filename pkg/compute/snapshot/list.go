package snapshot

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Lister is a Store that can enumerate its snapshots and describe one.
// Local and s3store.Store are Listers.
type Lister interface {
	Store
	// List calls fn for each snapshot, by id; fn's error stops the
	// listing and is returned. Info may lack Size and Chunks (Stat has
	// them).
	List(ctx context.Context, fn func(Info) error) error
	// Stat describes one snapshot (errkind.ErrNotFound when absent).
	Stat(ctx context.Context, id string) (Info, error)
}

var _ Lister = (*Local)(nil)

// List calls fn for each snapshot in the directory, by id.
func (l *Local) List(_ context.Context, fn func(Info) error) error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), snapshotSuffix)
		if !ok || !e.Type().IsRegular() || ValidateID(id) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed since the listing
		}
		if err := fn(Info{ID: id, Size: fi.Size(), Modified: fi.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

// Stat describes the snapshot stored under id (its size and time; the
// digest is not computed).
func (l *Local) Stat(_ context.Context, id string) (Info, error) {
	if err := ValidateID(id); err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(l.path(id))
	if err != nil {
		return Info{}, classify("stat", id, err)
	}
	return Info{ID: id, Size: fi.Size(), Modified: fi.ModTime()}, nil
}
