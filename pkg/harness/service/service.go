// Package service is `harness serve`: the harness as a network service for
// backends that do not embed it as a Go library (Python, TypeScript) and for
// operators who want to watch and steer runs.
//
// Layout. The service is a run manager with thin transports, the way
// containerd splits each service into its local implementation and a gRPC
// shim. Package manager (pkg/harness/service/manager) is the logic, with a
// Go API a Go program can embed without HTTP: runs, their event logs,
// approvals, the sandboxes, quotas, the store, recovery after a restart,
// the drain, and the request policy (every field untrusted). This package
// is its transports: each handler authenticates the request, converts the
// wire's message to the manager's Go types (convert.go, the one place that
// knows both), calls the manager and converts back; errors go through one
// table from pkg/errkind's classes to Connect codes and HTTP statuses
// (errors.go).
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
// natively; files download with a plain GET and upload with a plain PUT
// (curl), and the terminal is offered as a WebSocket, because browsers
// cannot open bidirectional gRPC streams. Tenants make sandboxes of their
// own too (SandboxService.CreateSandbox: sandboxes as a service, with
// commands and files; see manager/apisandbox.go).
//
// Tenancy. Every request is authenticated (see package auth) and bound to a
// tenant, whose id is namespaced by its source (token:alice,
// jwt:<issuer>:<sub>), which the handler passes to the manager; a tenant
// sees only its own runs and sandboxes, and another tenant's id answers
// NotFound exactly like an unknown one. Every field of a request is
// untrusted input, checked like an untrusted manifest by the manager (see
// manager/validate.go: accounts, paths, sizes, patterns, models), so a Go
// embedder's callers are held to the same policy. Each tenant has quotas
// (Quotas): active runs, live sandboxes, git fetch bytes; every sandbox
// gets the operator's resource caps. Model endpoints and their API keys
// are the service's configuration: no request names or carries one and no
// response echoes one; a request may choose a model name among
// Config.Models only.
//
// Runs, persistence and restarts: see package manager. In short, runs are
// driven in this process, their events stored before they are published;
// a restarted service resumes the runs waiting for approval, continues the
// checkpointed ones, reports those lost mid-turn as failed, and deletes
// the sandboxes kept for finished runs at the deadline stored with them
// (at once when it passed during the outage). Shutdown drains: running
// runs stop at the end of their turn with a checkpoint, streams end with
// Unavailable (clients reconnect from their last sequence), and it returns
// once every goroutine of the service has.
package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	"github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1/harnessv1connect"
)

// Config configures a Service: the manager's configuration
// (manager.Config) and the transports' (Auth, MaxRequestBytes, Console).
type Config struct {
	// Store keeps runs and events (required).
	Store store.Store
	// Compute makes the runs' sandboxes (required). Give it a snapshot
	// store so checkpointed sandboxes survive their daemon.
	Compute *compute.Client
	// Model is the model every run calls; it holds the API key. Nil turns
	// runs off (manager.Config.Model): StartRun, ResumeRun and
	// ApproveToolCall answer FailedPrecondition (manager.ErrNoModel);
	// sandboxes and the rest work.
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
	// can be looked at (0: deleted when the run ends). The deadline is
	// stored with the run: a service started after a crash or a shutdown
	// deletes the sandbox then.
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
	// Sandboxes bounds the sandboxes tenants make through the API (ttl,
	// idle timeout) and what the sandbox calls do (command timeouts,
	// output and file sizes); zero fields take manager.SandboxPolicy's
	// defaults.
	Sandboxes manager.SandboxPolicy
	// MaxRequestBytes bounds one request message, after decompression
	// (0: 16 MiB).
	MaxRequestBytes int
	// Observer, when set, is told how every run goes (RunConfig.Observer;
	// pkg/harness/metrics implements it).
	Observer harness.RunObserver
	// Runs, when set, is kept told how many stored runs are in each state
	// but running (see RunGauge); pkg/harness/metrics implements it.
	Runs RunGauge
	// PreviewKey signs the preview URLs of exposed ports
	// (SandboxService.ExposePort; at least manager.MinPreviewKeyBytes, see
	// ReadPreviewKey). A restarted service with the same key keeps the
	// URLs it gave working until they expire; nil makes a key at random,
	// and the URLs end with the process (logged at start).
	PreviewKey []byte
	// PreviewHost, when set, serves previews on hosts of their own too: a
	// pattern like "{token}.preview.example.com" (optionally with
	// "http://" or "https://", the default, and a port), which ExposePort's
	// URLs then use. Each preview is then its own origin. Without it
	// previews are served at /v1/preview/{token}/ on the service's
	// address, sandboxed by a Content-Security-Policy (see ports.go).
	PreviewHost string
	// Previews bounds exposed ports and the connections proxied to them
	// (zero fields: manager.PreviewPolicy's defaults).
	Previews manager.PreviewPolicy
	// Console, when set, is served at / for paths the API does not take.
	Console http.Handler
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// RunGauge is told the number of runs in a state whenever it changes (see
// manager.RunGauge).
type RunGauge = manager.RunGauge

// Service serves a run manager to tenants. Create it with New, serve
// Handler, and call Shutdown before dropping it.
type Service struct {
	cfg     Config
	log     *zap.Logger
	m       *manager.Manager
	preview *previewProxy
}

// New makes a service and its manager, which recovers the runs the store
// holds from an earlier service: runs waiting for approval wait again
// (their sandboxes reattached), checkpointed runs continue, runs lost
// mid-turn are failed, sandboxes kept for finished runs are deleted at
// their deadline.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Auth == nil {
		return nil, errors.New("service: no authenticator")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	host, err := parsePreviewHost(cfg.PreviewHost)
	if err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	m, err := manager.New(ctx, manager.Config{Store: cfg.Store, Compute: cfg.Compute, Model: cfg.Model,
		DefaultModel: cfg.DefaultModel, Models: cfg.Models, Log: cfg.Log, DefaultInstructions: cfg.DefaultInstructions,
		MaxTurns: cfg.MaxTurns, SandboxRetention: cfg.SandboxRetention, EventBuffer: cfg.EventBuffer,
		DrainTimeout: cfg.DrainTimeout, Quotas: cfg.Quotas, CheckManifest: cfg.CheckManifest,
		ProviderOptions: cfg.ProviderOptions, Observer: cfg.Observer, Runs: cfg.Runs, Now: cfg.Now,
		Sandboxes: cfg.Sandboxes, PreviewKey: cfg.PreviewKey, Previews: cfg.Previews})
	if err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	return &Service{cfg: cfg, log: cfg.Log, m: m, preview: newPreviewProxy(m, host, cfg.Log)}, nil
}

// Manager is the service's run manager, for a program that also calls it
// in Go (the transports and it share every run).
func (s *Service) Manager() *manager.Manager { return s.m }

// DefaultMaxRequestBytes is Config.MaxRequestBytes' default.
const DefaultMaxRequestBytes = 16 << 20

// Handler returns the HTTP handler of the whole API: Connect services, SSE
// events, file downloads, the terminal WebSocket, preview URLs of exposed
// ports (ports.go), /healthz, and the console when configured. No metrics: they are every tenant's, served apart. Serve
// it with ServeTLS, or Serve on loopback (both speak HTTP/2 for gRPC
// clients).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithInterceptors(&authInterceptor{auth: s.cfg.Auth}),
		connect.WithReadMaxBytes(s.cfg.MaxRequestBytes)}
	opts = append(opts, strictJSONCodecs()...)
	mux.Handle(harnessv1connect.NewRunServiceHandler(&runAPI{m: s.m}, opts...))
	mux.Handle(harnessv1connect.NewSandboxServiceHandler(&sandboxAPI{m: s.m, previewURL: s.preview.url}, opts...))
	mux.Handle("GET /v1/runs/{run_id}/events", s.httpAuth(http.HandlerFunc(s.serveSSE)))
	mux.Handle("GET /v1/sandboxes/{sandbox_id}/files/{path...}", s.httpAuth(http.HandlerFunc(s.serveFile)))
	mux.Handle("PUT /v1/sandboxes/{sandbox_id}/files/{path...}", s.httpAuth(http.HandlerFunc(s.serveUpload)))
	mux.Handle("GET /v1/sandboxes/{sandbox_id}/tar/{path...}", s.httpAuth(http.HandlerFunc(s.serveTarDownload)))
	mux.Handle("POST /v1/sandboxes/{sandbox_id}/tar/{path...}", s.httpAuth(http.HandlerFunc(s.serveTarUpload)))
	mux.Handle("GET /v1/sandboxes/{sandbox_id}/terminal", s.wsAuth(http.HandlerFunc(s.serveTerminalWS)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.preview.register(mux) // /v1/preview/{token}/..., no credential: the token is
	if s.cfg.Console != nil {
		mux.Handle("/", s.cfg.Console)
	}
	return s.preview.byHost(mux)
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

// Shutdown drains the service (manager.Shutdown): running runs stop at the
// end of their turn (bounded by DrainTimeout, then they are cut and
// reported lost after the restart), every live sandbox is persisted to its
// snapshot and released (not deleted), those kept for finished runs wait
// for the next service's deadline, streams and terminals end, and it
// returns once no goroutine of the service is left (or ctx is done). The
// store is not closed.
func (s *Service) Shutdown(ctx context.Context) error { return s.m.Shutdown(ctx) }

// Drain starts a shutdown without waiting: no run starts or continues any
// more, and every tool call running runs make from now on is held as a
// checkpoint, so they stop at the end of their turn. Shutdown drains and
// waits.
func (s *Service) Drain() { s.m.Drain() }
