// Package errmap is the one table between compute's Go errors and the gRPC
// status (code + ErrorDetail) that carries them over the wire. Only
// pkg/compute/agentd/server (ToStatus) and pkg/compute/agentclient
// (FromStatus) may use it: everywhere else errors are plain Go errors.
package errmap

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// entry binds a sentinel to its wire form. Order matters: the first sentinel
// an error matches wins, so more specific ones come first.
type entry struct {
	sentinel error
	code     codes.Code
	reason   agentdv1.ErrorReason
}

var table = [...]entry{
	{errdefs.ErrPathEscape, codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PATH_ESCAPE},
	{errdefs.ErrReadOnly, codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_READ_ONLY},
	{errdefs.ErrPatchRejected, codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED},
	{errdefs.ErrNoSpace, codes.ResourceExhausted, agentdv1.ErrorReason_ERROR_REASON_NO_SPACE},
	{errdefs.ErrNotFound, codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND},
	{errdefs.ErrAlreadyExists, codes.AlreadyExists, agentdv1.ErrorReason_ERROR_REASON_ALREADY_EXISTS},
	{errdefs.ErrNotDirectory, codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_NOT_A_DIRECTORY},
	{errdefs.ErrIsDirectory, codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_IS_A_DIRECTORY},
	{errdefs.ErrNotEmpty, codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_DIRECTORY_NOT_EMPTY},
	{errdefs.ErrPermissionDenied, codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED},
	{errdefs.ErrResourceExhausted, codes.ResourceExhausted, agentdv1.ErrorReason_ERROR_REASON_LIMIT_EXCEEDED},
	{errdefs.ErrConflict, codes.Aborted, agentdv1.ErrorReason_ERROR_REASON_CONFLICT},
	{errdefs.ErrFailedPrecondition, codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_FAILED_PRECONDITION},
	{errdefs.ErrInvalidArgument, codes.InvalidArgument, agentdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
	{errdefs.ErrUnauthenticated, codes.Unauthenticated, agentdv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED},
	{errdefs.ErrUnimplemented, codes.Unimplemented, agentdv1.ErrorReason_ERROR_REASON_UNIMPLEMENTED},
	{errdefs.ErrUnavailable, codes.Unavailable, agentdv1.ErrorReason_ERROR_REASON_UNAVAILABLE},
	{errdefs.ErrInternal, codes.Internal, agentdv1.ErrorReason_ERROR_REASON_INTERNAL},
}

// ToStatus turns a daemon error into a gRPC status error with an ErrorDetail
// (and any extra details, such as a PatchRejection). A nil error stays nil.
func ToStatus(err error, extra ...*agentdv1.PatchRejection) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !errdefs.Classified(err) {
		return err // already a status (e.g. from an interceptor)
	}
	code, reason := codes.Internal, agentdv1.ErrorReason_ERROR_REASON_INTERNAL
	switch {
	case errors.Is(err, context.Canceled):
		code, reason = codes.Canceled, agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED
	case errors.Is(err, context.DeadlineExceeded):
		code, reason = codes.DeadlineExceeded, agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED
	default:
		for _, e := range table {
			if errors.Is(err, e.sentinel) {
				code, reason = e.code, e.reason
				break
			}
		}
	}
	detail := &agentdv1.ErrorDetail{Reason: reason, Message: err.Error()}
	var pe *errdefs.PathError
	if errors.As(err, &pe) {
		detail.Op, detail.Path, detail.Message = pe.Op, pe.Path, pe.Err.Error()
	}
	var xe *errdefs.ProcessError
	if errors.As(err, &xe) {
		detail.Op, detail.ProcessId, detail.Message = xe.Op, xe.ProcessID, xe.Err.Error()
	}
	st := status.New(code, err.Error())
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
// same sentinel under errors.Is, keeps the path or process it concerns, and
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
	for _, d := range st.Details() {
		if x, ok := d.(*agentdv1.ErrorDetail); ok {
			detail = x
		}
	}
	sentinel := sentinelFor(st.Code(), detail)
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
	var out error = &wireError{sentinel: sentinel, msg: msg, status: err}
	switch {
	case detail != nil && detail.GetPath() != "":
		out = &errdefs.PathError{Op: detail.GetOp(), Path: detail.GetPath(), Err: out}
	case detail != nil && detail.GetProcessId() != "":
		out = &errdefs.ProcessError{Op: detail.GetOp(), ProcessID: detail.GetProcessId(), Err: out}
	}
	if st.Code() == codes.Unavailable {
		out = errdefs.MarkRetryable(out)
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

func sentinelFor(code codes.Code, detail *agentdv1.ErrorDetail) error {
	if detail != nil {
		for _, e := range table {
			if e.reason == detail.GetReason() {
				return e.sentinel
			}
		}
	}
	switch code {
	case codes.Canceled:
		return errdefs.ErrCanceled
	case codes.DeadlineExceeded:
		return errdefs.ErrDeadlineExceeded
	case codes.Unavailable:
		return errdefs.ErrUnavailable
	}
	for _, e := range table {
		if e.code == code {
			return e.sentinel
		}
	}
	return errdefs.ErrInternal
}

// wireError is a compute error rebuilt from a status.
type wireError struct {
	sentinel error
	msg      string
	status   error
}

func (e *wireError) Error() string {
	if e.msg == "" {
		return e.sentinel.Error()
	}
	return e.msg
}

// Unwrap exposes both the sentinel (for errors.Is) and the status (for status.FromError).
func (e *wireError) Unwrap() []error { return []error{e.sentinel, e.status} }
