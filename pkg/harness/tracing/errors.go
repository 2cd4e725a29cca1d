package tracing

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"
)

// errorClasses names the compute errors, most specific first.
var errorClasses = []struct {
	err  error
	name string
}{
	{errdefs.ErrPathEscape, "path_escape"},
	{errdefs.ErrPatchRejected, "patch_rejected"},
	{errdefs.ErrReadOnly, "read_only"},
	{errdefs.ErrNotFound, "not_found"},
	{fs.ErrNotExist, "not_found"},
	{errdefs.ErrAlreadyExists, "already_exists"},
	{fs.ErrExist, "already_exists"},
	{errdefs.ErrInvalidArgument, "invalid_argument"},
	{errdefs.ErrPermissionDenied, "permission_denied"},
	{fs.ErrPermission, "permission_denied"},
	{errdefs.ErrNotDirectory, "not_directory"},
	{errdefs.ErrIsDirectory, "is_directory"},
	{errdefs.ErrNotEmpty, "not_empty"},
	{errdefs.ErrNoSpace, "no_space"},
	{errdefs.ErrResourceExhausted, "resource_exhausted"},
	{errdefs.ErrFailedPrecondition, "failed_precondition"},
	{errdefs.ErrConflict, "conflict"},
	{errdefs.ErrUnauthenticated, "unauthenticated"},
	{errdefs.ErrUnavailable, "unavailable"},
	{errdefs.ErrUnimplemented, "unimplemented"},
	{errdefs.ErrCanceled, "canceled"},
	{context.Canceled, "canceled"},
	{errdefs.ErrDeadlineExceeded, "deadline_exceeded"},
	{context.DeadlineExceeded, "deadline_exceeded"},
	{errdefs.ErrInternal, "internal"},
}

// ErrorType classifies err for the error.type attribute without using its
// message (which may quote file contents or the model's input): the
// compute error class ("not_found", "patch_rejected", ...; fs errors
// count), "canceled" or "deadline_exceeded", or else the Go type of the
// innermost wrapped error that has a type of its own (such as
// "*openai.Error"), or "_OTHER". nil gives "".
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	for _, c := range errorClasses {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	typ := "_OTHER"
	for err != nil {
		if t := fmt.Sprintf("%T", err); !genericErrors[t] {
			typ = t
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				err = errs[0]
			} else {
				err = nil
			}
		default:
			err = nil
		}
	}
	return typ
}

// genericErrors are the types that say nothing about a failure.
var genericErrors = map[string]bool{"*errors.errorString": true, "*fmt.wrapError": true, "*fmt.wrapErrors": true, "*errors.joinError": true}
