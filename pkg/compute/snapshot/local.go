package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// snapshotSuffix names stored snapshots; tempPrefix names writes in progress.
const (
	snapshotSuffix = ".snapshot"
	tempPrefix     = ".tmp-"
)

// Local is a Store in a directory on the harness's host. Each snapshot is
// one file, written to a temporary file in the same directory, fsynced,
// renamed into place, and the directory fsynced: a crash leaves either the
// old snapshot or the new one.
type Local struct {
	dir string
}

// NewLocal opens (creating it with mode 0700 if needed) a snapshot
// directory, and removes temporary files that interrupted writes left.
func NewLocal(dir string) (*Local, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: snapshot directory is empty", errkind.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("create snapshot directory: %w", err)
	}
	entries, err := os.ReadDir(abs)
	if err != nil {
		return nil, fmt.Errorf("read snapshot directory: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			_ = os.Remove(filepath.Join(abs, e.Name()))
		}
	}
	return &Local{dir: abs}, nil
}

// Dir is the store's directory.
func (l *Local) Dir() string { return l.dir }

func (l *Local) path(id string) string { return filepath.Join(l.dir, id+snapshotSuffix) }

// Put stores r under id atomically.
func (l *Local) Put(ctx context.Context, id string, r io.Reader) (info Info, err error) {
	if err := ValidateID(id); err != nil {
		return Info{}, err
	}
	tmp, err := os.CreateTemp(l.dir, tempPrefix+id+"-*")
	if err != nil {
		return Info{}, classify("put", id, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), ctxReader{ctx: ctx, r: r})
	if err != nil {
		return Info{}, classify("put", id, err)
	}
	if err := tmp.Sync(); err != nil {
		return Info{}, classify("put", id, err)
	}
	if err := tmp.Close(); err != nil {
		return Info{}, classify("put", id, err)
	}
	if err := os.Rename(tmp.Name(), l.path(id)); err != nil {
		return Info{}, classify("put", id, err)
	}
	if d, derr := os.Open(l.dir); derr == nil {
		_ = d.Sync() // make the rename durable
		d.Close()
	}
	return Info{ID: id, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// Get opens the snapshot stored under id.
func (l *Local) Get(_ context.Context, id string) (io.ReadCloser, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	f, err := os.Open(l.path(id))
	if err != nil {
		return nil, classify("get", id, err)
	}
	return f, nil
}

// Exists reports whether id is stored.
func (l *Local) Exists(_ context.Context, id string) (bool, error) {
	if err := ValidateID(id); err != nil {
		return false, err
	}
	_, err := os.Stat(l.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, classify("stat", id, err)
	}
	return true, nil
}

// Delete removes the snapshot stored under id, if any.
func (l *Local) Delete(_ context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	if err := os.Remove(l.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return classify("delete", id, err)
	}
	return nil
}

func classify(op, id string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("snapshot %s: %s: %w", id, op, errkind.ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("snapshot %s: %s: %w: %w", id, op, errkind.ErrPermissionDenied, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("snapshot %s: %s: %w", id, op, errkind.ErrCanceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("snapshot %s: %s: %w", id, op, errkind.ErrDeadlineExceeded)
	case isNoSpace(err):
		return fmt.Errorf("snapshot %s: %s: %w: %w", id, op, errkind.ErrNoSpace, err)
	}
	return fmt.Errorf("snapshot %s: %s: %w", id, op, err)
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
