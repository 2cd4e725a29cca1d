package compute

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Provider is one way of running sandboxes: how a sandbox is created, found
// again, listed and deleted. The session logic (materialization, snapshots,
// fingerprints, hooks, state) is shared in Client and Session; a provider
// only manages the sandbox itself and hands back a connected daemon client.
//
// Implementations must be safe for concurrent use.
type Provider interface {
	// Name identifies the provider in State ("local", "docker", "remote").
	Name() string
	// Launch creates and starts a sandbox and returns it connected and
	// serving. When spec.Prior is set, the sandbox replaces an earlier one of
	// the same session: the provider reuses what survived of it (a workspace
	// directory, a volume) and says so with Sandbox.WorkspaceKept.
	Launch(ctx context.Context, spec LaunchSpec) (Sandbox, error)
	// Reattach connects to the sandbox an earlier Sandbox.State described,
	// restarting it first when it is stopped and the provider can. It
	// returns an error wrapping ErrNotFound when the sandbox is gone, so the
	// caller can launch a replacement.
	Reattach(ctx context.Context, spec LaunchSpec, prior json.RawMessage) (Sandbox, error)
	// Destroy deletes the sandbox an earlier Sandbox.State described and
	// what the provider created for it, as the provider's delete policy
	// says. Destroying a sandbox that is already gone is not an error.
	Destroy(ctx context.Context, prior json.RawMessage) error
	// List returns the sandboxes this provider manages, running or not,
	// including ones leaked by a harness that crashed.
	List(ctx context.Context) ([]SandboxInfo, error)
}

// AccountProvider is implemented by providers whose sandboxes can create
// accounts. When a session's manifest names no run_as user, Client.Create
// gives it the account DefaultRunAs returns, so model-directed processes
// never run as root or as the harness's own user by default. A nil
// account means the provider cannot create one here (a local provider
// whose harness is not root); work then runs as the daemon's own user.
type AccountProvider interface {
	DefaultRunAs() *manifest.User
}

// DefaultRunAsName is the name of the account providers give sessions
// whose manifest names no run_as user.
const DefaultRunAsName = "sandbox"

// LaunchSpec is what a provider needs to create or find a sandbox.
type LaunchSpec struct {
	// SessionID names the session; providers use it in names and labels.
	SessionID string
	// Manifest is the trusted manifest (workspace root, grants, run_as);
	// its entries are applied later by the session, not by the provider.
	Manifest *manifest.Manifest
	// Lifetime limits recorded with the sandbox so List and Reap can find
	// expired ones.
	Lifetime Lifetime
	// Labels are extra key/value labels recorded with the sandbox.
	Labels map[string]string
	// Prior is the provider state of an earlier sandbox of the same session
	// that this one replaces (nil for a new session).
	Prior json.RawMessage
	// Options are provider-specific options for this sandbox (for example
	// *docker.CreateOptions); nil means the provider's defaults.
	Options any
	// DiscardMemory tells Reattach not to restore a paused sandbox (see
	// Pauser) but to return ErrNotFound, and Launch to delete its
	// checkpoint once the replacement runs.
	DiscardMemory bool
}

// OptionsAs reads LaunchSpec.Options for a provider whose options are of
// type T: nil gives nil (the provider's defaults), a *T or a T gives the
// options, and anything else an error wrapping ErrInvalidArgument that
// names the provider and the type it wants (want, e.g.
// "*docker.CreateOptions").
func OptionsAs[T any](provider, want string, opts any) (*T, error) {
	switch v := opts.(type) {
	case nil:
		return nil, nil
	case *T:
		return v, nil
	case T:
		return &v, nil
	}
	return nil, fmt.Errorf("%s: %w: LaunchSpec.Options is %T, want %s", provider, ErrInvalidArgument, opts, want)
}

// Lifetime bounds how long a sandbox may live.
type Lifetime struct {
	// CreatedAt is when the session was first created.
	CreatedAt time.Time `json:"created_at"`
	// TTL, when positive, is the most a sandbox may live after CreatedAt.
	TTL time.Duration `json:"ttl,omitempty"`
	// IdleTimeout, when positive, is the most a sandbox may stay unused.
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
}

// OrphanReaper is implemented by providers whose failed launches can
// leave objects of their own that List does not show (kubernetes: a
// NetworkPolicy without its Pod). Client.Reap calls it after removing the
// expired sandboxes.
type OrphanReaper interface {
	ReapOrphans(ctx context.Context, now time.Time) error
}

// Expired reports whether a sandbox with this lifetime, last active at
// lastActive, has outlived its TTL or idle timeout at now.
func (l Lifetime) Expired(now, lastActive time.Time) bool {
	if l.TTL > 0 && !l.CreatedAt.IsZero() && now.Sub(l.CreatedAt) > l.TTL {
		return true
	}
	if lastActive.IsZero() {
		lastActive = l.CreatedAt
	}
	return l.IdleTimeout > 0 && !lastActive.IsZero() && now.Sub(lastActive) > l.IdleTimeout
}

// Sandbox is one live sandbox as a provider hands it to a Session.
type Sandbox interface {
	// Agent is the typed client of the sandbox's daemon. It reconnects by
	// itself when the connection drops; it is valid until Close.
	Agent() *agentclient.Client
	// State returns the provider's fields that find this sandbox again
	// (container id, directory, address). Never a token or credential.
	State() (json.RawMessage, error)
	// WorkspaceKept reports whether the workspace was carried over from an
	// earlier sandbox of the same session (Launch with Prior, or Reattach),
	// so the session may skip restoring it.
	WorkspaceKept() bool
	// Touch records activity for idle timeouts. Providers that cannot
	// record it return nil.
	Touch(ctx context.Context) error
	// Shutdown stops the sandbox (its processes end). What Destroy removes
	// (directory, container, volume) is left for Destroy.
	Shutdown(ctx context.Context) error
	// Close releases the harness-side resources (connections) and leaves
	// the sandbox as it is. Idempotent.
	Close() error
}

// SandboxInfo describes a sandbox a provider manages.
type SandboxInfo struct {
	Provider  string
	SessionID string
	// ID is the provider's name for it (container id, directory).
	ID      string
	Running bool
	// Paused is set for a sandbox paused with its memory (see Pauser).
	Paused   bool
	Lifetime Lifetime
	// LastActive is the last recorded activity (zero when unknown).
	LastActive time.Time
	// State finds the sandbox again (Provider.Reattach, Provider.Destroy).
	State json.RawMessage
}

// Expired reports whether the sandbox outlived its TTL or idle timeout at now.
func (i SandboxInfo) Expired(now time.Time) bool { return i.Lifetime.Expired(now, i.LastActive) }

// tracerKey keys the tracer provider in a context.
type tracerKey struct{}

// WithRPCTracing returns a context telling providers to instrument the
// daemon clients they dial with tp (agentclient.Options.TracerProvider).
// Client.Create and Client.Resume set it from ClientOptions.TracerProvider.
func WithRPCTracing(ctx context.Context, tp trace.TracerProvider) context.Context {
	if tp == nil {
		return ctx
	}
	return context.WithValue(ctx, tracerKey{}, tp)
}

// RPCTracing returns the tracer provider set by WithRPCTracing, or nil (no
// instrumentation). Providers pass it to agentclient.Dial.
func RPCTracing(ctx context.Context) trace.TracerProvider {
	tp, _ := ctx.Value(tracerKey{}).(trace.TracerProvider)
	return tp
}
