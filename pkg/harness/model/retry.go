package model

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrStreamInterrupted is the cause of an [APIError] for a stream that ended
// (connection cut, body cut short, no terminal event) before the response
// completed.
var ErrStreamInterrupted = errors.New("response stream interrupted before completion")

// RetryPolicy says how a failed call is retried. Calls are retried on HTTP 408,
// 409, 429 and 5xx, on connection errors, and on interrupted streams; never on
// other 4xx answers or after the context ends. The zero value means the
// defaults documented on each field.
type RetryPolicy struct {
	// MaxAttempts is the total number of requests per call, first included;
	// default 5. 1 disables retries.
	MaxAttempts int
	// InitialBackoff is the delay before the first retry; it doubles on each
	// retry up to MaxBackoff. Defaults 500ms and 30s. A random jitter takes
	// off up to a quarter of each delay.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxRetryAfter caps how long the server may ask us to wait (Retry-After,
	// retry-after-ms): a longer demand ends the call with its error instead
	// of waiting. Default 2 minutes. A server-directed delay is honoured
	// exactly, without jitter.
	MaxRetryAfter time.Duration
	// Sleep waits d or until ctx ends; nil uses a timer. Tests may replace it
	// to observe delays without waiting.
	Sleep func(ctx context.Context, d time.Duration) error
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = 500 * time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = 30 * time.Second
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = 2 * time.Minute
	}
	if p.Sleep == nil {
		p.Sleep = sleep
	}
	return p
}

// delay returns the wait before retry number n (1-based).
func (p RetryPolicy) delay(n int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return retryAfter
	}
	d := p.InitialBackoff
	for i := 1; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	return d - time.Duration(rand.Float64()*float64(d)/4)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// APIError is a failed model call: the provider answered an error, the
// connection failed, or the stream broke off. Its message names the HTTP
// status and request id when there are some, and never contains the API key.
type APIError struct {
	// StatusCode is the HTTP status, 0 when there was no HTTP answer or the
	// failure came inside a stream.
	StatusCode int
	// RequestID is the provider's x-request-id, when known.
	RequestID string
	// Type, Code and Message come from the provider's error body or event.
	Type    string
	Code    string
	Message string
	// RetryAfter is the delay the server asked for, if any.
	RetryAfter time.Duration
	// Retryable says whether trying again later may succeed.
	Retryable bool
	// Attempts is the number of requests made before giving up.
	Attempts int

	msg   string
	cause error
}

// Error describes the failure.
func (e *APIError) Error() string { return e.msg }

// Unwrap returns the underlying cause (an openai-go error, a network error,
// [ErrStreamInterrupted], ...).
func (e *APIError) Unwrap() error { return e.cause }

// finish freezes the message, scrubbing secret from every part of it.
func (e *APIError) finish(secret string) *APIError {
	var b strings.Builder
	b.WriteString("model: openai responses")
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.StatusCode)
		if t := http.StatusText(e.StatusCode); t != "" {
			b.WriteString(" " + t)
		}
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, " (request %s)", e.RequestID)
	}
	switch {
	case e.Message != "":
		b.WriteString(": " + e.Message)
	case e.cause != nil:
		b.WriteString(": " + e.cause.Error())
	}
	if e.Code != "" && !strings.Contains(e.Message, e.Code) {
		fmt.Fprintf(&b, " [%s]", e.Code)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	e.msg = redact(b.String(), secret)
	e.Message = redact(e.Message, secret)
	return e
}

func redact(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, "[REDACTED]")
}

// Retryable reports whether err is a model call failure that may succeed if
// tried again later.
func Retryable(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Retryable
}

func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusConflict ||
		code == http.StatusTooManyRequests || code >= 500
}

// retryableCode classifies error codes reported inside a stream.
func retryableCode(code string) bool {
	switch code {
	case "server_error", "rate_limit_exceeded", "server_is_overloaded", "slow_down", "internal_error":
		return true
	}
	return false
}

// retryAfter reads the server's requested delay: retry-after-ms, then
// Retry-After in seconds or as an HTTP date.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := h.Get("retry-after-ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	if v := h.Get("Retry-After"); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
			return time.Duration(s * float64(time.Second))
		}
		if t, err := http.ParseTime(v); err == nil {
			if d := t.Sub(now); d > 0 {
				return d
			}
		}
	}
	return 0
}
