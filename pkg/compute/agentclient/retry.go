package agentclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Reconnection policy for calls that are safe to repeat (reads from a
// cursor, writes at an offset, starts with a request id). gRPC re-dials on
// its own; these bounds say how long a call keeps trying meanwhile.
const (
	retryInitialBackoff = 50 * time.Millisecond
	retryMaxBackoff     = 2 * time.Second
	retryBudget         = 15 * time.Second
)

// retry runs call until it succeeds, fails with an error that is not
// retryable, ctx ends, or the retry budget is spent. When ctx ends while
// it waits to try again, the error is the context's first (canceled or
// deadline exceeded: its class, what the caller asked for), wrapping the
// last attempt's as its cause, so a caller still learns that the sandbox
// was unreachable and that a call with a new context may succeed.
func retry(ctx context.Context, call func() error) error {
	deadline := time.Now().Add(retryBudget)
	backoff := retryInitialBackoff
	for {
		err := call()
		if err == nil || !errkind.Retryable(err) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w; last attempt: %w", errkind.ClassifyFS(ctx.Err()), err)
		case <-t.C:
		}
		backoff = min(backoff*2, retryMaxBackoff)
	}
}

// NewRequestID returns a random id for idempotent Start/Exec calls.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
