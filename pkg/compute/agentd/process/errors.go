package process

import (
	"context"
	"errors"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"
)

// procErr wraps err as a *errdefs.ProcessError for op on process id.
func procErr(op, id string, err error) error {
	return &errdefs.ProcessError{Op: op, ProcessID: id, Err: err}
}

// procErrf is procErr with a "sentinel: detail" error.
func procErrf(op, id string, sentinel error, format string, args ...any) error {
	return procErr(op, id, errdefs.Errorf(sentinel, format, args...))
}

// ctxErr maps a finished context to errdefs.ErrCanceled or
// errdefs.ErrDeadlineExceeded, keeping the context error wrapped.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", errdefs.ErrDeadlineExceeded, err)
	}
	return fmt.Errorf("%w: %w", errdefs.ErrCanceled, err)
}
