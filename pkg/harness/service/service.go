// Package service is `harness serve`: the harness as a network service for
// backends that do not embed it as a Go library (Python, TypeScript) and for
// operators who want to watch and steer runs.
//
// Transport. The API (proto/bulkhead/harness/v1) is served with Connect
// (connectrpc.com/connect): one handler speaks gRPC, gRPC-Web and Connect's
// own protocol, whose unary calls are plain JSON POSTs over HTTP/1.1. So gRPC
// clients, browsers and curl use the same port and the same contract with no
// gateway process and no google.api.http annotations to keep in step.
// ServeTLS serves HTTP/2 and HTTP/1.1 over TLS (ALPN h2 and http/1.1), the
// way to serve anything but a loopback address; Serve runs HTTP/2 without
// TLS (h2c) next to HTTP/1.1 on a plain listener, for loopback or behind a
// TLS-terminating proxy. Metrics are not served on the API's port (they
// show every tenant's activity): serve them on a listener of their own.
// Run events are also served as Server-Sent Events
// (GET /v1/runs/{id}/events), the form browsers and simple HTTP clients read
// natively; files download with a plain GET, and the terminal is offered as
// a WebSocket, because browsers cannot open bidirectional gRPC streams.
//
// Tenancy. Every request is authenticated (see package auth) and bound to a
// tenant, whose id is namespaced by its source (token:alice,
// jwt:<issuer>:<sub>); a tenant sees only its own runs and sandboxes, and
// another tenant's id answers NotFound exactly like an unknown one. Every
// field of a request is untrusted input, checked like an untrusted manifest
// (see validate.go: accounts, paths, sizes, patterns, models). Each tenant
// has quotas (Quotas): active runs, live sandboxes, git fetch bytes; every
// sandbox gets the operator's resource caps. Model endpoints and their API
// keys are the service's configuration: no request names or carries one
// and no response echoes one; a request may choose a model name among
// Config.Models only.
//
// Runs. A run is driven by the harness Runner in the service's process. The
// service owns each run's sandbox session (created before the first turn and
// injected into the runner), so files and terminals stay reachable while the
// run waits for approvals. Events are written to the store before they are
// published, numbered per run, in batches by one writer per run, so the run
// never waits for the disk and a client never holds a sequence a crash
// could lose (see events); a stream replays from the store and then
// follows live events through a bounded buffer: a client that falls behind is
// not allowed to block the run or grow memory, it is moved back to reading
// from the store from its last sequence.
//
// Persistence and restarts. The store (bbolt by default, PostgreSQL when
// configured) holds each run's record, RunState and event log. A restarted
// service resumes runs that were waiting for approval (their sandboxes are
// reattached, or rebuilt from their snapshots) and reports runs it lost in
// the middle of a turn as failed. Shutdown drains: every tool call the
// running runs make from then on is held as a service checkpoint, so the run
// stops at the end of its turn with a RunState; its sandbox is persisted to
// the snapshot store and released, and the next service approves the
// checkpointed calls and continues the run.
package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	"github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1/harnessv1connect"
)

// Config configures a Service.
type Config struct {
	// Store keeps runs and events (required).
	Store store.Store
	// Compute makes the runs' sandboxes (required). Give it a snapshot
	// store so checkpointed sandboxes survive their daemon.
	Compute *compute.Client
	// Model is the model every run calls (required); it holds the API key.
	Model model.Model
	// DefaultModel is the model name of runs that name none (required).
	DefaultModel string
	// Models are the other model names a request may choose (agent.model);
	// none: DefaultModel only. A tenant cannot pick an arbitrary model the
	// service's key pays for.
	Models []string
	// Auth binds requests to tenants (required).
	Auth auth.Authenticator
	// Log receives the service's logs (nil: none).
	Log *zap.Logger
	// DefaultInstructions are the instructions of agents that give none.
	DefaultInstructions string
	// MaxTurns bounds runs that ask for no limit, and caps those that do
	// (0: 30).
	MaxTurns int
	// SandboxRetention keeps a finished run's sandbox this long so its files
	// can be looked at (0: deleted when the run ends).
	SandboxRetention time.Duration
	// EventBuffer is how many live events a stream may fall behind before it
	// is moved back to reading the store (0: 256).
	EventBuffer int
	// DrainTimeout bounds how long Shutdown waits for running runs to reach
	// the end of their turn (0: 30s); runs still in a turn then are lost and
	// reported failed after the restart.
	DrainTimeout time.Duration
	// Quotas bound what each tenant may hold (zero fields: the defaults
	// of Quotas).
	Quotas Quotas
	// CheckManifest, when set, is asked about every request's manifest
	// after the untrusted-manifest rules, before anything is created: the
	// operator's policy for what a tenant's manifest may name (serve sets
	// it to the git policy's CheckManifest, so a git host that is not
	// allowed is refused at StartRun instead of when the sandbox is
	// made). The materializer enforces the same policy at fetch time.
	CheckManifest func(*manifest.Manifest) error
	// ProviderOptions, when set, makes the provider options
	// (compute.CreateOptions.ProviderOptions, e.g. *docker.CreateOptions)
	// that carry Quotas.Sandbox to the provider; New calls it once and
	// every sandbox the service makes or replaces gets its result. It is
	// required when Quotas.Sandbox caps CPU or memory, so a cap is never
	// silently dropped.
	ProviderOptions func(SandboxResources) (any, error)
	// MaxRequestBytes bounds one request message, after decompression
	// (0: 16 MiB).
	MaxRequestBytes int
	// Observer, when set, is told how every run goes (RunConfig.Observer;
	// pkg/harness/metrics implements it).
	Observer harness.RunObserver
	// Runs, when set, is kept told how many stored runs are in each state
	// but running (see RunGauge); pkg/harness/metrics implements it.
	Runs RunGauge
	// Console, when set, is served at / for paths the API does not take.
	Console http.Handler
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// RunGauge is told the number of runs in a state whenever it changes.
// States are the lower-case RunStatus names without their prefix
// (pending, waiting_approval, succeeded, failed, canceled) and
// "checkpointed". The service never reports "running": the runner's
// observer counts the runs actually in a turn (metrics.StateRunning).
//
// The counts are the store's at New plus the transitions this service
// makes, kept in memory (an O(1) update per transition, nothing at scrape
// time). Several replicas sharing one PostgreSQL store each report the
// store's counts at their start plus their own transitions, so their
// gauges drift apart; aggregate the running state only, or restart a
// replica to recount.
type RunGauge interface {
	SetRuns(state string, n int) error
}

// Service runs agents for tenants. Create it with New, serve Handler, and
// call Shutdown before dropping it.
type Service struct {
	cfg    Config
	log    *zap.Logger
	runner *harness.Runner
	// base is the context of the runs; stop cancels it (hard stop).
	base context.Context
	stop context.CancelFunc

	mu       sync.Mutex
	runs     map[string]*liveRun // active runs by id
	sessions map[string]*held    // live sandbox sessions by run id
	closing  bool
	// stopped is closed when the drain is over: streams end then.
	stopped  chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup // run goroutines
	timers   map[string]*time.Timer

	// counts are the runs by stored status (see RunGauge).
	countMu sync.Mutex
	counts  map[string]int

	// usage is every tenant's quota use.
	usage *usage
	// providerOpts and limits go with every sandbox the service makes.
	providerOpts any
	limits       compute.Limits
}

// New makes a service and recovers the runs the store holds from an earlier
// service: runs waiting for approval wait again (their sandboxes
// reattached), checkpointed runs continue, runs lost mid-turn are failed.
func New(ctx context.Context, cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("service: no store")
	case cfg.Compute == nil:
		return nil, errors.New("service: no compute client")
	case cfg.Model == nil:
		return nil, errors.New("service: no model")
	case cfg.DefaultModel == "":
		return nil, errors.New("service: no default model name")
	case cfg.Auth == nil:
		return nil, errors.New("service: no authenticator")
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
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	for _, m := range cfg.Models {
		if m == "" {
			return nil, errors.New("service: an empty model name in Models")
		}
	}
	q, err := cfg.Quotas.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	cfg.Quotas = q
	var popts any
	if cfg.ProviderOptions != nil {
		if popts, err = cfg.ProviderOptions(q.Sandbox); err != nil {
			return nil, fmt.Errorf("service: sandbox resources: %w", err)
		}
	} else if q.Sandbox.MilliCPU > 0 || q.Sandbox.MemoryBytes > 0 {
		return nil, errors.New("service: Quotas.Sandbox caps CPU or memory but no ProviderOptions carries them to the provider")
	}
	base, stop := context.WithCancel(context.WithoutCancel(ctx))
	s := &Service{cfg: cfg, log: cfg.Log, base: base, stop: stop,
		runner:       &harness.Runner{Model: cfg.Model, ModelName: cfg.DefaultModel, Log: cfg.Log.Named("runner")},
		runs:         map[string]*liveRun{},
		sessions:     map[string]*held{},
		timers:       map[string]*time.Timer{},
		stopped:      make(chan struct{}),
		counts:       map[string]int{},
		usage:        newUsage(q, cfg.Now),
		providerOpts: popts,
		limits:       compute.Limits{Archive: compute.ArchiveLimits{MaxExtractedBytes: q.Sandbox.DiskBytes}},
	}
	if err := s.countRuns(ctx); err != nil {
		stop()
		return nil, err
	}
	if err := s.recover(ctx); err != nil {
		stop()
		return nil, err
	}
	return s, nil
}

// now is the service clock, truncated to microseconds (what every store
// keeps).
func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// DefaultMaxRequestBytes is Config.MaxRequestBytes' default.
const DefaultMaxRequestBytes = 16 << 20

// Handler returns the HTTP handler of the whole API: Connect services, SSE
// events, file downloads, the terminal WebSocket, /healthz, and the console
// when configured. No metrics: they are every tenant's, served apart. Serve
// it with ServeTLS, or Serve on loopback (both speak HTTP/2 for gRPC
// clients).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithInterceptors(&authInterceptor{auth: s.cfg.Auth}),
		connect.WithReadMaxBytes(s.cfg.MaxRequestBytes)}
	mux.Handle(harnessv1connect.NewRunServiceHandler(&runAPI{s: s}, opts...))
	mux.Handle(harnessv1connect.NewSandboxServiceHandler(&sandboxAPI{s: s}, opts...))
	mux.Handle("GET /v1/runs/{run_id}/events", s.httpAuth(http.HandlerFunc(s.serveSSE)))
	mux.Handle("GET /v1/sandboxes/{sandbox_id}/files/{path...}", s.httpAuth(http.HandlerFunc(s.serveFile)))
	mux.Handle("GET /v1/sandboxes/{sandbox_id}/terminal", s.wsAuth(http.HandlerFunc(s.serveTerminalWS)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if s.cfg.Console != nil {
		mux.Handle("/", s.cfg.Console)
	}
	return mux
}

// Serve serves h on ln with HTTP/1.1 and unencrypted HTTP/2 until ctx is
// done, then shuts the HTTP server down (streams are cut after grace).
// Bearer credentials cross the listener in the clear: use it on loopback,
// behind a TLS-terminating proxy, or for the metrics listener; ServeTLS
// otherwise.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration) error {
	return serve(ctx, ln, h, nil, grace)
}

// ServeTLS serves h on ln over TLS with cfg (its certificates) until ctx
// is done, like Serve: HTTP/2 for clients that negotiate "h2" with ALPN
// (gRPC clients) and HTTP/1.1 for the others. A client speaking plain
// HTTP to it gets nothing but a 400 (no request reaches h). TLS 1.2 is the
// least version accepted.
func ServeTLS(ctx context.Context, ln net.Listener, h http.Handler, cfg *tls.Config, grace time.Duration) error {
	if cfg == nil || (len(cfg.Certificates) == 0 && cfg.GetCertificate == nil && cfg.GetConfigForClient == nil) {
		return errors.New("serve TLS: no certificate")
	}
	return serve(ctx, ln, h, cfg, grace)
}

func serve(ctx context.Context, ln net.Listener, h http.Handler, tlsCfg *tls.Config, grace time.Duration) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	if tlsCfg != nil {
		cfg := tlsCfg.Clone()
		cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
		cfg.NextProtos = []string{"h2", "http/1.1"}
		hs.TLSConfig = cfg
		hs.Protocols.SetHTTP2(true)
	} else {
		hs.Protocols.SetUnencryptedHTTP2(true) // gRPC clients without TLS (prior knowledge)
	}
	errc := make(chan error, 1)
	go func() {
		if tlsCfg != nil {
			errc <- hs.ServeTLS(ln, "", "")
			return
		}
		errc <- hs.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown drains the service: running runs stop at the end of their turn
// (bounded by DrainTimeout, then they are cut and reported lost after the
// restart), every live sandbox is persisted to its snapshot and released
// (not deleted), and the stored records say how to continue. The store is
// not closed.
func (s *Service) Shutdown(ctx context.Context) error {
	s.Drain()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("runs still in a turn after the drain timeout; cutting them")
		s.stop()
		<-done
	case <-ctx.Done():
		s.stop()
		<-done
	}
	s.stop()
	// Streams end: their clients reconnect to the next service from the
	// last sequence they saw.
	s.stopOnce.Do(func() { close(s.stopped) })
	// Every event published so far reaches the store before the caller
	// may close it (ended runs flushed theirs in endRun).
	defer func() {
		s.mu.Lock()
		runs := make([]*liveRun, 0, len(s.runs))
		for _, lr := range s.runs {
			runs = append(runs, lr)
		}
		s.mu.Unlock()
		for _, lr := range runs {
			lr.flush()
		}
	}()
	// Persist and release every sandbox still held.
	s.mu.Lock()
	sessions := s.sessions
	s.sessions = map[string]*held{}
	s.mu.Unlock()
	var errs []error
	for runID, h := range sessions {
		s.mu.Lock()
		_, active := s.runs[runID]
		s.mu.Unlock()
		if !active {
			// A finished run's retained sandbox: nothing to resume.
			err := s.cfg.Compute.Delete(ctx, h.sess)
			s.usage.releaseSandbox(h.tenant, runID)
			if err == nil {
				err = s.updateStored(ctx, h.tenant, runID, func(r *store.Run) { r.SandboxGone = true })
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("delete sandbox of finished run %s: %w", runID, err))
			}
			continue
		}
		if err := s.checkpointSession(ctx, h.tenant, runID, h.sess); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Drain starts a shutdown without waiting: no run starts or continues any
// more, and every tool call running runs make from now on is held as a
// checkpoint, so they stop at the end of their turn. Shutdown drains and
// waits.
func (s *Service) Drain() {
	s.mu.Lock()
	s.closing = true
	runs := make([]*liveRun, 0, len(s.runs))
	for _, lr := range s.runs {
		runs = append(runs, lr)
	}
	for _, t := range s.timers {
		t.Stop()
	}
	s.mu.Unlock()
	for _, lr := range runs {
		lr.draining.Store(true)
	}
}

// checkpointSession persists a live sandbox and records its state on the
// run, then drops the connection (the sandbox keeps running).
func (s *Service) checkpointSession(ctx context.Context, tenant, runID string, sess *compute.Session) error {
	err := sess.Stop(ctx)
	st, serr := sess.State()
	err = errors.Join(err, serr, sess.Release())
	if st != nil {
		if data, e := st.Encode(); e == nil {
			if uerr := s.updateStored(ctx, tenant, runID, func(r *store.Run) { r.SessionState = data }); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("checkpoint sandbox of run %s: %w", runID, err)
	}
	return nil
}

// held is a live sandbox session the service holds for a run.
type held struct {
	sess   *compute.Session
	tenant string
}

// updateStored applies fn to a stored run and saves it.
func (s *Service) updateStored(ctx context.Context, tenant, runID string, fn func(r *store.Run)) error {
	s.mu.Lock()
	lr := s.runs[runID]
	s.mu.Unlock()
	if lr != nil {
		return lr.update(ctx, fn)
	}
	r, err := s.cfg.Store.GetRun(ctx, tenant, runID)
	if err != nil {
		return err
	}
	prev := r.Status
	fn(r)
	r.Updated = s.now()
	if err := s.cfg.Store.UpdateRun(ctx, r); err != nil {
		return err
	}
	s.moved(prev, r.Status)
	return nil
}
