package compute

import "github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"

// The sentinel errors of the compute plane (see package errdefs, where they
// are defined so that the daemon can share them without linking this
// package). Test with errors.Is.
var (
	ErrNotFound           = errdefs.ErrNotFound
	ErrUserNotFound       = errdefs.ErrUserNotFound
	ErrAlreadyExists      = errdefs.ErrAlreadyExists
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrPermissionDenied   = errdefs.ErrPermissionDenied
	ErrPathEscape         = errdefs.ErrPathEscape
	ErrReadOnly           = errdefs.ErrReadOnly
	ErrNotDirectory       = errdefs.ErrNotDirectory
	ErrIsDirectory        = errdefs.ErrIsDirectory
	ErrNotEmpty           = errdefs.ErrNotEmpty
	ErrNoSpace            = errdefs.ErrNoSpace
	ErrResourceExhausted  = errdefs.ErrResourceExhausted
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
	ErrConflict           = errdefs.ErrConflict
	ErrPatchRejected      = errdefs.ErrPatchRejected
	ErrUnauthenticated    = errdefs.ErrUnauthenticated
	ErrUnavailable        = errdefs.ErrUnavailable
	ErrUnimplemented      = errdefs.ErrUnimplemented
	ErrCanceled           = errdefs.ErrCanceled
	ErrDeadlineExceeded   = errdefs.ErrDeadlineExceeded
	ErrInternal           = errdefs.ErrInternal
)

// PathError records a failed operation on a workspace path.
type PathError = errdefs.PathError

// ProcessError records a failed operation on a daemon process.
type ProcessError = errdefs.ProcessError

// Retryable reports whether trying the same operation again can help and is
// safe.
func Retryable(err error) bool { return errdefs.Retryable(err) }

// MarkRetryable marks err as safe to retry unchanged.
func MarkRetryable(err error) error { return errdefs.MarkRetryable(err) }
