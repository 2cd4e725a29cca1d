package compute

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
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
	// PreStopHooks are registered on every session, before the session's
	// own (Session.OnPreStop): for example mount.Mounter.PreStop, which
	// uploads writable mounts back when the session closes.
	PreStopHooks []PreStopHook
	// Log receives lifecycle events; nil means no logging.
	Log *zap.Logger
	// Now is the clock for lifetimes (tests); nil means time.Now.
	Now func() time.Time
	// TracerProvider receives spans of the sandbox operations
	// (compute.create, compute.resume, compute.delete, session.start with
	// session.restore and session.materialize, session.stop with
	// session.archive, session.shutdown, session.close) with the session,
	// provider and snapshot ids (bulkhead.session.id, bulkhead.provider,
	// bulkhead.snapshot.id), never file contents or environment; a failure
	// is recorded by its class (error.type), not its message. nil means the global OpenTelemetry provider (a no-op
	// unless the application set one). The daemon's gRPC calls are traced
	// by the agentclient (agentclient.Options.TracerProvider).
	TracerProvider trace.TracerProvider
	// Observer, when set, is told how long each sandbox operation took
	// and whether it failed, for metrics (pkg/harness/metrics implements
	// it); nil means nobody is told.
	Observer Observer
}

// Observer is told about a Client's sandbox operations as they finish. Its
// method is called synchronously: it must be quick and safe for
// concurrent use.
type Observer interface {
	// SandboxOperation reports one finished operation of the named
	// provider: OpCreate, OpResume, OpStart or OpDelete, how long it took
	// and its error (nil: it succeeded).
	SandboxOperation(provider, operation string, d time.Duration, err error)
}

// Operations reported to an Observer.
const (
	// OpCreate is Client.Create: launching a new sandbox (not Start).
	OpCreate = "create"
	// OpResume is Client.Resume: reattaching, or launching a replacement.
	OpResume = "resume"
	// OpStart is Session.Start: restoring the snapshot and materializing
	// the manifest (a no-op for a sandbox already started).
	OpStart = "start"
	// OpDelete is Client.Delete.
	OpDelete = "delete"
)

// observe reports an operation that began at start to the Observer.
func (c *Client) observe(op string, start time.Time, err error) {
	if c.opts.Observer != nil {
		c.opts.Observer.SandboxOperation(c.p.Name(), op, time.Since(start), err)
	}
}

// Client creates, resumes and deletes sessions of one provider. It is safe
// for concurrent use.
type Client struct {
	p      Provider
	opts   ClientOptions
	log    *zap.Logger
	tracer trace.Tracer
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
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider() // delegates to a provider set later
	}
	return &Client{p: p, opts: opts, log: log.With(zap.String("provider", p.Name())),
		tracer: tp.Tracer(TracerName, trace.WithInstrumentationVersion(buildinfo.Version()))}
}

// TracerName is the instrumentation scope of the compute plane's spans.
const TracerName = "github.com/bulkhead-dev/bulkhead/pkg/compute"

// Span attributes of the compute plane's spans (the harness's tracing
// package uses the same names).
const (
	attrSessionID  = "bulkhead.session.id"
	attrProvider   = "bulkhead.provider"
	attrSnapshotID = "bulkhead.snapshot.id"
	attrResume     = "bulkhead.session.resume"   // "reattached", "restored" or "replaced"
	attrKept       = "bulkhead.workspace.kept"   // a replacement found the workspace
	attrRestore    = "bulkhead.snapshot.restore" // what Start did with the snapshot
	attrRestored   = "bulkhead.session.restored"
	attrPersisted  = "bulkhead.snapshot.persisted"
	attrReady      = "bulkhead.session.ready" // Start found the workspace ready
	attrErrorType  = "error.type"

	attrEphemeralOnly = "bulkhead.materialize.ephemeral_only" // after a restore
)

// startSpan starts a span of a sandbox operation of this client's provider.
func (c *Client) startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append([]attribute.KeyValue{attribute.String(attrProvider, c.p.Name())}, attrs...)
	return c.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan records err, by its class only (messages can quote files), and
// ends span.
func endSpan(span trace.Span, err error) {
	if err != nil {
		typ := errkind.ErrorType(err)
		span.SetAttributes(attribute.String(attrErrorType, typ))
		span.SetStatus(codes.Error, typ)
	}
	span.End()
}

// Provider returns the provider's name.
func (c *Client) Provider() string { return c.p.Name() }

// Snapshots returns the client's snapshot store (nil when it has none).
func (c *Client) Snapshots() snapshot.Store { return c.opts.Snapshots }

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
	// Limits bound the session's materialization and snapshot restores.
	Limits Limits
}

// Limits bound the work a session does for the harness.
type Limits struct {
	// MaterializeConcurrency bounds the git fetches and host directory
	// walks of a materialization running at once (0: the client's
	// materializer setting, default 4).
	MaterializeConcurrency int
	// Archive bounds snapshot restores; zero fields take the daemon's
	// defaults.
	Archive ArchiveLimits
}

// ArchiveLimits bound what a snapshot may make a restore do; zero fields
// take the daemon's defaults.
type ArchiveLimits = agentclient.ArchiveLimits

// Create launches a sandbox for a new session. Call Start to apply the
// manifest (or restore the snapshot) before using it.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (_ *Session, err error) {
	ctx, span := c.startSpan(ctx, "compute.create")
	defer func(start time.Time) { endSpan(span, err); c.observe(OpCreate, start, err) }(time.Now())
	ctx = WithRPCTracing(ctx, c.opts.TracerProvider)
	m := opts.Manifest
	if m == nil {
		m = &manifest.Manifest{}
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	m = withDefaultRunAs(m, c.p)
	id := opts.SessionID
	if id == "" {
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
	span.SetAttributes(attribute.String(attrSessionID, id), attribute.String(attrSnapshotID, snap))
	life := Lifetime{CreatedAt: c.opts.Now().UTC(), TTL: opts.TTL, IdleTimeout: opts.IdleTimeout}
	sb, err := c.p.Launch(ctx, LaunchSpec{SessionID: id, Manifest: m, Lifetime: life, Labels: opts.Labels, Options: opts.ProviderOptions})
	if err != nil {
		return nil, fmt.Errorf("create %s sandbox: %w", c.p.Name(), err)
	}
	c.log.Info("sandbox created", zap.String("session", id))
	return newSession(c, sb, sessionInit{id: id, manifest: m, snapshotID: snap, skip: opts.SkipPaths, lifetime: life, limits: opts.Limits}), nil
}

// withDefaultRunAs gives a manifest that names no run_as user the
// provider's default account (see AccountProvider), declared as one of
// the manifest's users.
func withDefaultRunAs(m *manifest.Manifest, p Provider) *manifest.Manifest {
	if m.RunAs != "" {
		return m
	}
	ap, ok := p.(AccountProvider)
	if !ok {
		return m
	}
	u := ap.DefaultRunAs()
	if u == nil {
		return m
	}
	out := m.Clone()
	out.RunAs = u.Name
	for _, have := range out.Users {
		if have.Name == u.Name {
			return out // declared by the manifest itself: as declared
		}
	}
	out.Users = append(out.Users, *u)
	return out
}

// ResumeOption adjusts Resume.
type ResumeOption func(*resumeOptions)

type resumeOptions struct {
	trusted       *manifest.Manifest
	provider      any
	limits        Limits
	discardMemory bool
}

// WithLimits sets the resumed session's limits.
func WithLimits(l Limits) ResumeOption {
	return func(o *resumeOptions) { o.limits = l }
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
// still exists (restarting it if the provider can; restoring a paused one
// with its memory and processes, see Pauser and DiscardMemory), and
// otherwise launches a replacement on whatever survived (a directory, a
// volume). Call Start:
// it is a no-op for a live sandbox and restores the snapshot for a
// replacement, unless the fingerprint shows the kept workspace unchanged.
func (c *Client) Resume(ctx context.Context, st *State, opts ...ResumeOption) (_ *Session, err error) {
	ctx, span := c.startSpan(ctx, "compute.resume")
	defer func(start time.Time) { endSpan(span, err); c.observe(OpResume, start, err) }(time.Now())
	ctx = WithRPCTracing(ctx, c.opts.TracerProvider)
	if st == nil {
		return nil, fmt.Errorf("%w: nil session state", ErrInvalidArgument)
	}
	span.SetAttributes(attribute.String(attrSessionID, st.SessionID))
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
		if m, err = m.Rebind(o.trusted); err != nil {
			return nil, fmt.Errorf("%w: trusted manifest: %v", ErrInvalidArgument, err)
		}
	}
	spec := LaunchSpec{SessionID: st.SessionID, Manifest: m, Lifetime: st.Lifetime, Prior: st.ProviderState, Options: o.provider,
		DiscardMemory: o.discardMemory}
	init := sessionInit{id: st.SessionID, manifest: m, snapshotID: st.SnapshotID, skip: st.SkipPaths,
		lifetime: st.Lifetime, fingerprint: st.Fingerprint, limits: o.limits}
	if init.snapshotID == "" {
		init.snapshotID = st.SessionID
	}
	span.SetAttributes(attribute.String(attrSnapshotID, init.snapshotID))
	sb, err := c.p.Reattach(ctx, spec, st.ProviderState)
	switch {
	case err == nil:
		how := "reattached"
		if r, ok := sb.(RestoredSandbox); ok && r.Restored() {
			how, init.restored = "restored", true
		}
		c.log.Info("sandbox "+how, zap.String("session", st.SessionID))
		span.SetAttributes(attribute.String(attrResume, how))
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
	span.SetAttributes(attribute.String(attrResume, "replaced"), attribute.Bool(attrKept, sb.WorkspaceKept()))
	return newSession(c, sb, init), nil
}

// Delete removes the session's sandbox and what the provider created for
// it. The session's snapshot stays in the store (delete it there), so the
// session can still be resumed from it. Deleting twice is not an error.
func (c *Client) Delete(ctx context.Context, s *Session) (err error) {
	if s == nil {
		return nil
	}
	ctx, span := c.startSpan(ctx, "compute.delete", attribute.String(attrSessionID, s.id))
	defer func(start time.Time) { endSpan(span, err); c.observe(OpDelete, start, err) }(time.Now())
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
	if o, ok := c.p.(OrphanReaper); ok {
		if err := o.ReapOrphans(ctx, now); err != nil {
			errs = append(errs, fmt.Errorf("reap orphans: %w", err))
		}
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
