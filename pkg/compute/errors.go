package compute

import "github.com/bulkhead-dev/bulkhead/pkg/errkind"

// The sentinel errors of the compute plane (see package errkind, where they
// are defined so that the daemon can share them without linking this
// package). Test with errors.Is.
var (
	ErrNotFound           = errkind.ErrNotFound
	ErrUserNotFound       = errkind.ErrUserNotFound
	ErrAlreadyExists      = errkind.ErrAlreadyExists
	ErrInvalidArgument    = errkind.ErrInvalidArgument
	ErrPermissionDenied   = errkind.ErrPermissionDenied
	ErrPathEscape         = errkind.ErrPathEscape
	ErrReadOnly           = errkind.ErrReadOnly
	ErrNotDirectory       = errkind.ErrNotDirectory
	ErrIsDirectory        = errkind.ErrIsDirectory
	ErrNotEmpty           = errkind.ErrNotEmpty
	ErrNoSpace            = errkind.ErrNoSpace
	ErrResourceExhausted  = errkind.ErrResourceExhausted
	ErrFailedPrecondition = errkind.ErrFailedPrecondition
	ErrConflict           = errkind.ErrConflict
	ErrPatchRejected      = errkind.ErrPatchRejected
	ErrUnauthenticated    = errkind.ErrUnauthenticated
	ErrUnavailable        = errkind.ErrUnavailable
	ErrUnimplemented      = errkind.ErrUnimplemented
	ErrCanceled           = errkind.ErrCanceled
	ErrDeadlineExceeded   = errkind.ErrDeadlineExceeded
	ErrInternal           = errkind.ErrInternal
)

// PathError records a failed operation on a workspace path.
type PathError = errkind.PathError

// ProcessError records a failed operation on a daemon process.
type ProcessError = errkind.ProcessError

// Retryable reports whether trying the same operation again can help and is
// safe.
func Retryable(err error) bool { return errkind.Retryable(err) }

// MarkRetryable marks err as safe to retry unchanged.
func MarkRetryable(err error) error { return errkind.MarkRetryable(err) }
