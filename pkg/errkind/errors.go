// Package errkind holds the kinds of error every layer of the compute plane
// speaks: the pure engines (pkg/patch, pkg/archive), the daemon's logic, the
// typed client and the providers. Package compute re-exports them for users
// of sessions (compute.ErrNotFound); this leaf package, which imports nothing
// of the module, exists so the engines and the daemon can use them without
// linking the client side. (It is not github.com/containerd/errdefs, which
// the Docker provider also uses: hence a name of its own.)
//
// The errors are plain Go values. gRPC status codes are made only in
// pkg/agentd/server and read back only in pkg/compute/agentclient;
// everywhere else callers use errors.Is on the sentinels below and
// Retryable(err) to decide whether trying again can help.
//
// Classes (registry.go) is the one list of the taxonomy: every sentinel,
// its stable name and which class wins when an error matches several.
// Spans (ErrorType), logs and the wire mapping (pkg/internal/wire/errmap, which adds
// the gRPC code and ErrorReason of each class) all read it; a new sentinel
// gets a row there and a wire form in errmap, and tests fail until it has
// both.
package errkind

import (
	"errors"
	"fmt"
)

// refinedError is a sentinel that is a special case of another one:
// errors.Is matches it and its parent.
type refinedError struct {
	msg    string
	parent error
}

func (e *refinedError) Error() string { return e.msg }

// Unwrap returns the more general sentinel.
func (e *refinedError) Unwrap() error { return e.parent }

// Sentinel errors. Wrap them (fmt.Errorf("...: %w", ErrNotFound)) or use the
// typed errors below; test with errors.Is.
var (
	// ErrNotFound: the file, directory, process, user or sandbox does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUserNotFound: a user the request names (its run_as user, the
	// daemon's default user, a file's owner) does not exist in the
	// sandbox. It is a case of ErrNotFound (errors.Is matches both) that
	// callers tell apart from a missing file: it is a configuration error
	// of the run, not something the model can fix.
	ErrUserNotFound error = &refinedError{msg: "user not found", parent: ErrNotFound}
	// ErrAlreadyExists: the target exists and the operation may not replace it.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: the request is malformed; retrying it unchanged cannot help.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrPermissionDenied: the caller (or the run_as user) may not do this.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrPathEscape: a path resolves outside the workspace root and every grant.
	ErrPathEscape = errors.New("path escapes the workspace")
	// ErrReadOnly: the path lies in a read-only grant.
	ErrReadOnly = errors.New("path is read-only")
	// ErrNotDirectory: a directory was expected.
	ErrNotDirectory = errors.New("not a directory")
	// ErrIsDirectory: a regular file was expected.
	ErrIsDirectory = errors.New("is a directory")
	// ErrNotEmpty: a directory that is not empty cannot be removed without recursion.
	ErrNotEmpty = errors.New("directory not empty")
	// ErrNoSpace: the sandbox's disk (or quota) is full.
	ErrNoSpace = errors.New("no space left on device")
	// ErrResourceExhausted: a daemon limit (processes, buffer, size) was reached.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrFailedPrecondition: the object is in the wrong state for the operation
	// (writing to a process that has exited, resizing a process with no TTY, ...).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrConflict: the request contradicts an earlier one (a request_id reused
	// with different parameters, a stdin offset that does not match).
	ErrConflict = errors.New("conflict")
	// ErrPatchRejected: an apply_patch did not apply; nothing was changed.
	ErrPatchRejected = errors.New("patch rejected")
	// ErrUnauthenticated: the token (or client certificate) was missing or wrong.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrUnavailable: the sandbox could not be reached. Retryable.
	ErrUnavailable = errors.New("sandbox unavailable")
	// ErrUnimplemented: the daemon or provider does not support the operation.
	ErrUnimplemented = errors.New("not implemented")
	// ErrCanceled: the caller's context was canceled.
	ErrCanceled = errors.New("canceled")
	// ErrDeadlineExceeded: the caller's deadline passed.
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	// ErrInternal: a bug or an unexpected failure inside the daemon.
	ErrInternal = errors.New("internal error")
)

// PathError records a failed operation on a workspace path. Path is always
// the path as the caller gave it (or as it is shown inside the sandbox), never
// a host path of the harness.
type PathError struct {
	Op   string // "read", "write", "stat", "resolve", ...
	Path string
	Err  error // wraps a sentinel
}

func (e *PathError) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *PathError) Unwrap() error { return e.Err }

// ProcessError records a failed operation on a daemon process.
type ProcessError struct {
	Op        string // "start", "write_stdin", "signal", ...
	ProcessID string // empty when the process never got an id
	Err       error  // wraps a sentinel
}

func (e *ProcessError) Error() string {
	if e.ProcessID == "" {
		return e.Op + ": " + e.Err.Error()
	}
	return e.Op + " process " + e.ProcessID + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *ProcessError) Unwrap() error { return e.Err }

// retryableError marks an error as safe to retry unchanged.
type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// MarkRetryable wraps err so that Retryable reports true. Use it only where a
// retry cannot repeat a side effect (the operation is known not to have
// started, or it is idempotent by request id or offset).
func MarkRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err: err}
}

// Retryable reports whether trying the same operation again can help and is
// safe: the error was marked retryable, or it says the sandbox was
// unavailable before anything happened.
func Retryable(err error) bool {
	var r *retryableError
	return errors.As(err, &r)
}

// Errorf is fmt.Errorf with the sentinel first, for the common
// "sentinel: detail" shape: Errorf(ErrInvalidArgument, "argv is empty").
func Errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
