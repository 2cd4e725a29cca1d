package compute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// PreStopHook runs at the start of Close, before the workspace is
// persisted: flush state into the workspace, stop servers, collect output.
type PreStopHook func(ctx context.Context, s *Session) error

// Session is one live sandbox owned by a run (or by the application that
// injected it): its lifecycle (Start, Stop, Close, ...) and its daemon's
// operations in Go types (Exec, StartProcess, ReadFile, ApplyPatch, ...;
// see sandbox.go). It is safe for concurrent use.
type Session struct {
	c  *Client
	sb Sandbox
	id string

	mu          sync.Mutex
	manifest    *manifest.Manifest
	snapshotID  string
	skip        []string
	lifetime    Lifetime
	fingerprint string
	limits      Limits
	started     bool
	hooks       []PreStopHook
	closed      bool
	closeErr    error
	materialize *MaterializeResult
	// paused: Pause checkpointed the sandbox; restored: Resume restored
	// it from a pause (see pause.go).
	paused   bool
	restored bool
}

// sessionInit is what a new Session starts from.
type sessionInit struct {
	id          string
	manifest    *manifest.Manifest
	snapshotID  string
	skip        []string
	lifetime    Lifetime
	fingerprint string
	live        bool // reattached to a sandbox whose workspace is ready
	restored    bool // restored from a pause
	limits      Limits
}

func newSession(c *Client, sb Sandbox, in sessionInit) *Session {
	return &Session{c: c, sb: sb, id: in.id, manifest: in.manifest, snapshotID: in.snapshotID,
		skip: in.skip, lifetime: in.lifetime, fingerprint: in.fingerprint, started: in.live, limits: in.limits,
		restored: in.restored, hooks: slices.Clone(c.opts.PreStopHooks)}
}

// ID returns the session id.
func (s *Session) ID() string { return s.id }

// Provider returns the provider's name.
func (s *Session) Provider() string { return s.c.p.Name() }

// Agent returns the typed client of the sandbox's daemon: processes,
// files, patches, archives. It reconnects by itself; processes survive a
// dropped connection and Follow resumes from its cursor. The Session's own
// methods (Exec, ReadFile, ...) delegate to it; Agent is for what they
// leave out (archives, fingerprints, token rotation, Info).
func (s *Session) Agent() *agentclient.Client { return s.sb.Agent() }

// Manifest returns the manifest the workspace was made from.
func (s *Session) Manifest() *manifest.Manifest { return s.manifest }

// Materialized returns the daemon's report of the last materialization
// (each file with its sha256), or nil.
func (s *Session) Materialized() *MaterializeResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.materialize
}

// OnPreStop registers a hook that Close runs before persisting.
func (s *Session) OnPreStop(h PreStopHook) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks = append(s.hooks, h)
}

// startSpan starts a span of an operation on this session.
func (s *Session) startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append([]attribute.KeyValue{attribute.String(attrSessionID, s.id), attribute.String(attrSnapshotID, s.snapshotID)}, attrs...)
	return s.c.startSpan(ctx, name, attrs...)
}

// excludes are the workspace paths snapshots leave out.
func (s *Session) excludes() []string {
	return append(s.manifest.EphemeralPaths(), s.skip...)
}

// fingerprintExtra binds the fingerprint to the manifest, so a changed
// manifest never skips a restore.
func (s *Session) fingerprintExtra() ([]byte, error) {
	return json.Marshal(s.manifest.Redacted())
}

// Start makes the workspace ready. A sandbox reattached alive is ready
// already. Otherwise, when the snapshot exists it is restored (skipped
// when a kept workspace's fingerprint matches the one persisted), and the
// accounts, grants and ephemeral entries are applied on top; when there is
// no snapshot the whole manifest is materialized. Start is idempotent.
func (s *Session) Start(ctx context.Context) (err error) {
	ctx, span := s.startSpan(ctx, "session.start")
	defer func(start time.Time) { endSpan(span, err); s.c.observe(OpStart, start, err) }(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: session %s is closed", ErrFailedPrecondition, s.id)
	}
	if s.started {
		span.SetAttributes(attribute.Bool(attrReady, true))
		return nil
	}
	agent := s.sb.Agent()
	restored, err := s.restore(ctx, agent)
	if err != nil {
		return err
	}
	span.SetAttributes(attribute.Bool(attrRestored, restored))
	opts := s.c.opts.Materializer
	opts.Log = s.c.log
	opts.Session = s.id
	if s.limits.MaterializeConcurrency > 0 {
		opts.Concurrency = s.limits.MaterializeConcurrency
	}
	if restored {
		opts.Include = func(_ string, e *manifest.Entry) bool { return e.IsEphemeral() }
	}
	mctx, mspan := s.startSpan(ctx, "session.materialize", attribute.Bool(attrEphemeralOnly, restored))
	resp, err := materializer.Apply(mctx, agent, s.manifest, opts)
	endSpan(mspan, err)
	if err != nil {
		return fmt.Errorf("start session %s: %w", s.id, err)
	}
	s.materialize = resp
	s.started = true
	_ = s.sb.Touch(ctx)
	return nil
}

// restore brings the workspace back from the snapshot when there is one,
// and reports whether the workspace now holds the session's files.
func (s *Session) restore(ctx context.Context, agent *agentclient.Client) (restored bool, err error) {
	store := s.c.opts.Snapshots
	if store == nil {
		return false, nil
	}
	ctx, span := s.startSpan(ctx, "session.restore")
	outcome := "absent"
	defer func() {
		if err == nil {
			span.SetAttributes(attribute.String(attrRestore, outcome))
		}
		endSpan(span, err)
	}()
	if s.sb.WorkspaceKept() && s.fingerprint != "" {
		extra, err := s.fingerprintExtra()
		if err != nil {
			return false, err
		}
		live, err := agent.Fingerprint(ctx, agentclient.FingerprintOptions{Exclude: s.excludes(), Extra: extra})
		if err != nil {
			return false, fmt.Errorf("start session %s: fingerprint: %w", s.id, err)
		}
		if live == s.fingerprint {
			outcome = "unchanged"
			s.c.log.Info("workspace unchanged since the snapshot; restore skipped", zap.String("session", s.id))
			return true, nil
		}
	}
	ok, err := store.Exists(ctx, s.snapshotID)
	if err != nil {
		return false, fmt.Errorf("start session %s: snapshot: %w", s.id, err)
	}
	if !ok {
		return false, nil
	}
	r, err := store.Get(ctx, s.snapshotID)
	if err != nil {
		return false, fmt.Errorf("start session %s: open snapshot: %w", s.id, err)
	}
	defer r.Close()
	al := s.limits.Archive
	if _, err := agent.Restore(ctx, agentclient.RestoreOptions{Exclude: s.excludes(), PreserveOwnership: true, Limits: al}, r); err != nil {
		return false, fmt.Errorf("start session %s: restore snapshot %s: %w", s.id, s.snapshotID, err)
	}
	s.c.log.Info("workspace restored from snapshot", zap.String("session", s.id), zap.String("snapshot", s.snapshotID))
	outcome = "restored"
	return true, nil
}

// Stop persists the workspace to the snapshot store (when the client has
// one) and records its fingerprint. The sandbox keeps running.
func (s *Session) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stop(ctx)
}

func (s *Session) stop(ctx context.Context) (err error) {
	ctx, span := s.startSpan(ctx, "session.stop")
	persisted := false
	defer func() {
		span.SetAttributes(attribute.Bool(attrPersisted, persisted))
		endSpan(span, err)
	}()
	store := s.c.opts.Snapshots
	if store == nil || !s.started {
		return nil
	}
	if _, noop := store.(snapshot.Noop); noop {
		return nil
	}
	agent := s.sb.Agent()
	extra, err := s.fingerprintExtra()
	if err != nil {
		return err
	}
	actx, aspan := s.startSpan(ctx, "session.archive")
	pr, pw := io.Pipe()
	archived := make(chan error, 1)
	go func() {
		_, err := agent.Archive(actx, agentclient.ArchiveOptions{Exclude: s.excludes()}, pw)
		pw.CloseWithError(err)
		archived <- err
	}()
	_, err = store.Put(actx, s.snapshotID, pr)
	pr.CloseWithError(errors.New("snapshot store stopped reading"))
	if aerr := <-archived; aerr != nil {
		endSpan(aspan, aerr)
		return fmt.Errorf("stop session %s: archive workspace: %w", s.id, aerr)
	}
	endSpan(aspan, err)
	if err != nil {
		return fmt.Errorf("stop session %s: store snapshot %s: %w", s.id, s.snapshotID, err)
	}
	fp, err := agent.Fingerprint(ctx, agentclient.FingerprintOptions{Exclude: s.excludes(), Extra: extra})
	if err != nil {
		return fmt.Errorf("stop session %s: fingerprint: %w", s.id, err)
	}
	s.fingerprint = fp
	persisted = true
	s.c.log.Info("workspace persisted", zap.String("session", s.id), zap.String("snapshot", s.snapshotID))
	return nil
}

// Shutdown stops the sandbox (its processes end); Delete removes it.
func (s *Session) Shutdown(ctx context.Context) (err error) {
	ctx, span := s.startSpan(ctx, "session.shutdown")
	defer func() { endSpan(span, err) }()
	if err := s.sb.Shutdown(ctx); err != nil {
		return fmt.Errorf("shut down session %s: %w", s.id, err)
	}
	return nil
}

// Close runs the pre-stop hooks, persists the workspace, shuts the sandbox
// down and releases the connection, in that order, continuing past
// failures so everything is released; it returns every error. Closing
// again returns the first result.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.closeErr
	}
	hooks := s.hooks
	s.mu.Unlock()
	ctx, span := s.startSpan(ctx, "session.close")
	var errs []error
	for _, h := range hooks {
		if err := h(ctx, s); err != nil {
			errs = append(errs, fmt.Errorf("pre-stop hook: %w", err))
		}
	}
	s.mu.Lock()
	errs = append(errs, s.stop(ctx))
	s.closed = true
	s.mu.Unlock()
	errs = append(errs, s.Shutdown(ctx), s.sb.Close())
	err := errors.Join(errs...)
	endSpan(span, err)
	s.mu.Lock()
	s.closeErr = err
	s.mu.Unlock()
	return err
}

// Release drops the connection and leaves the sandbox running, for a
// session to be resumed later from its State (by this process or another).
func (s *Session) Release() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.sb.Close()
}

// State returns the session's serializable state.
func (s *Session) State() (*State, error) {
	ps, err := s.sb.State()
	if err != nil {
		return nil, fmt.Errorf("session %s state: %w", s.id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &State{
		Version: StateVersion, Provider: s.c.p.Name(), SessionID: s.id,
		Manifest: s.manifest.Redacted(), SnapshotID: s.snapshotID, Fingerprint: s.fingerprint,
		Started: s.started, SkipPaths: s.skip, Lifetime: s.lifetime, ProviderState: ps, Paused: s.paused,
	}, nil
}
