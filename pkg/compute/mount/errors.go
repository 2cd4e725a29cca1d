package mount

import (
	"context"
	"errors"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/storeerr"
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
// with no credential in its text. It reads the backend error through the
// backend (Objects.Inspect) and words it for a mount.
func (st *bucketStore) classify(ctx context.Context, op, key string, err error) error {
	var (
		sentinel  error
		detail    string
		retryable bool
	)
	in := st.objects.Inspect(err)
	code, status := in.Code, in.Status
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		sentinel, detail = errkind.ErrDeadlineExceeded, "the deadline passed"
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		sentinel, detail = errkind.ErrCanceled, "canceled"
	case in.NoBucket:
		sentinel, detail = errkind.ErrNotFound, "bucket "+st.bucket+" does not exist"
	case in.NotFound || status == 404:
		sentinel, detail = errkind.ErrNotFound, "no such object"
	case in.Unauthenticated || status == 401:
		sentinel, detail = errkind.ErrUnauthenticated, "the storage refused the mount's credentials ("+code+")"
	case in.PermissionDenied || status == 403:
		sentinel, detail = errkind.ErrPermissionDenied, "access denied ("+code+")"
	case in.Unavailable || status == 429 || status >= 500 && status != 501:
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
func (st *bucketStore) redact(text string) string { return storeerr.Redact(text, st.secrets) }
