package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/kubernetes"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/console"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/postgres"
)

// serveFlags are the flags of `harness serve`.
type serveFlags struct {
	listen         string
	tlsCert        string
	tlsKey         string
	insecureListen bool
	metricsListen  string
	models         []string
	gitHosts       []string
	gitCredentials []string
	quotas         quotaFlags
	tokensFile     string
	jwksFile       string
	jwtIssuer      string
	jwtAudience    string
	tenantClaim    string
	store          string
	model          string
	replay         string
	previewKey     string // --preview-key-file
	previewHost    string // --preview-host
	instructions   string
	maxTurns       int
	retention      time.Duration
	drain          time.Duration
	policy         policyFlags
}

// policyFlags are the sandbox API's bounds (manager.SandboxPolicy).
type policyFlags struct {
	ttl, maxTTL, idle   time.Duration
	command, maxCommand time.Duration
	maxOutput, maxFile  string
}

// quotaFlags are serve's per-tenant quotas and per-sandbox caps (see
// service.Quotas); sizes are text ("512MiB", "2G", bytes).
type quotaFlags struct {
	runs, sandboxes int
	cpus            float64
	memory, disk    string
	fetchPerSandbox string
	fetchPerTenant  string
	fetchWindow     time.Duration
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
--tenant-claim). Tenants are namespaced by source: the token tenant alice is token:alice, a JWT's
is jwt:ISSUER:CLAIM, so a JWT with sub "alice" is another tenant. The model is called with
$OPENAI_API_KEY and $OPENAI_BASE_URL, which stay in this process: no request carries or receives a key,
and a request may name only the default model or one --allow-model lists. Without a key the service
starts with runs off (StartRun and ResumeRun answer FailedPrecondition; sandboxes and the console
work). --replay FILE serves runs from a recorded model session instead, with no key: every run
replays it from its first turn (a resumed run from where it stopped), and the sandboxes, tools and
commands are real.

A non-loopback --listen needs --tls-cert and --tls-key (HTTP/2 and HTTP/1.1 over TLS, so gRPC clients
work), or --insecure-listen to serve plain HTTP anyway (behind a TLS-terminating proxy). Prometheus
metrics show every tenant's activity: they are served only on --metrics-listen (off by default; keep
it on loopback or a private network), never on the API's port.

Each tenant has quotas: active runs (--max-runs-per-tenant), live sandboxes, its runs' and those kept
for finished runs (--max-sandboxes-per-tenant), bytes its git checkouts bring in (per sandbox, and per
tenant over --fetch-window); over a quota a request fails with ResourceExhausted naming it. Every
sandbox gets --sandbox-cpus and --sandbox-memory (docker, kubernetes and local providers; local sandboxes
also a cap of 512 processes, and need a root harness with the cgroup controllers) and --sandbox-disk, which
bounds what a snapshot restore writes into any sandbox and is a disk cap. Local sandboxes: their
workspace, homes and other writable directories live on an ext4 file system of that size of their own (a
loop-mounted image; needs a root harness, mkfs.ext4 and loop devices), where a write past it fails with
"No space left on device". Docker: the workspace volume is such a file system (the same needs, on the
engine's host), and the container's writable layer is capped too where the storage driver has quotas
(overlay2 over xfs with pquota, btrfs, zfs). Kubernetes: an ephemeral-storage limit on the sandbox
container and a sizeLimit on its workspace emptyDir (or the size of its workspace claim); the kubelet
evicts a Pod past them, and the command running then fails saying so.

Runs are kept in --store (bolt:PATH, the default under the state directory, or postgres://...). A
restarted service resumes runs that wait for approval; on SIGTERM running runs stop at the end of
their turn, their sandboxes are persisted, and the next start continues them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd, g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to listen on; a non-loopback address needs --tls-cert and --tls-key, or --insecure-listen")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate chain (PEM): serve HTTP/2 and HTTP/1.1 over TLS (with --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "TLS private key (PEM) of --tls-cert")
	fl.BoolVar(&f.insecureListen, "insecure-listen", false, "serve plain HTTP (and h2c) on a non-loopback --listen: bearer tokens cross the network unencrypted (for a TLS-terminating proxy in front)")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "serve Prometheus metrics at /metrics on this address, e.g. 127.0.0.1:9464; unauthenticated and every tenant's: bind it to loopback or a private network (default: off)")
	fl.StringArrayVar(&f.gitHosts, "git-host", nil, "a git host (a DNS name, e.g. github.com) tenants' git_repo entries may fetch from over https (repeatable; default: none, every git_repo entry is refused)")
	fl.StringArrayVar(&f.gitCredentials, "git-credential", nil, "HOST=FILE: fetch from --git-host HOST with the token in FILE (its first line, read at each fetch), sent to that host only (repeatable)")
	fl.StringArrayVar(&f.models, "allow-model", nil, "a model name requests may choose besides the default (repeatable; default: the default model only)")
	fl.IntVar(&f.quotas.runs, "max-runs-per-tenant", service.DefaultRuns, "most active runs (pending, running, waiting for approval) of one tenant (-1: no limit)")
	fl.IntVar(&f.quotas.sandboxes, "max-sandboxes-per-tenant", service.DefaultSandboxes, "most live sandboxes of one tenant, those kept for finished runs included (-1: no limit)")
	fl.Float64Var(&f.quotas.cpus, "sandbox-cpus", 0, "CPU limit of every sandbox, e.g. 0.5 (docker, kubernetes, local; default: one CPU)")
	fl.StringVar(&f.quotas.memory, "sandbox-memory", "", "memory limit of every sandbox, e.g. 2GiB (docker, kubernetes, local; default: 1 GiB)")
	fl.StringVar(&f.quotas.disk, "sandbox-disk", "", "disk cap of every sandbox, e.g. 10GiB, and the most bytes a snapshot restore may write into it: local, a file system of that size of its own; docker, the workspace volume on an ext4 file system of that size (and the container's layer where the storage driver has quotas); kubernetes, an ephemeral-storage limit and the workspace emptyDir's sizeLimit (the kubelet evicts the Pod past it); writes past it fail with ENOSPC on local and docker (default: no cap, restores bounded by the daemon's limit)")
	fl.StringVar(&f.quotas.fetchPerSandbox, "max-fetch-bytes-per-sandbox", "1GiB", "most bytes the git checkouts of one sandbox bring in (none: no limit)")
	fl.StringVar(&f.quotas.fetchPerTenant, "max-fetch-bytes-per-tenant", "10GiB", "most bytes one tenant's git checkouts bring in per --fetch-window (none: no limit)")
	fl.DurationVar(&f.quotas.fetchWindow, "fetch-window", service.DefaultFetchWindow, "the window of --max-fetch-bytes-per-tenant (its budget refills evenly over it)")
	fl.StringVar(&f.tokensFile, "tokens-file", "", `bearer tokens: one "TOKEN TENANT" per line`)
	fl.StringVar(&f.jwksFile, "jwks-file", "", "JSON Web Key Set verifying JWT bearer credentials")
	fl.StringVar(&f.jwtIssuer, "jwt-issuer", "", "with --jwks-file: the required iss")
	fl.StringVar(&f.jwtAudience, "jwt-audience", "", "with --jwks-file: the required aud")
	fl.StringVar(&f.tenantClaim, "tenant-claim", "sub", "with --jwks-file: the claim naming the tenant")
	fl.StringVar(&f.store, "store", "", "where runs are kept: bolt:PATH or postgres://... (default bolt: under the state directory)")
	fl.StringVar(&f.model, "model", "", "default model name (default $BULKHEAD_MODEL, then "+DefaultModel+")")
	fl.StringVar(&f.previewKey, "preview-key-file", "", "file holding the key (at least 32 bytes) that signs exposed ports' preview URLs; the same key keeps them valid across restarts (default: a random key, previews end with the process)")
	fl.StringVar(&f.previewHost, "preview-host", "", "also serve previews on hosts of their own, e.g. '{token}.preview.example.com' (default: under /v1/preview/ on the API's address only)")
	fl.StringVar(&f.replay, "replay", "", "run every run on this recorded model session (from its first turn) instead of calling a model; no key needed")
	fl.StringVar(&f.instructions, "instructions", "", "instructions of agents that give none (default: a coding-task prompt)")
	fl.IntVar(&f.maxTurns, "max-turns", 30, "most model calls of a run (a request may ask for fewer)")
	fl.DurationVar(&f.retention, "sandbox-retention", 15*time.Minute, "keep a finished run's sandbox this long for its files (0: delete at once)")
	fl.DurationVar(&f.drain, "drain-timeout", 30*time.Second, "on SIGTERM, how long running runs get to finish their turn")
	fl.DurationVar(&f.policy.ttl, "sandbox-ttl", manager.DefaultSandboxTTL, "ttl of a sandbox made with CreateSandbox that asks for none")
	fl.DurationVar(&f.policy.maxTTL, "sandbox-max-ttl", manager.DefaultMaxSandboxTTL, "longest ttl (and idle timeout) CreateSandbox and SetTimeout may ask for")
	fl.DurationVar(&f.policy.idle, "sandbox-idle-timeout", manager.DefaultSandboxIdleTimeout, "delete a sandbox made with CreateSandbox once no call used it this long, unless it asks for another idle timeout")
	fl.DurationVar(&f.policy.command, "command-timeout", manager.DefaultCommandTimeout, "timeout of a sandbox API command (RunCommand, Exec, StartProcess) that asks for none")
	fl.DurationVar(&f.policy.maxCommand, "max-command-timeout", manager.DefaultMaxCommandTimeout, "longest timeout a sandbox API command may ask for")
	fl.StringVar(&f.policy.maxOutput, "max-output-bytes", "1MiB", "most bytes of each output stream RunCommand returns (the rest is counted, not kept)")
	fl.StringVar(&f.policy.maxFile, "max-file-bytes", "256MiB", "largest file written through the sandbox API (WriteFile, PUT /v1/sandboxes/{id}/files/...)")
	g.addAllowDomainFlag(cmd)
	return cmd
}

// sandboxPolicy checks the sandbox API's bounds and turns them into
// manager.SandboxPolicy.
func (p *policyFlags) sandboxPolicy() (manager.SandboxPolicy, error) {
	out := manager.SandboxPolicy{DefaultTTL: p.ttl, MaxTTL: p.maxTTL, DefaultIdleTimeout: p.idle,
		DefaultCommandTimeout: p.command, MaxCommandTimeout: p.maxCommand}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{{"--sandbox-ttl", p.ttl, time.Second}, {"--sandbox-max-ttl", p.maxTTL, time.Second}, {"--sandbox-idle-timeout", p.idle, time.Second},
		{"--command-timeout", p.command, 0}, {"--max-command-timeout", p.maxCommand, 0}} {
		if d.v <= 0 {
			return out, usageErr(compute.ErrInvalidArgument, "%s %s must be positive", d.name, d.v)
		}
		if d.v < d.min {
			return out, usageErr(compute.ErrInvalidArgument, "%s %s: at least %s", d.name, d.v, d.min)
		}
	}
	if p.ttl > p.maxTTL {
		return out, usageErr(compute.ErrInvalidArgument, "--sandbox-ttl %s is over --sandbox-max-ttl %s", p.ttl, p.maxTTL)
	}
	if p.idle > p.maxTTL {
		return out, usageErr(compute.ErrInvalidArgument, "--sandbox-idle-timeout %s is over --sandbox-max-ttl %s", p.idle, p.maxTTL)
	}
	if p.command > p.maxCommand {
		return out, usageErr(compute.ErrInvalidArgument, "--command-timeout %s is over --max-command-timeout %s", p.command, p.maxCommand)
	}
	var err error
	for _, b := range []struct {
		name, v string
		to      *int64
	}{{"--max-output-bytes", p.maxOutput, &out.MaxOutputBytes}, {"--max-file-bytes", p.maxFile, &out.MaxFileBytes}} {
		if *b.to, err = parseSize(b.name, b.v, false); err != nil {
			return out, err
		}
		if *b.to <= 0 {
			return out, usageErr(compute.ErrInvalidArgument, "%s must be positive", b.name)
		}
	}
	return out, nil
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

// tlsConfig loads --tls-cert and --tls-key (nil when neither is given).
func (f *serveFlags) tlsConfig() (*tls.Config, error) {
	if f.tlsCert == "" && f.tlsKey == "" {
		return nil, nil
	}
	if f.tlsCert == "" || f.tlsKey == "" {
		return nil, usageErr(compute.ErrInvalidArgument, "--tls-cert and --tls-key go together")
	}
	if f.insecureListen {
		return nil, usageErr(compute.ErrInvalidArgument, "--insecure-listen serves plain HTTP; it does not go with --tls-cert")
	}
	cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
	if err != nil {
		return nil, usageErr(compute.ErrInvalidArgument, "--tls-cert, --tls-key: %v", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// loopback reports whether a listener's address is a loopback one.
func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// listenAPI listens on --listen and refuses to serve bearer tokens in the
// clear beyond loopback: a non-loopback address needs TLS, or
// --insecure-listen (which warns).
func (f *serveFlags) listenAPI(g *globals, tlsCfg *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, usageErr(compute.ErrInvalidArgument, "--listen %s: %v", f.listen, err)
	}
	switch {
	case tlsCfg != nil || loopback(ln.Addr()):
	case f.insecureListen:
		fmt.Fprintf(g.streams.Err, "harness: WARNING: --insecure-listen: serving plain HTTP on %s, which is not a loopback address: "+
			"bearer tokens, run inputs and files cross the network unencrypted unless a TLS-terminating proxy is in front\n", ln.Addr())
	default:
		_ = ln.Close()
		return nil, usageErr(compute.ErrInvalidArgument, "--listen %s is not a loopback address, and bearer tokens must not cross the network in the clear: "+
			"give --tls-cert and --tls-key, or --insecure-listen to serve plain HTTP anyway (behind a TLS-terminating proxy)", f.listen)
	}
	return ln, nil
}

// parseSize reads a byte size: a number with an optional unit (K, M, G,
// T with or without "i"/"iB"/"B", all powers of 1024), or "none" (-1, no
// limit) when none is allowed.
func parseSize(flag, v string, none bool) (int64, error) {
	t := strings.TrimSpace(v)
	if t == "" {
		return 0, nil
	}
	if none && strings.EqualFold(t, "none") {
		return -1, nil
	}
	num := strings.TrimRightFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	unit := strings.ToUpper(strings.TrimSpace(t[len(num):]))
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
	sh, ok := shift[unit]
	n, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || n < 0 || n*float64(uint64(1)<<sh) >= 1<<62 {
		return 0, usageErr(compute.ErrInvalidArgument, "%s %q: want a size such as 512MiB, 2G or 1048576", flag, v)
	}
	return int64(n * float64(uint64(1)<<sh)), nil
}

// serviceQuotas turns the quota flags into service.Quotas.
func (q *quotaFlags) serviceQuotas() (service.Quotas, error) {
	out := service.Quotas{Runs: q.runs, Sandboxes: q.sandboxes, FetchWindow: q.fetchWindow}
	for name, v := range map[string]int{"--max-runs-per-tenant": q.runs, "--max-sandboxes-per-tenant": q.sandboxes} {
		if v == 0 || v < -1 {
			return out, usageErr(compute.ErrInvalidArgument, "%s must be positive (or -1: no limit)", name)
		}
	}
	if q.fetchWindow <= 0 {
		return out, usageErr(compute.ErrInvalidArgument, "--fetch-window must be positive")
	}
	if q.cpus < 0 || q.cpus > 1024 {
		return out, usageErr(compute.ErrInvalidArgument, "--sandbox-cpus %v: want a number of CPUs, e.g. 0.5", q.cpus)
	}
	out.Sandbox.MilliCPU = int64(q.cpus*1000 + 0.5)
	if q.cpus > 0 && out.Sandbox.MilliCPU == 0 {
		return out, usageErr(compute.ErrInvalidArgument, "--sandbox-cpus %v: at least 0.001", q.cpus)
	}
	var err error
	if out.Sandbox.MemoryBytes, err = parseSize("--sandbox-memory", q.memory, false); err != nil {
		return out, err
	}
	if out.Sandbox.DiskBytes, err = parseSize("--sandbox-disk", q.disk, false); err != nil {
		return out, err
	}
	if out.FetchBytesPerSandbox, err = parseSize("--max-fetch-bytes-per-sandbox", q.fetchPerSandbox, true); err != nil {
		return out, err
	}
	if out.FetchBytes, err = parseSize("--max-fetch-bytes-per-tenant", q.fetchPerTenant, true); err != nil {
		return out, err
	}
	if out.FetchBytesPerSandbox == 0 || out.FetchBytes == 0 {
		return out, usageErr(compute.ErrInvalidArgument, "--max-fetch-bytes-per-sandbox and --max-fetch-bytes-per-tenant must be positive (or none)")
	}
	return out, nil
}

// sandboxOptions carries the per-sandbox caps to the provider's
// per-sandbox options (service.Config.ProviderOptions). Docker and
// kubernetes cap a sandbox's CPU and memory (one CPU and 1 GiB unless
// told); local sandboxes get the same defaults and a process cap
// (service.DefaultSandboxProcesses), applied through cgroups, and
// --sandbox-disk as a disk cap (a file system of their own). For the
// others a cap is refused rather than dropped.
func sandboxOptions(provider string) func(service.SandboxResources) (any, error) {
	return func(r service.SandboxResources) (any, error) {
		if provider == "local" {
			r = r.OrDefaults()
			return &local.CreateOptions{Resources: local.Resources{CPUs: float64(r.MilliCPU) / 1000, Memory: r.MemoryBytes,
				MaxProcesses: service.DefaultSandboxProcesses, Disk: r.DiskBytes}}, nil
		}
		if r.MilliCPU == 0 && r.MemoryBytes == 0 && r.DiskBytes == 0 {
			return nil, nil
		}
		switch provider {
		case "docker":
			return &docker.CreateOptions{Memory: r.MemoryBytes, NanoCPUs: r.MilliCPU * 1_000_000, Disk: r.DiskBytes}, nil
		case "kubernetes":
			return &kubernetes.CreateOptions{Memory: r.MemoryBytes, MilliCPU: r.MilliCPU, Disk: r.DiskBytes}, nil
		}
		return nil, usageErr(compute.ErrInvalidArgument, "--sandbox-cpus, --sandbox-memory: the %s provider cannot cap a sandbox's CPU or memory (docker, kubernetes and local can)", provider)
	}
}

// checkSandboxOptions fails at start, rather than at the first sandbox,
// when the provider cannot apply the caps opts carry here (local
// sandboxes' need cgroup controllers this process may use).
func checkSandboxOptions(opts any) error {
	if o, ok := opts.(*local.CreateOptions); ok {
		if err := local.CheckResources(o.Resources); err != nil {
			return usageErr(compute.ErrFailedPrecondition, "local sandboxes of a service are capped (--sandbox-cpus, --sandbox-memory, %d processes, and --sandbox-disk when given), which this process cannot do here: %v",
				service.DefaultSandboxProcesses, err)
		}
	}
	return nil
}

func serve(cmd *cobra.Command, g *globals, f *serveFlags) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var previewKey []byte
	if f.previewKey != "" {
		k, err := service.ReadPreviewKey(f.previewKey)
		if err != nil {
			return usageErr(compute.ErrInvalidArgument, "--preview-key-file: %v", err)
		}
		previewKey = k
	}
	if f.maxTurns <= 0 {
		return usageErr(compute.ErrInvalidArgument, "--max-turns must be positive")
	}
	if f.retention < 0 || f.drain <= 0 {
		return usageErr(compute.ErrInvalidArgument, "--sandbox-retention must not be negative and --drain-timeout must be positive")
	}
	quotas, err := f.quotas.serviceQuotas()
	if err != nil {
		return err
	}
	policy, err := f.policy.sandboxPolicy()
	if err != nil {
		return err
	}
	popts := sandboxOptions(g.provider)
	if opts, err := popts(quotas.Sandbox); err != nil {
		return err
	} else if err := checkSandboxOptions(opts); err != nil {
		return err
	}
	authn, err := f.authenticator()
	if err != nil {
		return err
	}
	tlsCfg, err := f.tlsConfig()
	if err != nil {
		return err
	}
	// Listen before anything slow, so a taken port fails at once.
	ln, err := f.listenAPI(g, tlsCfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	var mln net.Listener
	if f.metricsListen != "" {
		if mln, err = net.Listen("tcp", f.metricsListen); err != nil {
			return usageErr(compute.ErrInvalidArgument, "--metrics-listen %s: %v", f.metricsListen, err)
		}
		defer mln.Close()
		if !loopback(mln.Addr()) {
			fmt.Fprintf(g.streams.Err, "harness: WARNING: --metrics-listen %s is not a loopback address: the metrics are unauthenticated and show every tenant's activity\n", mln.Addr())
		}
	}
	flush, err := g.setupTracing(ctx)
	if err != nil {
		return err
	}
	defer flush()
	log := g.logger()
	mdl, closeModel, err := f.serveModel(g)
	if err != nil {
		return err
	}
	defer closeModel()
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
	if err := serveSandboxRoot(g); err != nil {
		return err
	}
	// Tenants' git_repo entries: only from the hosts the operator allows,
	// with the operator's credential for each (materializer.GitPolicy),
	// charged to the tenants' fetch quotas while git writes them.
	gitPolicy, err := materializer.ParseGitPolicy(f.gitHosts, f.gitCredentials)
	if err != nil {
		return usageErr(compute.ErrInvalidArgument, "--git-host/--git-credential: %v", err)
	}
	client, release, err := g.client(materializer.Options{Git: service.MeteredGit(nil), Untrusted: true, GitPolicy: gitPolicy})
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
	svc, err := service.New(ctx, service.Config{Store: st, Compute: client, Model: mdl, DefaultModel: modelName, Models: f.models, Auth: authn, Log: log,
		DefaultInstructions: instructions, MaxTurns: f.maxTurns, SandboxRetention: f.retention, DrainTimeout: f.drain,
		Console: console.Handler(), Observer: m, Runs: m, Quotas: quotas, ProviderOptions: popts, CheckManifest: gitPolicy.CheckManifest,
		PreviewKey: previewKey, PreviewHost: f.previewHost, Sandboxes: policy})
	if err != nil {
		return err
	}
	// The metrics listener outlives the API's, so the drain can be watched.
	metricsDone := make(chan error, 1)
	mctx, mstop := context.WithCancel(context.WithoutCancel(ctx))
	defer mstop()
	if mln != nil {
		go func() {
			metricsDone <- service.Serve(mctx, mln, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), time.Second)
		}()
		fmt.Fprintf(g.streams.Err, "harness: metrics on http://%s/metrics\n", mln.Addr())
	} else {
		metricsDone <- nil
	}
	var serveErr error
	if tlsCfg != nil {
		fmt.Fprintf(g.streams.Err, "harness: serving on https://%s (gRPC, Connect/JSON, SSE over TLS; console at %s)\n", ln.Addr(), console.MountPath)
		serveErr = service.ServeTLS(ctx, ln, svc.Handler(), tlsCfg, 5*time.Second)
	} else {
		fmt.Fprintf(g.streams.Err, "harness: serving on http://%s (gRPC, Connect/JSON, SSE; console at %s)\n", ln.Addr(), console.MountPath)
		serveErr = service.Serve(ctx, ln, svc.Handler(), 5*time.Second)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.drain+2*time.Minute)
	defer cancel()
	fmt.Fprintln(g.streams.Err, "harness: shutting down: checkpointing running runs")
	if err := svc.Shutdown(sctx); err != nil {
		serveErr = errors.Join(serveErr, err)
	}
	mstop()
	if err := <-metricsDone; err != nil {
		serveErr = errors.Join(serveErr, fmt.Errorf("metrics: %w", err))
	}
	return serveErr
}

// serveModel is the service's model: a replay of --replay (every run
// replays the recording from its first turn: replay.FromStart), the
// OpenAI model with $OPENAI_API_KEY, or, without a key, none: runs are
// off (said once on stderr) and the rest of the service works. The
// returned func closes a replay's server.
func (f *serveFlags) serveModel(g *globals) (model.Model, func(), error) {
	if f.replay != "" {
		m, closeModel, err := replayModel(g, f.replay, func(turns []replay.Turn) (*replay.Server, error) {
			srv := replay.NewServer()
			srv.DiscardRequests() // a service's conversations are not kept
			srv.SetFallback(replay.FromStart(turns...))
			return srv, nil
		})
		if err != nil {
			return nil, nil, usageErr(compute.ErrInvalidArgument, "--replay: %v", err)
		}
		fmt.Fprintf(g.streams.Err, "harness: [REPLAY] every run replays the recorded model session %s from its first turn (no model is called); the sandboxes, tools and commands are real\n", f.replay)
		return m, closeModel, nil
	}
	if os.Getenv("OPENAI_API_KEY") == "" {
		fmt.Fprintln(g.streams.Err, "harness: runs are off: OPENAI_API_KEY is not set, so this service has no model and StartRun and ResumeRun answer FailedPrecondition; "+
			"sandboxes and the console work. Set OPENAI_API_KEY, or give --replay FILE to serve runs from a recorded model session.")
		return nil, func() {}, nil
	}
	m, err := model.NewOpenAI(model.Config{Logger: g.logger()})
	if err != nil {
		return nil, nil, fmt.Errorf("%w (OPENAI_BASE_URL for another endpoint)", err)
	}
	return m, func() {}, nil
}

// serveMetrics makes the service's Prometheus metrics (pkg/harness/metrics)
// in their own registry, served at /metrics on --metrics-listen (never on
// the API's port: they show every tenant's activity). The metrics are the observer
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

// serveSandboxRoot makes sure the local sandboxes of a service see
// nothing of this host: isolated (bubblewrap or gVisor), they run on a
// root file system of their own (--sandbox-rootfs; without the flag, the
// rootfs directory next to the harness binary, which `make rootfs`
// writes), never the host's /. Plain processes (--isolation none) see
// the host whatever is given: they are allowed only by name, with a
// warning. Other providers bring their own root file system (an image).
func serveSandboxRoot(g *globals) error {
	if g.provider != "local" {
		return nil
	}
	if g.isolation == string(local.IsolationNone) {
		fmt.Fprintln(g.streams.Err, "harness: WARNING: --isolation none in a service: every tenant's sandbox runs as plain processes that see this host's files")
		return nil
	}
	if g.sandboxRootFS != "" {
		return nil
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Join(filepath.Dir(exe), "rootfs")
		if fi, err := os.Stat(filepath.Join(dir, "bin", "sh")); err == nil && !fi.IsDir() {
			g.sandboxRootFS = dir
			fmt.Fprintf(g.streams.Err, "harness: local sandboxes run on the root file system %s\n", dir)
			return nil
		}
	}
	return usageErr(compute.ErrInvalidArgument, "harness serve runs local sandboxes on a root file system of their own, never this host's /: "+
		"give --sandbox-rootfs DIR (`make rootfs` writes bin/rootfs), or run plain processes that see this host with --isolation none")
}
