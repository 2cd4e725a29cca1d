package compute

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// ClientOptions configures a Client.
type ClientOptions struct {
	// Snapshots keeps workspaces between sandbox lifetimes; nil means
	// nothing is persisted (Stop only records nothing, resume after the
	// sandbox is gone starts from the manifest again).
	Snapshots snapshot.Store
	// Materializer says where host sources come from and how git
	// repositories are fetched (its Owner and Include are set per call).
	Materializer materializer.Options
	// Log receives lifecycle events; nil means no logging.
	Log *zap.Logger
	// Now is the clock for lifetimes (tests); nil means time.Now.
	Now func() time.Time
}

// Client creates, resumes and deletes sessions of one provider. It is safe
// for concurrent use.
type Client struct {
	p    Provider
	opts ClientOptions
	log  *zap.Logger
}

// NewClient returns a Client over a provider.
func NewClient(p Provider, opts ClientOptions) *Client {
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Client{p: p, opts: opts, log: log.With(zap.String("provider", p.Name()))}
}

// Provider returns the provider's name.
func (c *Client) Provider() string { return c.p.Name() }

// CreateOptions describes a new session.
type CreateOptions struct {
	// Manifest is the trusted manifest of the workspace (nil: empty).
	Manifest *manifest.Manifest
	// SessionID names the session; "" means a random id.
	SessionID string
	// SnapshotID names the snapshot the workspace is seeded from when it
	// exists, and persisted to by Stop; "" means the session id.
	SnapshotID string
	// SkipPaths are left out of snapshots, besides ephemeral entries.
	SkipPaths []string
	// TTL and IdleTimeout bound the sandbox's life (zero: unbounded).
	TTL, IdleTimeout time.Duration
	// Labels are recorded with the sandbox.
	Labels map[string]string
	// ProviderOptions are options for this provider (see its package).
	ProviderOptions any
}

// Create launches a sandbox for a new session. Call Start to apply the
// manifest (or restore the snapshot) before using it.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Session, error) {
	m := opts.Manifest
	if m == nil {
		m = &manifest.Manifest{}
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	id := opts.SessionID
	if id == "" {
		var err error
		if id, err = newSessionID(); err != nil {
			return nil, err
		}
	}
	if err := snapshot.ValidateID(id); err != nil {
		return nil, fmt.Errorf("session id: %w", err)
	}
	snap := opts.SnapshotID
	if snap == "" {
		snap = id
	}
	if err := snapshot.ValidateID(snap); err != nil {
		return nil, err
	}
	life := Lifetime{CreatedAt: c.opts.Now().UTC(), TTL: opts.TTL, IdleTimeout: opts.IdleTimeout}
	sb, err := c.p.Launch(ctx, LaunchSpec{SessionID: id, Manifest: m, Lifetime: life, Labels: opts.Labels, Options: opts.ProviderOptions})
	if err != nil {
		return nil, fmt.Errorf("create %s sandbox: %w", c.p.Name(), err)
	}
	c.log.Info("sandbox created", zap.String("session", id))
	return newSession(c, sb, sessionInit{id: id, manifest: m, snapshotID: snap, skip: opts.SkipPaths, lifetime: life}), nil
}

// ResumeOption adjusts Resume.
type ResumeOption func(*resumeOptions)

type resumeOptions struct {
	trusted  *manifest.Manifest
	provider any
}

// WithTrustedManifest gives Resume the application's trusted manifest, so
// host sources and grants removed from the state's redacted copy can be
// applied again if the workspace must be rebuilt.
func WithTrustedManifest(m *manifest.Manifest) ResumeOption {
	return func(o *resumeOptions) { o.trusted = m }
}

// WithProviderOptions passes provider options for a replacement sandbox.
func WithProviderOptions(v any) ResumeOption {
	return func(o *resumeOptions) { o.provider = v }
}

// Resume finds the session's sandbox again: it reattaches when the sandbox
// still exists (restarting it if the provider can), and otherwise launches
// a replacement on whatever survived (a directory, a volume). Call Start:
// it is a no-op for a live sandbox and restores the snapshot for a
// replacement, unless the fingerprint shows the kept workspace unchanged.
func (c *Client) Resume(ctx context.Context, st *State, opts ...ResumeOption) (*Session, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil session state", ErrInvalidArgument)
	}
	if st.Provider != c.p.Name() {
		return nil, fmt.Errorf("%w: session %s belongs to provider %q, not %q", ErrInvalidArgument, st.SessionID, st.Provider, c.p.Name())
	}
	var o resumeOptions
	for _, opt := range opts {
		opt(&o)
	}
	m := st.Manifest
	if m == nil {
		m = &manifest.Manifest{}
	}
	if o.trusted != nil {
		var err error
		if m, err = m.Rebind(o.trusted); err != nil {
			return nil, fmt.Errorf("%w: trusted manifest: %v", ErrInvalidArgument, err)
		}
	}
	spec := LaunchSpec{SessionID: st.SessionID, Manifest: m, Lifetime: st.Lifetime, Prior: st.ProviderState, Options: o.provider}
	init := sessionInit{id: st.SessionID, manifest: m, snapshotID: st.SnapshotID, skip: st.SkipPaths,
		lifetime: st.Lifetime, fingerprint: st.Fingerprint}
	if init.snapshotID == "" {
		init.snapshotID = st.SessionID
	}
	sb, err := c.p.Reattach(ctx, spec, st.ProviderState)
	switch {
	case err == nil:
		c.log.Info("sandbox reattached", zap.String("session", st.SessionID))
		init.live = st.Started
		return newSession(c, sb, init), nil
	case !errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("resume session %s: %w", st.SessionID, err)
	}
	sb, err = c.p.Launch(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("resume session %s: launch a replacement: %w", st.SessionID, err)
	}
	c.log.Info("sandbox replaced", zap.String("session", st.SessionID), zap.Bool("workspace_kept", sb.WorkspaceKept()))
	return newSession(c, sb, init), nil
}

// Delete removes the session's sandbox and what the provider created for
// it. The session's snapshot stays in the store (delete it there), so the
// session can still be resumed from it. Deleting twice is not an error.
func (c *Client) Delete(ctx context.Context, s *Session) error {
	if s == nil {
		return nil
	}
	st, err := s.sb.State()
	if err != nil {
		return fmt.Errorf("delete session %s: %w", s.id, err)
	}
	_ = s.sb.Close()
	if err := c.p.Destroy(ctx, st); err != nil {
		return fmt.Errorf("delete session %s: %w", s.id, err)
	}
	c.log.Info("sandbox deleted", zap.String("session", s.id))
	return nil
}

// DecodeState parses a state and checks it belongs to this provider.
func (c *Client) DecodeState(data []byte) (*State, error) {
	st, err := DecodeState(data)
	if err != nil {
		return nil, err
	}
	if st.Provider != c.p.Name() {
		return nil, fmt.Errorf("%w: state of provider %q given to the %q client", ErrInvalidArgument, st.Provider, c.p.Name())
	}
	return st, nil
}

// List returns the sandboxes the provider manages.
func (c *Client) List(ctx context.Context) ([]SandboxInfo, error) { return c.p.List(ctx) }

// Reap deletes the sandboxes whose TTL or idle timeout has passed
// (including ones a crashed harness leaked) and returns them.
func (c *Client) Reap(ctx context.Context) ([]SandboxInfo, error) {
	all, err := c.p.List(ctx)
	if err != nil {
		return nil, err
	}
	now := c.opts.Now()
	var reaped []SandboxInfo
	var errs []error
	for _, info := range all {
		if !info.Expired(now) {
			continue
		}
		if err := c.p.Destroy(ctx, info.State); err != nil {
			errs = append(errs, fmt.Errorf("reap %s: %w", info.ID, err))
			continue
		}
		c.log.Info("expired sandbox reaped", zap.String("session", info.SessionID), zap.String("id", info.ID))
		reaped = append(reaped, info)
	}
	return reaped, errors.Join(errs...)
}

// newSessionID returns a random session id.
func newSessionID() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("session id: %w", err)
	}
	return "s-" + hex.EncodeToString(b[:]), nil
}
