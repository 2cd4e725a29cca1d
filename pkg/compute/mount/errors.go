package mount

import (
	"context"
	"errors"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3errs"
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
// with no credential in its text. It reads the backend error (its code and HTTP
// status, as snapshot.S3 does for S3 in package s3errs) and words it for a
// mount.
func (st *bucketStore) classify(ctx context.Context, op, key string, err error) error {
	var (
		sentinel  error
		detail    string
		retryable bool
	)
	code, status := st.be.errCode(err)
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		sentinel, detail = errkind.ErrDeadlineExceeded, "the deadline passed"
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		sentinel, detail = errkind.ErrCanceled, "canceled"
	case code == "NoSuchBucket":
		sentinel, detail = errkind.ErrNotFound, "bucket "+st.bucket+" does not exist"
	case s3errs.IsNotFound(err) || status == 404:
		sentinel, detail = errkind.ErrNotFound, "no such object"
	case s3errs.IsAuthCode(code) || status == 401:
		sentinel, detail = errkind.ErrUnauthenticated, "the storage refused the mount's credentials ("+code+")"
	case code == "AccessDenied" || status == 403:
		sentinel, detail = errkind.ErrPermissionDenied, "access denied ("+code+")"
	case s3errs.IsUnavailable(err) || status == 429 || status >= 500 && status != 501:
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

// redact removes the credentials from text.
func (st *bucketStore) redact(text string) string { return s3errs.Redact(text, st.secrets) }
