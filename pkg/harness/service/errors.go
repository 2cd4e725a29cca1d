package service

import (
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// The one error table of the transports. The manager's errors are Go
// errors of pkg/errkind's classes; each class has one Connect code here
// (the same code the daemon's wire gives it, pkg/internal/wire/errmap),
// and each code one HTTP status for the hand-written routes (Connect's
// own unary JSON answers with its mapping). A test keeps codeOfClass
// complete against errkind.Classes: a new class fails it until it has a
// row. An error of no class is a failure of the service: Internal.

// codeOfClass is the Connect code of each errkind class, by its sentinel.
var codeOfClass = map[error]connect.Code{
	errkind.ErrCanceled:           connect.CodeCanceled,
	errkind.ErrDeadlineExceeded:   connect.CodeDeadlineExceeded,
	errkind.ErrPathEscape:         connect.CodePermissionDenied,
	errkind.ErrReadOnly:           connect.CodePermissionDenied,
	errkind.ErrPatchRejected:      connect.CodeFailedPrecondition,
	errkind.ErrNoSpace:            connect.CodeResourceExhausted,
	errkind.ErrUserNotFound:       connect.CodeNotFound,
	errkind.ErrNotFound:           connect.CodeNotFound,
	errkind.ErrAlreadyExists:      connect.CodeAlreadyExists,
	errkind.ErrNotDirectory:       connect.CodeFailedPrecondition,
	errkind.ErrIsDirectory:        connect.CodeFailedPrecondition,
	errkind.ErrNotEmpty:           connect.CodeFailedPrecondition,
	errkind.ErrPermissionDenied:   connect.CodePermissionDenied,
	errkind.ErrResourceExhausted:  connect.CodeResourceExhausted,
	errkind.ErrConflict:           connect.CodeAborted,
	errkind.ErrFailedPrecondition: connect.CodeFailedPrecondition,
	errkind.ErrInvalidArgument:    connect.CodeInvalidArgument,
	errkind.ErrUnauthenticated:    connect.CodeUnauthenticated,
	errkind.ErrUnimplemented:      connect.CodeUnimplemented,
	errkind.ErrUnavailable:        connect.CodeUnavailable,
	errkind.ErrInternal:           connect.CodeInternal,
}

// errorTable is codeOfClass by class name, built from the registry
// (errkind.Classes): the table apiError reads.
var errorTable = func() map[string]connect.Code {
	t := map[string]connect.Code{}
	for _, c := range errkind.Classes() {
		if code, ok := codeOfClass[c.Err]; ok {
			t[c.Name] = code
		}
	}
	return t
}()

// httpStatus is the HTTP status of each Connect code on the hand-written
// routes (SSE, downloads, the terminal's WebSocket before the upgrade):
// Connect's own mapping, but FailedPrecondition, which these routes have
// always answered with 412.
var httpStatus = map[connect.Code]int{
	connect.CodeCanceled:           499,
	connect.CodeUnknown:            http.StatusInternalServerError,
	connect.CodeInvalidArgument:    http.StatusBadRequest,
	connect.CodeDeadlineExceeded:   http.StatusGatewayTimeout,
	connect.CodeNotFound:           http.StatusNotFound,
	connect.CodeAlreadyExists:      http.StatusConflict,
	connect.CodePermissionDenied:   http.StatusForbidden,
	connect.CodeResourceExhausted:  http.StatusTooManyRequests,
	connect.CodeFailedPrecondition: http.StatusPreconditionFailed,
	connect.CodeAborted:            http.StatusConflict,
	connect.CodeOutOfRange:         http.StatusBadRequest,
	connect.CodeUnimplemented:      http.StatusNotImplemented,
	connect.CodeInternal:           http.StatusInternalServerError,
	connect.CodeUnavailable:        http.StatusServiceUnavailable,
	connect.CodeDataLoss:           http.StatusInternalServerError,
	connect.CodeUnauthenticated:    http.StatusUnauthorized,
}

// codeOf is the Connect code of err: its class's, Internal for none.
func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	if c, ok := errkind.ClassOf(err); ok {
		if code, ok := errorTable[c.Name]; ok {
			return code
		}
	}
	return connect.CodeInternal
}

// apiError maps an error to a Connect error with its class's code (see
// codeOf) and its text, which never holds a secret.
func apiError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(codeOf(err), err)
}

// httpError writes a JSON error in Connect's shape ({"code","message"}).
func httpError(w http.ResponseWriter, err error) {
	code := codeOf(err)
	status, ok := httpStatus[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code.String(), "message": msg})
}
