// Package errmap is the one table between compute's Go errors and the gRPC
// status (code + ErrorDetail) that carries them over the wire. Only
// pkg/agentd/server (ToStatus) and pkg/compute/agentclient
// (FromStatus) may use it: everywhere else errors are plain Go errors.
package errmap

import (
	"errors"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// wire is the gRPC form of an error class.
type wire struct {
	code   codes.Code
	reason agentdv1.ErrorReason
}

// wireOf returns the gRPC code and ErrorReason of the errkind class whose
// sentinel is s; ok is false for an error that is not a class sentinel.
// The classes, their names and their order are errkind.Classes; this is
// only their wire form, and a test keeps it complete and one to one.
func wireOf(s error) (w wire, ok bool) {
	switch s {
	case errkind.ErrCanceled:
		return wire{codes.Canceled, agentdv1.ErrorReason_ERROR_REASON_CANCELED}, true
	case errkind.ErrDeadlineExceeded:
		return wire{codes.DeadlineExceeded, agentdv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED}, true
	case errkind.ErrPathEscape:
		return wire{codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PATH_ESCAPE}, true
	case errkind.ErrReadOnly:
		return wire{codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_READ_ONLY}, true
	case errkind.ErrPatchRejected:
		return wire{codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED}, true
	case errkind.ErrNoSpace:
		return wire{codes.ResourceExhausted, agentdv1.ErrorReason_ERROR_REASON_NO_SPACE}, true
	case errkind.ErrUserNotFound:
		return wire{codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_USER_NOT_FOUND}, true
	case errkind.ErrNotFound:
		return wire{codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND}, true
	case errkind.ErrAlreadyExists:
		return wire{codes.AlreadyExists, agentdv1.ErrorReason_ERROR_REASON_ALREADY_EXISTS}, true
	case errkind.ErrNotDirectory:
		return wire{codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_NOT_A_DIRECTORY}, true
	case errkind.ErrIsDirectory:
		return wire{codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_IS_A_DIRECTORY}, true
	case errkind.ErrNotEmpty:
		return wire{codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_DIRECTORY_NOT_EMPTY}, true
	case errkind.ErrPermissionDenied:
		return wire{codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED}, true
	case errkind.ErrResourceExhausted:
		return wire{codes.ResourceExhausted, agentdv1.ErrorReason_ERROR_REASON_LIMIT_EXCEEDED}, true
	case errkind.ErrConflict:
		return wire{codes.Aborted, agentdv1.ErrorReason_ERROR_REASON_CONFLICT}, true
	case errkind.ErrFailedPrecondition:
		return wire{codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_FAILED_PRECONDITION}, true
	case errkind.ErrInvalidArgument:
		return wire{codes.InvalidArgument, agentdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT}, true
	case errkind.ErrUnauthenticated:
		return wire{codes.Unauthenticated, agentdv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED}, true
	case errkind.ErrUnimplemented:
		return wire{codes.Unimplemented, agentdv1.ErrorReason_ERROR_REASON_UNIMPLEMENTED}, true
	case errkind.ErrUnavailable:
		return wire{codes.Unavailable, agentdv1.ErrorReason_ERROR_REASON_UNAVAILABLE}, true
	case errkind.ErrInternal:
		return wire{codes.Internal, agentdv1.ErrorReason_ERROR_REASON_INTERNAL}, true
	}
	return wire{}, false
}

// wireFor returns the wire form of err's class (errkind.ClassOf); an error
// of no class is internal.
func wireFor(err error) wire {
	if c, ok := errkind.ClassOf(err); ok {
		if w, ok := wireOf(c.Err); ok {
			return w
		}
	}
	return wire{codes.Internal, agentdv1.ErrorReason_ERROR_REASON_INTERNAL}
}

// Reason returns the ErrorReason of err's class, or UNSPECIFIED when err
// is nil or of no class. The server uses it for the reasons inside a
// PatchRejection.
func Reason(err error) agentdv1.ErrorReason {
	if c, ok := errkind.ClassOf(err); ok {
		if w, ok := wireOf(c.Err); ok {
			return w.reason
		}
	}
	return agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED
}

// ToStatus turns a daemon error into a gRPC status error with an ErrorDetail
// (and any extra details, such as a PatchRejection). A nil error stays nil.
func ToStatus(err error, extra ...*agentdv1.PatchRejection) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !errkind.Classified(err) {
		return err // already a status (e.g. from an interceptor)
	}
	w := wireFor(err)
	detail := &agentdv1.ErrorDetail{Reason: w.reason, Message: err.Error()}
	var pe *errkind.PathError
	if errors.As(err, &pe) {
		detail.Op, detail.Path, detail.Message = pe.Op, pe.Path, pe.Err.Error()
	}
	var xe *errkind.ProcessError
	if errors.As(err, &xe) {
		detail.Op, detail.ProcessId, detail.Message = xe.Op, xe.ProcessID, xe.Err.Error()
	}
	st := status.New(w.code, err.Error())
	details := []protoadapt.MessageV1{protoadapt.MessageV1Of(detail)}
	for _, x := range extra {
		if x != nil {
			details = append(details, protoadapt.MessageV1Of(x))
		}
	}
	if withDetails, derr := st.WithDetails(details...); derr == nil {
		st = withDetails
	}
	return st.Err()
}

// FromStatus turns a gRPC error back into a compute error that matches the
// same sentinel under errors.Is (for a rejected patch also the sentinels of
// its kind and cause, as in the daemon), keeps the path or process it concerns, and
// is marked retryable when the daemon was unavailable. The original status
// stays in the chain for diagnosis.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var detail *agentdv1.ErrorDetail
	var rej *agentdv1.PatchRejection
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *agentdv1.ErrorDetail:
			detail = x
		case *agentdv1.PatchRejection:
			rej = x
		}
	}
	sentinels := []error{sentinelFor(st.Code(), detail.GetReason())}
	// A rejected patch matches its kind and its cause too, as it does in
	// the daemon: a patch whose file is a directory is both
	// ErrPatchRejected and ErrIsDirectory.
	for _, r := range []agentdv1.ErrorReason{rej.GetKind(), rej.GetCause()} {
		if s := reasonSentinel(r); s != nil && !slices.Contains(sentinels, s) {
			sentinels = append(sentinels, s)
		}
	}
	msg := st.Message()
	if detail != nil && detail.GetMessage() != "" {
		msg = detail.GetMessage()
	}
	if detail == nil && st.Code() == codes.Unavailable {
		// A transport failure: gRPC's text names socket paths of the
		// harness host. Say what happened, keep only the cause.
		msg = "the sandbox is unavailable: its daemon cannot be reached"
		if r := transportReason(st.Message()); r != "" {
			msg += " (" + r + ")"
		}
	}
	var out error = &wireError{sentinels: sentinels, msg: msg, status: err}
	switch {
	case detail != nil && detail.GetPath() != "":
		out = &errkind.PathError{Op: detail.GetOp(), Path: detail.GetPath(), Err: out}
	case detail != nil && detail.GetProcessId() != "":
		out = &errkind.ProcessError{Op: detail.GetOp(), ProcessID: detail.GetProcessId(), Err: out}
	}
	if st.Code() == codes.Unavailable {
		out = errkind.MarkRetryable(out)
	}
	return out
}

// transportReason extracts the final cause of a gRPC transport error
// message ("connection refused", "EOF"), or "" when it names a path.
func transportReason(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	msg = strings.Trim(strings.TrimSpace(msg), `"`)
	if msg == "" || strings.ContainsAny(msg, "/\\") || len(msg) > 80 {
		return ""
	}
	return msg
}

// PatchRejection returns the PatchRejection detail of a gRPC error, if any.
func PatchRejection(err error) *agentdv1.PatchRejection {
	var we *wireError
	if errors.As(err, &we) {
		err = we.status
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if x, ok := d.(*agentdv1.PatchRejection); ok {
			return x
		}
	}
	return nil
}

// sentinelFor returns the sentinel of the class whose ErrorReason is
// reason, else (a reason this client does not know, from a newer daemon,
// or none) the most general class with the status code: the last one in
// errkind's most-specific-first order (NOT_FOUND, not USER_NOT_FOUND), else
// ErrInternal.
func sentinelFor(code codes.Code, reason agentdv1.ErrorReason) error {
	var general error
	for _, c := range errkind.Classes() {
		w, ok := wireOf(c.Err)
		if !ok {
			continue
		}
		if reason != agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED && w.reason == reason {
			return c.Err
		}
		if w.code == code {
			general = c.Err
		}
	}
	if general != nil {
		return general
	}
	return errkind.ErrInternal
}

// ReasonSentinel returns the sentinel of the class whose ErrorReason is
// reason, or nil when reason is unspecified or unknown (agentclient turns a
// PatchRejection's kind and cause into Go errors with it).
func ReasonSentinel(reason agentdv1.ErrorReason) error { return reasonSentinel(reason) }

// reasonSentinel returns the sentinel of the class whose ErrorReason is
// reason, or nil when reason is unspecified or unknown.
func reasonSentinel(reason agentdv1.ErrorReason) error {
	if reason == agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		return nil
	}
	for _, c := range errkind.Classes() {
		if w, ok := wireOf(c.Err); ok && w.reason == reason {
			return c.Err
		}
	}
	return nil
}

// wireError is a compute error rebuilt from a status.
type wireError struct {
	// sentinels are the class of the error, then (for a rejected patch)
	// the patch's kind and its specific cause.
	sentinels []error
	msg       string
	status    error
}

func (e *wireError) Error() string {
	if e.msg == "" {
		return e.sentinels[0].Error()
	}
	return e.msg
}

// Unwrap exposes the sentinels (for errors.Is) and the status (for
// status.FromError).
func (e *wireError) Unwrap() []error { return append(append([]error(nil), e.sentinels...), e.status) }
