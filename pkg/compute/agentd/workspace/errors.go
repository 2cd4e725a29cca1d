package workspace

import (
	"errors"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"
)

// classify maps a system error to a compute sentinel, wrapping the errno
// too (errors.Is works with both errdefs.ErrNotFound and fs.ErrNotExist);
// host paths are dropped. See errdefs.ClassifyFS.
func classify(err error) error { return errdefs.ClassifyFS(err) }

// pathErr returns a *errdefs.PathError for the caller's path. A nil err
// stays nil. An error that already is a *errdefs.PathError is returned as is,
// so the innermost (most precise) operation name wins.
func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *errdefs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &errdefs.PathError{Op: op, Path: path, Err: classify(err)}
}

// errorf is errdefs.Errorf, for brevity.
func errorf(sentinel error, format string, args ...any) error {
	return errdefs.Errorf(sentinel, format, args...)
}
