package agentclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Defaults of ReadyOptions.
const (
	// DefaultReadyPoll is the pause between two health checks.
	DefaultReadyPoll = 25 * time.Millisecond
	// readyAttempt bounds one health check, so that a daemon that accepts
	// but never answers cannot hold the whole wait on one call.
	readyAttempt = time.Second
)

// ReadyOptions tune WaitReady.
type ReadyOptions struct {
	// Timeout bounds the whole wait; 0 leaves it to ctx.
	Timeout time.Duration
	// Poll is the pause between health checks (0: DefaultReadyPoll).
	Poll time.Duration
	// Alive, when set, is asked after every health check that did not
	// report SERVING whether the daemon can still come up: a non-nil
	// error (the process or container has exited) ends the wait at once
	// and is returned as it is, so it should wrap a sentinel
	// (errkind.ErrUnavailable).
	Alive func(ctx context.Context) error
}

// WaitReady waits until the daemon behind c serves and accepts c's
// credentials: it polls the standard gRPC health service until it reports
// SERVING, then makes one authenticated call (Info), whose response it
// returns, so that a wrong token is found here and not at the first real
// call. Every failure is a compute error (errors.Is on errkind sentinels),
// with gRPC's own text left out:
//
//   - the daemon does not serve within Timeout: errkind.ErrUnavailable,
//     retryable, with the cause of the last failed check;
//   - Alive reports the daemon gone: Alive's error;
//   - it serves but refuses the call: the call's error (a bad token is
//     errkind.ErrUnauthenticated);
//   - ctx is canceled: errkind.ErrCanceled; ctx's own deadline passes:
//     errkind.ErrDeadlineExceeded.
func WaitReady(ctx context.Context, c *Client, opts ReadyOptions) (*DaemonInfo, error) {
	parent := ctx
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	poll := opts.Poll
	if poll <= 0 {
		poll = DefaultReadyPoll
	}
	why := "" // the last check's answer that the wait's end did not cut short
	for {
		answer, err := checkServing(ctx, c)
		if why == "" || ctx.Err() == nil {
			why = answer
		}
		if err == nil {
			info, err := c.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("the sandbox daemon serves but refused an authenticated call: %w", err)
			}
			return info, nil
		}
		if opts.Alive != nil {
			if gone := opts.Alive(ctx); gone != nil {
				return nil, gone
			}
		}
		select {
		case <-ctx.Done():
			switch {
			case errors.Is(parent.Err(), context.Canceled):
				return nil, fmt.Errorf("waiting for the sandbox daemon to serve: %w", errkind.ErrCanceled)
			case parent.Err() != nil:
				return nil, fmt.Errorf("waiting for the sandbox daemon to serve: %w (last check: %s)", errkind.ErrDeadlineExceeded, why)
			}
			return nil, errkind.MarkRetryable(fmt.Errorf("%w: the sandbox daemon did not serve within %s (last check: %s)",
				errkind.ErrUnavailable, opts.Timeout, why))
		case <-time.After(poll):
		}
	}
}

// checkServing asks the health service once. When the daemon does not
// serve, it returns why in words (never gRPC's text, which names host
// socket paths) and a non-nil error.
func checkServing(ctx context.Context, c *Client) (string, error) {
	actx, cancel := context.WithTimeout(ctx, readyAttempt)
	defer cancel()
	if err := c.Health(actx); err != nil {
		return err.Error(), err
	}
	return "", nil
}
