package workspace

import (
	"errors"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// classify maps a system error to a compute sentinel, wrapping the errno
// too (errors.Is works with both errkind.ErrNotFound and fs.ErrNotExist);
// host paths are dropped. See errkind.ClassifyFS.
func classify(err error) error { return errkind.ClassifyFS(err) }

// pathErr returns a *errkind.PathError for the caller's path. A nil err
// stays nil. An error that already is a *errkind.PathError is returned as is,
// so the innermost (most precise) operation name wins.
func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *errkind.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &errkind.PathError{Op: op, Path: path, Err: classify(err)}
}

// errorf is errkind.Errorf, for brevity.
func errorf(sentinel error, format string, args ...any) error {
	return errkind.Errorf(sentinel, format, args...)
}
