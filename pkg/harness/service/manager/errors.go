package manager

import (
	"errors"
	"fmt"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// FieldError is bad input in one field of a call: the error of every
// refusal by the request policy (validate.go). It is an
// errkind.ErrInvalidArgument (errors.Is), whatever its cause: a field that
// names a path escaping the workspace is bad input, not a path escape.
type FieldError struct {
	// Field names the field ("agent.run_as", "manifest: users[0].uid").
	Field string
	// Err says what is wrong with it.
	Err error
}

func (e *FieldError) Error() string {
	msg := e.Err.Error()
	if strings.HasPrefix(msg, e.Field+": ") {
		return msg // named already (a manifest's ValidationError)
	}
	return e.Field + ": " + msg
}

// Unwrap makes the error an errkind.ErrInvalidArgument and nothing else
// (Err's own class would win over it in errkind.ClassOf).
func (e *FieldError) Unwrap() error { return errkind.ErrInvalidArgument }

// badField returns a FieldError for field.
func badField(field, format string, a ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, a...)}
}

// kindError is err, of the errkind class kind, with err's message.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// withKind classifies err as kind (nil stays nil).
func withKind(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: kind, err: err}
}

func unavailable(msg string) error {
	return &kindError{kind: errkind.ErrUnavailable, err: errors.New(msg)}
}

func failedPrecondition(format string, a ...any) error {
	return &kindError{kind: errkind.ErrFailedPrecondition, err: fmt.Errorf(format, a...)}
}
