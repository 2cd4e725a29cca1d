package tracing

import "github.com/bulkhead-dev/bulkhead/pkg/errkind"

// ErrorType classifies err for the error.type attribute without using its
// message (which may quote file contents or the model's input): the
// compute error class ("not_found", "patch_rejected", ...; fs errors
// count), "canceled" or "deadline_exceeded", or else the Go type of the
// innermost wrapped error that has a type of its own (such as
// "*openai.Error"), or "_OTHER". nil gives "". The classes are errkind's
// registry; see errkind.ErrorType.
func ErrorType(err error) string { return errkind.ErrorType(err) }
