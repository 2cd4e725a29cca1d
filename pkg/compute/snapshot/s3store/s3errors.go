package s3store

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3errs"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/storeerr"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// storeError is an error of a remote store: its text is made here, with
// credentials redacted; errors.Is matches its sentinels and the backend
// error it keeps for diagnosis.
type storeError struct {
	msg       string
	sentinels []error
	cause     error
}

func (e *storeError) Error() string   { return e.msg }
func (e *storeError) Unwrap() []error { return append(append([]error(nil), e.sentinels...), e.cause) }

// classify turns a backend error into one that says what failed and
// whether retrying can help, with no credential in its text.
func (s *Store) classify(ctx context.Context, op, target string, err error) error {
	var (
		sentinel  error
		detail    string
		retryable bool
	)
	code, status := s3errs.Code(err)
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		sentinel, detail = errkind.ErrDeadlineExceeded, "the deadline passed"
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		sentinel, detail = errkind.ErrCanceled, "canceled"
	case errors.Is(err, snapshot.ErrCorrupt):
		sentinel, detail = snapshot.ErrCorrupt, ""
	case code == "NoSuchBucket":
		sentinel, detail = errkind.ErrNotFound, "bucket "+s.bucket+" does not exist"
	case s3errs.IsNotFound(err):
		sentinel, detail = errkind.ErrNotFound, ""
	case s3errs.IsAuthCode(code) || status == 401:
		sentinel, detail = errkind.ErrUnauthenticated, "the store refused the credentials ("+code+"); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
	case code == "AccessDenied" || status == 403:
		sentinel, detail = errkind.ErrPermissionDenied, "access denied ("+code+")"
	case s3errs.IsUnavailable(err):
		sentinel, detail, retryable = errkind.ErrUnavailable, "snapshot store unavailable", true
	case isChecksumMismatch(err):
		sentinel, detail = snapshot.ErrCorrupt, "the server's checksum does not match the data"
	}
	msg := "snapshot store " + s.desc + ": " + op + " " + target + ": "
	if sentinel == nil {
		msg += s.redact(err.Error())
		return &storeError{msg: msg, cause: err}
	}
	if detail == "" {
		detail = sentinel.Error()
	}
	msg += detail
	if code != "" || sentinel == errkind.ErrUnavailable {
		msg += ": " + s.redact(err.Error())
	}
	var out error = &storeError{msg: msg, sentinels: []error{sentinel}, cause: err}
	if retryable {
		out = errkind.MarkRetryable(out)
	}
	return out
}

// redact removes the credentials from text.
func (s *Store) redact(text string) string { return storeerr.Redact(text, s.secrets) }

// isChecksumMismatch reports the SDK's failed response checksum check.
func isChecksumMismatch(err error) bool {
	return err != nil && strings.Contains(err.Error(), "checksum did not match")
}

// backoff is exponential backoff with full jitter: try n waits a random
// time up to min(max, base*2^(n-1)).
type backoff struct{ base, max time.Duration }

func (b backoff) delay(attempt int) time.Duration {
	d := b.base << min(attempt-1, 20)
	if d <= 0 || d > b.max {
		d = b.max
	}
	return d/2 + rand.N(d/2+1)
}

// BackoffDelay implements the SDK's retry.BackoffDelayer.
func (b backoff) BackoffDelay(attempt int, _ error) (time.Duration, error) {
	return b.delay(attempt), nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
