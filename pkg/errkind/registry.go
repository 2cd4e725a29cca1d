package errkind

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
)

// Class is one kind of failure of the compute plane: a sentinel and the
// stable name every layer uses for it. It says nothing about transport:
// the gRPC code and ErrorReason of each class are kept in pkg/internal/wire/errmap,
// which a test keeps complete against Classes.
type Class struct {
	// Err is the sentinel errors of the class wrap.
	Err error
	// Name is the stable snake_case name of the class ("not_found",
	// "path_escape", ...): the error.type of spans and the word logs use.
	// Names never change once released.
	Name string
	// Aliases are standard library errors that mean the same thing
	// (fs.ErrNotExist for not_found, context.Canceled for canceled).
	Aliases []error
}

// registry lists every class, the most specific first: an error that
// matches several classes (a patch rejected because a path escapes, an
// unknown run_as user, which is also not_found) belongs to the first. Read
// it through Classes, ClassOf and Name.
var registry = [...]Class{
	{Err: ErrCanceled, Name: "canceled", Aliases: []error{context.Canceled}},
	{Err: ErrDeadlineExceeded, Name: "deadline_exceeded", Aliases: []error{context.DeadlineExceeded}},
	{Err: ErrPathEscape, Name: "path_escape"},
	{Err: ErrReadOnly, Name: "read_only"},
	{Err: ErrPatchRejected, Name: "patch_rejected"},
	{Err: ErrNoSpace, Name: "no_space"},
	{Err: ErrUserNotFound, Name: "user_not_found"},
	{Err: ErrNotFound, Name: "not_found", Aliases: []error{fs.ErrNotExist}},
	{Err: ErrAlreadyExists, Name: "already_exists", Aliases: []error{fs.ErrExist}},
	{Err: ErrNotDirectory, Name: "not_directory"},
	{Err: ErrIsDirectory, Name: "is_directory"},
	{Err: ErrNotEmpty, Name: "not_empty"},
	{Err: ErrPermissionDenied, Name: "permission_denied", Aliases: []error{fs.ErrPermission}},
	{Err: ErrResourceExhausted, Name: "resource_exhausted"},
	{Err: ErrConflict, Name: "conflict"},
	{Err: ErrFailedPrecondition, Name: "failed_precondition"},
	{Err: ErrInvalidArgument, Name: "invalid_argument"},
	{Err: ErrUnauthenticated, Name: "unauthenticated"},
	{Err: ErrUnimplemented, Name: "unimplemented"},
	{Err: ErrUnavailable, Name: "unavailable"},
	{Err: ErrInternal, Name: "internal"},
}

// Classes returns every class, the most specific first. The slice is the
// caller's own.
func Classes() []Class {
	out := make([]Class, len(registry))
	for i, c := range registry {
		c.Aliases = append([]error(nil), c.Aliases...)
		out[i] = c
	}
	return out
}

// ClassOf returns the class of err: the first class, most specific first,
// whose sentinel or one of whose aliases err wraps. ok is false for an
// error of no class (and for nil).
func ClassOf(err error) (c Class, ok bool) {
	if err == nil {
		return Class{}, false
	}
	for _, c := range registry {
		if errors.Is(err, c.Err) {
			return c, true
		}
		for _, a := range c.Aliases {
			if errors.Is(err, a) {
				return c, true
			}
		}
	}
	return Class{}, false
}

// Name returns the name of err's class, or "" when it has none.
func Name(err error) string {
	c, _ := ClassOf(err)
	return c.Name
}

// Classified reports whether err already wraps one of this package's
// sentinels (aliases do not count: ClassifyFS still has work to do on a
// bare fs.ErrNotExist).
func Classified(err error) bool {
	for _, c := range registry {
		if errors.Is(err, c.Err) {
			return true
		}
	}
	return false
}

// ErrorType classifies err for the OpenTelemetry error.type attribute
// without using its message (which may quote file contents or the model's
// input): the name of its class, else the Go type of the innermost wrapped
// error that has a type of its own (such as "*openai.Error"), else
// "_OTHER". nil gives "".
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	if name := Name(err); name != "" {
		return name
	}
	typ := "_OTHER"
	for err != nil {
		if t := fmt.Sprintf("%T", err); !isGenericErrorType(t) {
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

// isGenericErrorType reports whether errors of the type named t say
// nothing about a failure.
func isGenericErrorType(t string) bool {
	switch t {
	case "*errors.errorString", "*fmt.wrapError", "*fmt.wrapErrors", "*errors.joinError":
		return true
	}
	return false
}
