package mount

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// mountError is an error of a bucket: its text is made here, with the
// mount's credentials redacted; errors.Is matches its sentinel and the
// backend error it keeps for diagnosis.
type mountError struct {
	msg      string
	sentinel error
	cause    error
}

func (e *mountError) Error() string { return e.msg }
func (e *mountError) Unwrap() []error {
	if e.sentinel == nil {
		return []error{e.cause}
	}
	return []error{e.sentinel, e.cause}
}

// classify says what failed on which key and whether retrying can help,
// with no credential in its text. It follows snapshot.S3's classification
// (the two packages keep separate copies: small, and each names its own
// store in the text).
func (st *bucketStore) classify(ctx context.Context, op, key string, err error) error {
	var (
		sentinel  error
		detail    string
		retryable bool
	)
	code, status := apiCode(err)
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		sentinel, detail = errkind.ErrDeadlineExceeded, "the deadline passed"
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		sentinel, detail = errkind.ErrCanceled, "canceled"
	case code == "NoSuchBucket":
		sentinel, detail = errkind.ErrNotFound, "bucket "+st.bucket+" does not exist"
	case isNotFound(err):
		sentinel, detail = errkind.ErrNotFound, "no such object"
	case isAuthCode(code) || status == 401:
		sentinel, detail = errkind.ErrUnauthenticated, "the storage refused the mount's credentials ("+code+")"
	case code == "AccessDenied" || status == 403:
		sentinel, detail = errkind.ErrPermissionDenied, "access denied ("+code+")"
	case isUnavailable(err):
		sentinel, detail, retryable = errkind.ErrUnavailable, "storage unavailable", true
	}
	msg := "mount storage " + st.desc + ": " + op + " " + key + ": "
	if sentinel == nil {
		msg += st.redact(err.Error())
	} else {
		msg += detail
		if code != "" || retryable {
			msg += ": " + st.redact(err.Error())
		}
	}
	var out error = &mountError{msg: msg, sentinel: sentinel, cause: err}
	if retryable {
		out = errkind.MarkRetryable(out)
	}
	return out
}

// redact removes the mount's credentials from text.
func (st *bucketStore) redact(text string) string {
	for _, v := range st.secrets {
		text = strings.ReplaceAll(text, v, "[REDACTED]")
	}
	return text
}

// apiCode returns the S3 error code and HTTP status of err.
func apiCode(err error) (string, int) {
	var code string
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return code, re.HTTPStatusCode()
	}
	return code, 0
}

// isAuthCode reports the error codes of refused credentials (Versity
// answers an unknown key with a 404 XAdminUserNotFound).
func isAuthCode(code string) bool {
	switch code {
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidSecurity",
		"InvalidClientTokenId", "XAdminUserNotFound", "AuthorizationHeaderMalformed":
		return true
	}
	return false
}

// isNotFound reports a missing key.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	code, status := apiCode(err)
	return code == "NoSuchKey" || code == "NotFound" || (status == 404 && code != "NoSuchBucket" && !isAuthCode(code))
}

// isPreconditionFailed reports a failed If-Match / If-None-Match (412), or
// a concurrent conditional write (409 ConditionalRequestConflict).
func isPreconditionFailed(err error) bool {
	code, status := apiCode(err)
	return status == 412 || code == "PreconditionFailed" || code == "ConditionalRequestConflict"
}

// isNotImplemented reports a server that does not support a request
// feature (conditional writes on some S3-compatible servers).
func isNotImplemented(err error) bool {
	code, status := apiCode(err)
	return status == 501 || code == "NotImplemented"
}

// isUnavailable reports an error that retrying later can cure.
func isUnavailable(err error) bool {
	code, status := apiCode(err)
	switch code {
	case "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "ThrottlingException", "RequestTimeTooSkewed":
		return true
	}
	if status >= 500 && status != 501 || status == 429 {
		return true
	}
	var send *smithyhttp.RequestSendError
	var nerr net.Error
	return errors.As(err, &send) || errors.As(err, &nerr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
