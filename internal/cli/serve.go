package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/console"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/postgres"
)

// serveFlags are the flags of `harness serve`.
type serveFlags struct {
	listen       string
	tokensFile   string
	jwksFile     string
	jwtIssuer    string
	jwtAudience  string
	tenantClaim  string
	store        string
	model        string
	instructions string
	maxTurns     int
	retention    time.Duration
	drain        time.Duration
}

func newServeCmd(g *globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve runs over gRPC, Connect/JSON and SSE, for other backends and the web console",
		Long: `Serve the harness as a service (proto/bulkhead/harness/v1): start runs, stream their events
(also as Server-Sent Events at /v1/runs/{id}/events), answer approvals, cancel and resume runs,
browse sandboxes and open terminals. One port speaks gRPC, gRPC-Web and JSON over HTTP/1.1.

Every request needs "Authorization: Bearer ..." with a token from --tokens-file (lines "TOKEN TENANT")
or a JWT verified against --jwks-file (with --jwt-issuer and --jwt-audience; the tenant comes from
--tenant-claim). The model is called with $OPENAI_API_KEY and $OPENAI_BASE_URL, which stay in this
process: no request carries or receives a key.

Runs are kept in --store (bolt:PATH, the default under the state directory, or postgres://...). A
restarted service resumes runs that wait for approval; on SIGTERM running runs stop at the end of
their turn, their sandboxes are persisted, and the next start continues them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd, g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to listen on (HTTP/1.1 and h2c; put TLS in front outside a trusted network)")
	fl.StringVar(&f.tokensFile, "tokens-file", "", `bearer tokens: one "TOKEN TENANT" per line`)
	fl.StringVar(&f.jwksFile, "jwks-file", "", "JSON Web Key Set verifying JWT bearer credentials")
	fl.StringVar(&f.jwtIssuer, "jwt-issuer", "", "with --jwks-file: the required iss")
	fl.StringVar(&f.jwtAudience, "jwt-audience", "", "with --jwks-file: the required aud")
	fl.StringVar(&f.tenantClaim, "tenant-claim", "sub", "with --jwks-file: the claim naming the tenant")
	fl.StringVar(&f.store, "store", "", "where runs are kept: bolt:PATH or postgres://... (default bolt: under the state directory)")
	fl.StringVar(&f.model, "model", "", "default model name (default $BULKHEAD_MODEL, then "+DefaultModel+")")
	fl.StringVar(&f.instructions, "instructions", "", "instructions of agents that give none (default: a coding-task prompt)")
	fl.IntVar(&f.maxTurns, "max-turns", 30, "most model calls of a run (a request may ask for fewer)")
	fl.DurationVar(&f.retention, "sandbox-retention", 15*time.Minute, "keep a finished run's sandbox this long for its files (0: delete at once)")
	fl.DurationVar(&f.drain, "drain-timeout", 30*time.Second, "on SIGTERM, how long running runs get to finish their turn")
	g.addAllowDomainFlag(cmd)
	return cmd
}

// authenticator builds the request authentication the flags ask for.
func (f *serveFlags) authenticator() (auth.Authenticator, error) {
	var chain auth.Chain
	if f.tokensFile != "" {
		t, err := auth.LoadTokens(f.tokensFile)
		if err != nil {
			return nil, usageErr(compute.ErrInvalidArgument, "--tokens-file: %v", err)
		}
		chain.Tokens = t
	}
	jwtSet := f.jwtIssuer != "" || f.jwtAudience != ""
	switch {
	case f.jwksFile != "":
		if f.jwtIssuer == "" || f.jwtAudience == "" {
			return nil, usageErr(compute.ErrInvalidArgument, "--jwks-file needs --jwt-issuer and --jwt-audience")
		}
		j, err := auth.NewJWT(auth.JWTConfig{JWKSFile: f.jwksFile, Issuer: f.jwtIssuer, Audience: f.jwtAudience, TenantClaim: f.tenantClaim})
		if err != nil {
			return nil, usageErr(compute.ErrInvalidArgument, "--jwks-file: %v", err)
		}
		chain.JWT = j
	case jwtSet:
		return nil, usageErr(compute.ErrInvalidArgument, "--jwt-issuer and --jwt-audience need --jwks-file")
	}
	if chain.Tokens == nil && chain.JWT == nil {
		return nil, usageErr(compute.ErrInvalidArgument, "give --tokens-file or --jwks-file: the service never answers unauthenticated requests")
	}
	return chain, nil
}

// openStore opens the run store --store names.
func (f *serveFlags) openStore(ctx context.Context, g *globals) (store.Store, error) {
	spec := f.store
	if spec == "" {
		dir, err := g.dir("serve")
		if err != nil {
			return nil, err
		}
		spec = "bolt:" + filepath.Join(dir, "runs.db")
	}
	switch {
	case strings.HasPrefix(spec, "bolt:"):
		p := strings.TrimPrefix(spec, "bolt:")
		if p == "" {
			return nil, usageErr(compute.ErrInvalidArgument, "--store bolt: needs a path (bolt:/var/lib/bulkhead/runs.db)")
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		return bolt.Open(p)
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return postgres.Open(ctx, spec)
	}
	return nil, usageErr(compute.ErrInvalidArgument, "--store %q: want bolt:PATH or postgres://...", spec)
}

func serve(cmd *cobra.Command, g *globals, f *serveFlags) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.maxTurns <= 0 {
		return usageErr(compute.ErrInvalidArgument, "--max-turns must be positive")
	}
	if f.retention < 0 || f.drain <= 0 {
		return usageErr(compute.ErrInvalidArgument, "--sandbox-retention must not be negative and --drain-timeout must be positive")
	}
	authn, err := f.authenticator()
	if err != nil {
		return err
	}
	// Listen before anything slow, so a taken port fails at once.
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return usageErr(compute.ErrInvalidArgument, "--listen %s: %v", f.listen, err)
	}
	defer ln.Close()
	flush, err := g.setupTracing(ctx)
	if err != nil {
		return err
	}
	defer flush()
	log := g.logger()
	mdl, err := model.NewOpenAI(model.Config{Logger: log})
	if err != nil {
		return fmt.Errorf("%w (set OPENAI_API_KEY; OPENAI_BASE_URL for another endpoint)", err)
	}
	st, err := f.openStore(ctx, g)
	if err != nil {
		return err
	}
	defer st.Close()
	// Metrics first: the compute client reports its sandbox operations
	// (create latency by provider) to them.
	reg, m, err := serveMetrics()
	if err != nil {
		return err
	}
	g.observer = m
	client, release, err := g.client(materializer.Options{})
	if err != nil {
		return err
	}
	defer release()
	m.WatchSandboxes(client)
	modelName := f.model
	if modelName == "" {
		modelName = os.Getenv("BULKHEAD_MODEL")
	}
	if modelName == "" {
		modelName = DefaultModel
	}
	instructions := f.instructions
	if instructions == "" {
		instructions = defaultInstructions
	}
	svc, err := service.New(ctx, service.Config{Store: st, Compute: client, Model: mdl, DefaultModel: modelName, Auth: authn, Log: log,
		DefaultInstructions: instructions, MaxTurns: f.maxTurns, SandboxRetention: f.retention, DrainTimeout: f.drain,
		Console: console.Handler(), Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), Observer: m, Runs: m})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.streams.Err, "harness: serving on http://%s (gRPC, Connect/JSON, SSE; console at %s)\n", ln.Addr(), console.MountPath)
	serveErr := service.Serve(ctx, ln, svc.Handler(), 5*time.Second)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.drain+2*time.Minute)
	defer cancel()
	fmt.Fprintln(g.streams.Err, "harness: shutting down: checkpointing running runs")
	if err := svc.Shutdown(sctx); err != nil {
		serveErr = errors.Join(serveErr, err)
	}
	return serveErr
}

// serveMetrics makes the service's Prometheus metrics (pkg/harness/metrics)
// in their own registry, served at /metrics. The metrics are the observer
// of every run (RunConfig.Observer), of the compute client's sandbox
// operations (ClientOptions.Observer) and the service's runs gauge
// (service.Config.Runs); the compute client's sandboxes are counted by
// provider and state (WatchSandboxes).
func serveMetrics() (*prometheus.Registry, *metrics.Harness, error) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	return reg, m, nil
}
