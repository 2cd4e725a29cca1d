package process

import (
	"context"
	"errors"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// procErr wraps err as a *errkind.ProcessError for op on process id.
func procErr(op, id string, err error) error {
	return &errkind.ProcessError{Op: op, ProcessID: id, Err: err}
}

// procErrf is procErr with a "sentinel: detail" error.
func procErrf(op, id string, sentinel error, format string, args ...any) error {
	return procErr(op, id, errkind.Errorf(sentinel, format, args...))
}

// ctxErr maps a finished context to errkind.ErrCanceled or
// errkind.ErrDeadlineExceeded, keeping the context error wrapped.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", errkind.ErrDeadlineExceeded, err)
	}
	return fmt.Errorf("%w: %w", errkind.ErrCanceled, err)
}
