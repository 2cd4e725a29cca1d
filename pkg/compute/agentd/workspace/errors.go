package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// errRootEscape is the text os.Root uses when a path leaves the root; the
// value itself is unexported by package os.
const errRootEscape = "path escapes from parent"

// classify maps a system error to a compute sentinel. The result wraps the
// sentinel and, when there is one, the errno (so errors.Is works with both
// compute.ErrNotFound and fs.ErrNotExist). Errors that already carry a
// compute sentinel are returned unchanged. Host paths inside *os.PathError
// and *os.LinkError values are dropped: only the errno survives.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if hasSentinel(err) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", compute.ErrCanceled, context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", compute.ErrDeadlineExceeded, context.DeadlineExceeded)
	case isRootEscape(err):
		return fmt.Errorf("%w: the path leads outside its root", compute.ErrPathEscape)
	case errors.Is(err, os.ErrClosed), errors.Is(err, fs.ErrClosed):
		return fmt.Errorf("%w: the workspace or grant was closed", compute.ErrFailedPrecondition)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		// Not a system error: keep the text only when it cannot hold a path.
		var pe *fs.PathError
		var le *os.LinkError
		if errors.As(err, &pe) || errors.As(err, &le) {
			return fmt.Errorf("%w: unexpected filesystem failure", compute.ErrInternal)
		}
		return fmt.Errorf("%w: %w", compute.ErrInternal, err)
	}
	return fmt.Errorf("%w (%w)", compute.ErrnoSentinel(errno), errno)
}

// isRootEscape reports whether err is os.Root's "path escapes" error.
func isRootEscape(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == errRootEscape {
			return true
		}
	}
	return false
}

// hasSentinel reports whether err already wraps a compute sentinel.
func hasSentinel(err error) bool {
	for _, s := range [...]error{
		compute.ErrNotFound, compute.ErrAlreadyExists, compute.ErrInvalidArgument,
		compute.ErrPermissionDenied, compute.ErrPathEscape, compute.ErrReadOnly,
		compute.ErrNotDirectory, compute.ErrIsDirectory, compute.ErrNotEmpty,
		compute.ErrNoSpace, compute.ErrResourceExhausted, compute.ErrFailedPrecondition,
		compute.ErrConflict, compute.ErrUnavailable, compute.ErrUnimplemented,
		compute.ErrCanceled, compute.ErrDeadlineExceeded, compute.ErrInternal,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

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
