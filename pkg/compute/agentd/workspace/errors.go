package workspace

import (
	"errors"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// classify maps a system error to a compute sentinel, wrapping the errno
// too (errors.Is works with both compute.ErrNotFound and fs.ErrNotExist);
// host paths are dropped. See compute.ClassifyFS.
func classify(err error) error { return compute.ClassifyFS(err) }

// pathErr returns a *compute.PathError for the caller's path. A nil err
// stays nil. An error that already is a *compute.PathError is returned as is,
// so the innermost (most precise) operation name wins.
func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *compute.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &compute.PathError{Op: op, Path: path, Err: classify(err)}
}

// errorf is compute.Errorf, for brevity.
func errorf(sentinel error, format string, args ...any) error {
	return compute.Errorf(sentinel, format, args...)
}
