// Package manager is the run manager and sandbox manager of `harness
// serve`, with a Go API: the service's logic without its transports
// (containerd's split of a service into its local implementation and thin
// gRPC shims). Package service serves it over Connect (gRPC, gRPC-Web,
// JSON), Server-Sent Events and a WebSocket, converting the wire's
// messages to this package's types in one place; a Go program embeds it
// directly, with no HTTP.
//
// Tenants. Every call names its tenant explicitly (the tenant argument
// after ctx): the id the caller authenticated (package auth makes them,
// namespaced by their source: token:alice, jwt:<issuer>:<sub>). The
// manager does not authenticate; it isolates: a tenant sees only its own
// runs and sandboxes, and another tenant's id answers not found exactly
// like an unknown one. An empty tenant is refused (unauthenticated).
//
// Untrusted input. Every field of every call is checked before anything is
// created, by the policy of an untrusted manifest (validate.go: accounts,
// paths, sizes, patterns, models), whether it came over the network or from
// an embedder's own caller. A refusal is a *FieldError naming the field.
//
// Errors. Every error a method returns is classified by pkg/errkind
// (errors.Is(err, errkind.ErrNotFound), errkind.ClassOf): not found,
// invalid argument, resource exhausted (a quota, ErrQuotaExceeded),
// failed precondition (a run in the wrong state; ErrNoModel, a manager
// without a model), unavailable (shutting down); the rest carry the class
// of their cause, or none (internal).
//
// Runs. A run is driven by the harness Runner in this process. The manager
// owns each run's sandbox session (created before the first turn and
// injected into the runner), so files and terminals stay reachable while
// the run waits for approvals. Events are written to the store before they
// are published, numbered per run, in batches by one writer per run, so the
// run never waits for the disk and a subscriber never holds a sequence a
// crash could lose (see events.go); Events replays from the store and then
// follows live events through a bounded buffer: a subscriber that falls
// behind is not allowed to block the run or grow memory, it is moved back
// to reading from the store from its last sequence.
//
// Persistence and restarts. The store holds each run's record, RunState and
// event log. New resumes runs that were waiting for approval (their
// sandboxes reattached, or rebuilt from their snapshots), continues
// checkpointed ones, and reports runs lost in the middle of a turn as
// failed. It also takes back the sandboxes an earlier manager kept for
// finished runs (Config.SandboxRetention): those whose retention ended,
// during a crash or a shutdown, are deleted at once, the others at the
// deadline their record holds. Shutdown drains: every tool call the
// running runs make from then on is held as a checkpoint, so each run stops
// at the end of its turn with a RunState; its sandbox is persisted to the
// snapshot store and released, and the next manager approves the
// checkpointed calls and continues the run.
//
// Goroutines. Every goroutine the manager starts (runs, event writers,
// sandbox deletions, terminal pumps, retention timers once they fire) and
// every blocking call in progress (event streams, terminals, file reads)
// is tracked in one group; Shutdown stops them (streams end with
// unavailable, so their clients reconnect to the next manager) and returns
// once none is left. Calls after Shutdown fail with unavailable.
package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Config configures a Manager.
type Config struct {
	// Store keeps runs and events (required).
	Store store.Store
	// Compute makes the runs' sandboxes (required). Give it a snapshot
	// store so checkpointed sandboxes survive their daemon.
	Compute *compute.Client
	// Model is the model every run calls; it holds the API key. Nil turns
	// runs off: StartRun, Resume, ResumeFromState and Decide fail with
	// failed precondition (ErrNoModel), runs recovered from the store are
	// left as they are for a manager with a model, and the rest (sandboxes,
	// reading runs and events, cancelling) works as usual.
	Model model.Model
	// DefaultModel is the model name of runs that name none (required).
	DefaultModel string
	// Models are the other model names a run may choose (AgentSpec.Model);
	// none: DefaultModel only. A tenant cannot pick an arbitrary model the
	// service's key pays for.
	Models []string
	// Log receives the manager's logs (nil: none).
	Log *zap.Logger
	// DefaultInstructions are the instructions of agents that give none.
	DefaultInstructions string
	// MaxTurns bounds runs that ask for no limit, and caps those that do
	// (0: 30).
	MaxTurns int
	// SandboxRetention keeps a finished run's sandbox this long so its
	// files can be looked at (0: deleted when the run ends). The deadline
	// is stored with the run: a manager started after a crash or a
	// shutdown deletes the sandbox then.
	SandboxRetention time.Duration
	// EventBuffer is how many live events a subscriber may fall behind
	// before it is moved back to reading the store (0: 256).
	EventBuffer int
	// DrainTimeout bounds how long Shutdown waits for running runs to
	// reach the end of their turn (0: 30s); runs still in a turn then are
	// lost and reported failed after the restart.
	DrainTimeout time.Duration
	// Quotas bound what each tenant may hold (zero fields: the defaults
	// of Quotas).
	Quotas Quotas
	// CheckManifest, when set, is asked about every run's manifest after
	// the untrusted-manifest rules, before anything is created: the
	// operator's policy for what a tenant's manifest may name.
	CheckManifest func(*manifest.Manifest) error
	// ProviderOptions, when set, makes the provider options
	// (compute.CreateOptions.ProviderOptions) that carry Quotas.Sandbox to
	// the provider; New calls it once and every sandbox the manager makes
	// or replaces gets its result. It is required when Quotas.Sandbox caps
	// CPU or memory, so a cap is never silently dropped.
	ProviderOptions func(SandboxResources) (any, error)
	// Sandboxes bounds the sandboxes tenants make through the API and
	// what calls do in any sandbox (zero fields: SandboxPolicy's
	// defaults).
	Sandboxes SandboxPolicy
	// Observer, when set, is told how every run goes (RunConfig.Observer).
	Observer harness.RunObserver
	// Runs, when set, is kept told how many stored runs are in each state
	// but running (see RunGauge).
	Runs RunGauge
	// PreviewKey signs the preview tokens of exposed ports (ExposePort;
	// at least MinPreviewKeyBytes). Give the same key to a restarted
	// manager and the tokens it recorded keep working until they expire;
	// nil makes one at random, and the tokens end with the manager.
	PreviewKey []byte
	// Previews bounds exposed ports and their proxied connections (zero
	// fields: PreviewPolicy's defaults).
	Previews PreviewPolicy
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Manager runs agents and keeps their sandboxes for tenants. Make it with
// New and call Shutdown before dropping it (dropping it without is a
// crash, which the next manager over the same store recovers from).
type Manager struct {
	cfg    Config
	log    *zap.Logger
	runner *harness.Runner
	// base is the context of the runs; stop cancels it (hard stop).
	base context.Context
	stop context.CancelFunc

	// tasks tracks every goroutine and every call in progress; drives
	// the goroutines driving runs, which Shutdown waits for first.
	tasks, drives group

	mu       sync.Mutex
	runs     map[string]*liveRun // active runs by id
	sessions map[string]*held    // live sandbox sessions by run id
	// retained are sandboxes kept for finished runs of an earlier
	// manager, not reattached yet, by run id.
	retained map[string]*store.Run
	// timers delete retained sandboxes at their deadline, by run id.
	timers  map[string]*time.Timer
	closing bool
	// released is set once Shutdown took the sessions: none is held
	// any more.
	released bool
	// stopped is closed when the drain is over: streams end then.
	stopped  chan struct{}
	stopOnce sync.Once

	// counts are the runs by stored status (see RunGauge).
	countMu sync.Mutex
	counts  map[string]int

	// usage is every tenant's quota use.
	usage *usage
	// providerOpts and limits go with every sandbox the manager makes.
	providerOpts any
	limits       compute.Limits
	// api are the sandboxes made through the API (apisandbox.go).
	api apiSandboxes
	// ports are the exposed ports (ports.go).
	ports *ports
}

// New makes a manager and recovers what the store holds from an earlier
// one: runs waiting for approval wait again (their sandboxes reattached),
// checkpointed runs continue, runs lost mid-turn are failed, and the
// sandboxes kept for finished runs are deleted at their deadline (at once
// when it passed).
func New(ctx context.Context, cfg Config) (*Manager, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("manager: no store")
	case cfg.Compute == nil:
		return nil, errors.New("manager: no compute client")
	case cfg.DefaultModel == "":
		return nil, errors.New("manager: no default model name")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.MaxTurns <= 0 {
		cfg.MaxTurns = 30
	}
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 256
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for _, m := range cfg.Models {
		if m == "" {
			return nil, errors.New("manager: an empty model name in Models")
		}
	}
	q, err := cfg.Quotas.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	cfg.Quotas = q
	pol, err := cfg.Sandboxes.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	cfg.Sandboxes = pol
	var popts any
	if cfg.ProviderOptions != nil {
		if popts, err = cfg.ProviderOptions(q.Sandbox); err != nil {
			return nil, fmt.Errorf("manager: sandbox resources: %w", err)
		}
	} else if q.Sandbox.MilliCPU > 0 || q.Sandbox.MemoryBytes > 0 {
		return nil, errors.New("manager: Quotas.Sandbox caps CPU or memory but no ProviderOptions carries them to the provider")
	}
	base, stop := context.WithCancel(context.WithoutCancel(ctx))
	m := &Manager{cfg: cfg, log: cfg.Log, base: base, stop: stop,
		runner:       &harness.Runner{Model: cfg.Model, ModelName: cfg.DefaultModel, Log: cfg.Log.Named("runner")},
		runs:         map[string]*liveRun{},
		sessions:     map[string]*held{},
		retained:     map[string]*store.Run{},
		timers:       map[string]*time.Timer{},
		stopped:      make(chan struct{}),
		counts:       map[string]int{},
		usage:        newUsage(q, cfg.Now),
		providerOpts: popts,
		limits:       compute.Limits{Archive: compute.ArchiveLimits{MaxExtractedBytes: q.Sandbox.DiskBytes}},
	}
	fail := func(err error) (*Manager, error) {
		// Whatever recovery started stops before the error is returned.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = m.Shutdown(sctx)
		return nil, err
	}
	if m.ports, err = newPorts(m, cfg.PreviewKey, cfg.Previews, cfg.Log); err != nil {
		stop()
		return nil, fmt.Errorf("manager: %w", err)
	}
	if err := m.countRuns(ctx); err != nil {
		return fail(err)
	}
	m.api = apiSandboxes{policy: pol, boxes: map[string]*box{}, snaps: map[string]*store.Sandbox{}}
	if err := m.recoverAPISandboxes(ctx); err != nil {
		return fail(err)
	}
	if err := m.recoverRetained(ctx); err != nil {
		return fail(err)
	}
	if err := m.recover(ctx); err != nil {
		return fail(err)
	}
	if err := m.recoverPorts(ctx); err != nil {
		return fail(err)
	}
	return m, nil
}

// now is the manager's clock, truncated to microseconds (what every store
// keeps).
func (m *Manager) now() time.Time { return m.cfg.Now().UTC().Truncate(time.Microsecond) }

// DefaultModel is the model name of runs that name none.
func (m *Manager) DefaultModel() string { return m.cfg.DefaultModel }

// ErrNoModel answers the calls that would start or continue a run when the
// manager has no model (Config.Model nil): failed precondition.
var ErrNoModel error = &kindError{kind: errkind.ErrFailedPrecondition, err: errors.New("runs are off: this service has no model key " +
	"(start harness serve with OPENAI_API_KEY set, or with --replay FILE for a scripted model); sandboxes work without one")}

// runsOff is ErrNoModel when the manager has no model, else nil.
func (m *Manager) runsOff() error {
	if m.cfg.Model == nil {
		return ErrNoModel
	}
	return nil
}

// errShutDown answers calls made after Shutdown.
var errShutDown = unavailable("the run manager is shut down")

// errShuttingDown answers calls that would start or continue a run while
// the manager drains.
var errShuttingDown = unavailable("the service is shutting down")

// enter tracks a call in progress (Shutdown waits for it); every exported
// method that does more than read starts with it. The caller defers leave
// when enter succeeds.
func (m *Manager) enter(tenant string) error {
	if tenant == "" {
		return errNoTenant
	}
	if !m.tasks.enter() {
		return errShutDown
	}
	return nil
}

func (m *Manager) leave() { m.tasks.leave() }

// bound returns ctx, also canceled when the manager stops hard (Shutdown
// after the drain): calls that may block (sandbox files, terminals) end
// then.
func (m *Manager) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(m.base, func() { cancel(errShutDown) })
	return ctx, func() { stop(); cancel(nil) }
}

// Shutdown drains the manager: running runs stop at the end of their turn
// (bounded by DrainTimeout, then they are cut and reported lost after the
// restart), every live sandbox of an active run is persisted to its
// snapshot and released (not deleted), sandboxes kept for finished runs are
// released with their deadline in the store (the next manager deletes them
// then), event streams and terminals end, and Shutdown returns once every
// goroutine of the manager has (or ctx is done). The store is not closed.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.Drain()
	t := time.NewTimer(m.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-m.drives.idle():
	case <-t.C:
		m.log.Warn("runs still in a turn after the drain timeout; cutting them")
		m.stop()
		<-m.drives.idle()
	case <-ctx.Done():
		m.stop()
		<-m.drives.idle()
	}
	m.stop()
	// Streams end: their clients reconnect to the next manager from the
	// last sequence they saw.
	m.stopOnce.Do(func() { close(m.stopped) })
	// Persist and release every sandbox still held.
	m.mu.Lock()
	sessions := m.sessions
	m.sessions = map[string]*held{}
	m.released = true
	m.mu.Unlock()
	var errs []error
	for runID, h := range sessions {
		m.mu.Lock()
		_, active := m.runs[runID]
		m.mu.Unlock()
		if !active {
			// A finished run's kept sandbox: released with its deadline
			// in the store (the next manager deletes it then), or
			// deleted now if it has none.
			if err := m.releaseFinished(ctx, runID, h); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := m.checkpointSession(ctx, h.tenant, runID, h.sess); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.releaseAPISandboxes()...)
	// Every event published so far reaches the store before the caller
	// may close it (ended runs flushed theirs in endRun).
	m.mu.Lock()
	runs := make([]*liveRun, 0, len(m.runs))
	for _, lr := range m.runs {
		runs = append(runs, lr)
	}
	m.mu.Unlock()
	for _, lr := range runs {
		lr.flush()
	}
	select {
	case <-m.tasks.close():
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("shutdown: calls or sandbox deletions still running: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// Drain starts a shutdown without waiting: no run starts or continues any
// more, no retained sandbox is deleted by this manager any more (the next
// one does, at the deadline stored), and every tool call running runs make
// from now on is held as a checkpoint, so they stop at the end of their
// turn. Shutdown drains and waits.
func (m *Manager) Drain() {
	m.mu.Lock()
	m.closing = true
	m.drives.close()
	runs := make([]*liveRun, 0, len(m.runs))
	for _, lr := range m.runs {
		runs = append(runs, lr)
	}
	for id, t := range m.timers {
		t.Stop()
		delete(m.timers, id)
	}
	m.mu.Unlock()
	for _, lr := range runs {
		lr.draining.Store(true)
	}
}

// checkpointSession persists a live sandbox and records its state on the
// run, then drops the connection (the sandbox keeps running).
func (m *Manager) checkpointSession(ctx context.Context, tenant, runID string, sess *compute.Session) error {
	err := sess.Stop(ctx)
	st, serr := sess.State()
	err = errors.Join(err, serr, sess.Release())
	if st != nil {
		if data, e := st.Encode(); e == nil {
			if uerr := m.updateStored(ctx, tenant, runID, func(r *store.Run) { r.SessionState = data }); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("checkpoint sandbox of run %s: %w", runID, err)
	}
	return nil
}

// held is a live sandbox session the manager holds for a run.
type held struct {
	sess   *compute.Session
	tenant string
}

// updateStored applies fn to a stored run and saves it.
func (m *Manager) updateStored(ctx context.Context, tenant, runID string, fn func(r *store.Run)) error {
	m.mu.Lock()
	lr := m.runs[runID]
	m.mu.Unlock()
	if lr != nil {
		return lr.update(ctx, fn)
	}
	r, err := m.cfg.Store.GetRun(ctx, tenant, runID)
	if err != nil {
		return err
	}
	prev := r.Status
	fn(r)
	r.Updated = m.now()
	if err := m.cfg.Store.UpdateRun(ctx, r); err != nil {
		return err
	}
	m.moved(prev, r.Status)
	return nil
}

// group tracks goroutines and calls: enter/leave around each, close to
// refuse new ones and learn when the last one left. Unlike a WaitGroup it
// can be waited for with a deadline (select on close's channel) without a
// goroutine of its own, and entering after close is refused rather than a
// misuse.
type group struct {
	mu     sync.Mutex
	n      int
	closed bool
	done   chan struct{} // closed once closed and n is 0
}

// enter counts one more goroutine or call, unless the group is closed.
func (g *group) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

// leave counts one less.
func (g *group) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	g.doneLocked()
}

// goTracked runs f in a goroutine the group counts; false (and f not run)
// when the group is closed.
func (g *group) goTracked(f func()) bool {
	if !g.enter() {
		return false
	}
	go func() {
		defer g.leave()
		f()
	}()
	return true
}

// close refuses new entries and returns a channel closed once every entry
// left. It may be called more than once.
func (g *group) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.doneLocked()
	return g.done
}

// idle is close's channel (the group must be closed).
func (g *group) idle() <-chan struct{} { return g.close() }

func (g *group) doneLocked() {
	if g.done == nil {
		g.done = make(chan struct{})
	}
	if g.closed && g.n == 0 {
		select {
		case <-g.done:
		default:
			close(g.done)
		}
	}
}

// The classes of the manager's own errors (the others carry their cause's).
var (
	errNoTenant = &kindError{kind: errkind.ErrUnauthenticated, err: errors.New("no tenant bound to the call")}
)
