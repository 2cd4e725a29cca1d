// Package snapshot stores workspace archives between sandbox lifetimes. A
// Store keeps opaque byte streams (the daemon's Archive output) under
// caller-chosen ids; the local-directory store is the reference
// implementation, and remote stores implement the same interface so
// callers do not change: the S3-compatible one is package s3store, apart
// so that a program using only local snapshots links no AWS code.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Store keeps snapshots by id. Implementations must be safe for concurrent
// use, and Put must be atomic: a reader sees either no snapshot or a
// complete one, never a partial write, and a failed Put leaves any earlier
// snapshot with the same id intact.
type Store interface {
	// Put stores the bytes of r under id, replacing an existing snapshot
	// only once r was read completely.
	Put(ctx context.Context, id string, r io.Reader) (Info, error)
	// Get opens the snapshot for reading (errkind.ErrNotFound when absent).
	Get(ctx context.Context, id string) (io.ReadCloser, error)
	// Exists reports whether a snapshot is stored under id.
	Exists(ctx context.Context, id string) (bool, error)
	// Delete removes the snapshot; deleting an absent one is not an error.
	Delete(ctx context.Context, id string) error
}

// ErrCorrupt reports stored snapshot data that fails its checks: a chunk
// whose content does not match its SHA-256, a missing chunk, a manifest
// that does not decode. Retrying does not help; the snapshot must be taken
// again.
var ErrCorrupt = errors.New("snapshot data is corrupt")

// Info describes a stored snapshot.
type Info struct {
	ID string
	// Size is the length of the stream Put read (zero when a listing does
	// not say; Stat fills it).
	Size int64
	// SHA256 is the hex digest of the stream Put read.
	SHA256 string
	// Modified is when the snapshot was stored (zero when unknown).
	Modified time.Time
	// Chunks, Uploaded and Reused describe a content-addressed store's
	// copy: its number of chunks, the bytes Put sent (new chunks,
	// compressed, and the manifest), and how many chunks it found stored
	// already. Zero for the local store.
	Chunks   int
	Uploaded int64
	Reused   int
}

// idPattern accepts ids that are a single, portable path segment (and a
// valid object key for remote stores): no separators, no dot-only names.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateID checks that id can name a snapshot in every store.
func ValidateID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("%w: snapshot id %q: use 1-128 characters from [A-Za-z0-9._-], starting with a letter or digit", errkind.ErrInvalidArgument, id)
	}
	return nil
}

// Noop is a Store that keeps nothing: Put discards (after reading r, so
// producers finish), Get finds nothing. For sessions that must not persist.
type Noop struct{}

// Put reads and discards r.
func (Noop) Put(_ context.Context, id string, r io.Reader) (Info, error) {
	if err := ValidateID(id); err != nil {
		return Info{}, err
	}
	n, err := io.Copy(io.Discard, r)
	return Info{ID: id, Size: n}, err
}

// Get always reports errkind.ErrNotFound.
func (Noop) Get(_ context.Context, id string) (io.ReadCloser, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("snapshot %s: %w (the no-op store keeps nothing)", id, errkind.ErrNotFound)
}

// Exists always reports false.
func (Noop) Exists(_ context.Context, id string) (bool, error) { return false, ValidateID(id) }

// Delete does nothing.
func (Noop) Delete(_ context.Context, id string) error { return ValidateID(id) }
