package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// apiErr wraps an API server error with the verb and resource it was
// about, mapped to the compute sentinels: a refused permission names the
// verb and resource the provider's Role lacks; an unreachable or
// overloaded API server is ErrUnavailable and retryable.
func (p *Provider) apiErr(verb, resource, name string, err error) error {
	if err == nil {
		return nil
	}
	what := verb + " " + resource
	if name != "" {
		what += " " + name
	}
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("kubernetes: %s: %w: the provider's account may not %q %q in namespace %s (grant the Role in the package documentation): %w",
			what, compute.ErrPermissionDenied, verb, resource, p.cfg.Namespace, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("kubernetes: %s: %w: the API server does not accept the provider's credentials: %w", what, compute.ErrUnauthenticated, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("kubernetes: %s: %w: %w", what, compute.ErrNotFound, err)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("kubernetes: %s: %w: %w", what, compute.ErrAlreadyExists, err)
	case apierrors.IsConflict(err):
		return fmt.Errorf("kubernetes: %s: %w: %w", what, compute.ErrConflict, err)
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return fmt.Errorf("kubernetes: %s: %w: %w", what, compute.ErrInvalidArgument, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("kubernetes: %s: %w: %w", what, compute.ErrCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("kubernetes: %s: %w: %w", what, compute.ErrDeadlineExceeded, err)
	case transient(err):
		return compute.MarkRetryable(fmt.Errorf("kubernetes: %s: %w: the API server does not answer: %w", what, compute.ErrUnavailable, err))
	}
	return fmt.Errorf("kubernetes: %s: %w", what, err)
}

// transient reports errors a retry may clear: the API server unreachable,
// restarting, overloaded or timing out.
func transient(err error) bool {
	if apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}
