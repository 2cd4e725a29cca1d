package agentclient

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// When the caller's context ends while retry waits to try again, the
// caller gets its context's error (its class), with the last transport
// error as its cause: still unavailable and retryable with a new context.
func TestRetryReturnsTheContextsError(t *testing.T) {
	transport := errkind.MarkRetryable(fmt.Errorf("dial: %w", errkind.ErrUnavailable))
	for _, c := range []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		want   error
		alias  error
		reason string
	}{
		{"canceled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(10*time.Millisecond, cancel)
			return ctx, cancel
		}, errkind.ErrCanceled, context.Canceled, "canceled"},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 10*time.Millisecond)
		}, errkind.ErrDeadlineExceeded, context.DeadlineExceeded, "deadline_exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			calls := 0
			err := retry(ctx, func() error { calls++; return transport })
			if !errors.Is(err, c.want) || !errors.Is(err, c.alias) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
				t.Errorf("err = %v lost its cause (unavailable, retryable)", err)
			}
			if got := errkind.Name(err); got != c.reason {
				t.Errorf("class %q, want %q", got, c.reason)
			}
			if calls == 0 {
				t.Error("call never ran")
			}
		})
	}
	// A call that fails for good is returned as it is, at once.
	final := fmt.Errorf("x: %w", errkind.ErrNotFound)
	calls := 0
	if err := retry(context.Background(), func() error { calls++; return final }); err != final || calls != 1 {
		t.Errorf("non-retryable: %v after %d calls", err, calls)
	}
}
