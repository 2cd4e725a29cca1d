package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Keepalive settings. Processes and Attach streams are long-lived, so the
// server pings idle connections to notice dead clients (their processes keep
// running; only the stream ends), and lets clients ping it every 10s so a
// harness can notice a dead sandbox quickly.
const (
	keepaliveTime     = 30 * time.Second
	keepaliveTimeout  = 10 * time.Second
	clientMinPingTime = 10 * time.Second
	// maxMessageBytes bounds one message; large data moves as streams of chunks.
	maxMessageBytes = 8 << 20
	// Flow-control windows sized for bulk output and file streams over a
	// local socket: gRPC's default 64 KiB start (grown slowly by its BDP
	// estimator) caps a single stream far below what a pipe delivers.
	streamWindowBytes = 8 << 20
	connWindowBytes   = 16 << 20
	ioBufferBytes     = 256 << 10
)

// Limits on what a connection may make the daemon hold, before and
// regardless of authentication (issue #27, hostile tenants).
const (
	// maxHeaderListBytes bounds the decoded header list of one call
	// (HTTP/2's SETTINGS_MAX_HEADER_LIST_SIZE, announced and enforced).
	// grpc-go's default is 16 MiB, decoded and kept per stream before any
	// check of the token: 40 token-less calls with 15 MiB of headers took
	// the daemon from 17 to 170 MiB two at a time, to 1.4 GiB all at
	// once. A harness sends a few hundred bytes (authorization,
	// content-type, te, user-agent, grpc-timeout).
	// A call over it is refused: its stream is reset, or its connection
	// closed when the excess is large (the decoder stops early).
	maxHeaderListBytes = 64 << 10
	// minConcurrentStreams is the least number of streams one connection
	// may have open at once (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS;
	// see maxConcurrentStreams).
	minConcurrentStreams = 1024
	// streamsPerProcess is how many open streams per allowed process
	// (Config.MaxProcesses) one connection may have: a harness holds an
	// Attach or Exec stream for each process it follows, plus port
	// forwards (a stream per TCP connection) and file transfers.
	streamsPerProcess = 4
)

// maxConcurrentStreams is the stream limit of one connection for a daemon
// that runs up to maxProcesses processes: streamsPerProcess per process,
// at least minConcurrentStreams. With the default 64 processes that is
// 1024. The real load is far below: a harness that follows every process
// of a full daemon holds 64 long-lived Attach or Exec streams on its one
// connection, and the benchmarks keep a few at once per sandbox
// (benchreport's scaling series runs one command at a time per sandbox,
// its soak 32 calls in flight over all sandboxes). The headroom matters
// because a gRPC client over the limit waits for a stream to end instead
// of failing: the limit must never be what a harness reaches. It bounds
// what one connection can hold open in the daemon (a handler goroutine
// and receive buffers per stream; grpc also caps the connection's running
// handlers at it).
func maxConcurrentStreams(maxProcesses int) uint32 {
	procs := min(max(maxProcesses, 0), math.MaxUint32/streamsPerProcess+1) // no overflow below
	return uint32(min(max(uint64(procs)*streamsPerProcess, minConcurrentStreams), math.MaxUint32))
}

// Server is a configured gRPC server over a Daemon.
type Server struct {
	GRPC   *grpc.Server
	Health *health.Server
	Daemon *agentd.Daemon
	drain  *drainGate
	// reclaim records activity and, in Run, gives memory back after bursts.
	reclaim *reclaimer
	// Metrics is the daemon's metric set; nil (nothing is counted and no
	// interceptor runs) unless New was given WithMetrics.
	Metrics *metrics.Set
	log     *zap.Logger
	system  *systemService
}

// Option adjusts New.
type Option func(*options)

type options struct {
	metrics   bool
	bulkProcs int
	handshake time.Duration
}

// WithMetrics makes New count calls, bytes and refused tokens in
// Server.Metrics (see package metrics); serve them with Metrics.Serve.
func WithMetrics() Option {
	return func(o *options) { o.metrics = true }
}

// WithBulkGOMAXPROCS makes Archive and Restore raise GOMAXPROCS to n
// while they run, when n is above the count at the time (see
// Config.BulkGOMAXPROCS).
func WithBulkGOMAXPROCS(n int) Option {
	return func(o *options) { o.bulkProcs = n }
}

// WithHandshakeTimeout bounds how long a new connection may take to
// finish its TLS handshake (when on) and the HTTP/2 preface and settings
// (grpc.ConnectionTimeout); DefaultHandshakeTimeout unless given. Run
// also closes a connection that has made no authenticated call by then
// (see Config.HandshakeTimeout).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(o *options) { o.handshake = d }
}

// New builds the gRPC server with auth, logging, panic recovery and the
// drain gate, and registers every service plus health and reflection.
// token may be nil only with insecureNoAuth.
func New(d *agentd.Daemon, token []byte, insecureNoAuth bool, creds credentials.TransportCredentials, log *zap.Logger, extra ...Option) (*Server, error) {
	if len(token) == 0 && !insecureNoAuth {
		return nil, errors.New("refusing to serve without a token")
	}
	o := options{handshake: DefaultHandshakeTimeout}
	for _, opt := range extra {
		opt(&o)
	}
	var ms *metrics.Set // nil: metrics off, every count a no-op
	if o.metrics {
		ms = metrics.New(buildinfo.Version(), d.Processes().Running)
	}
	auth := newTokenAuth(token, insecureNoAuth)
	auth.metrics = ms
	gate := &drainGate{}
	rec := newReclaimer(DefaultReclaimIdle, freeMemory, log)
	recU, recS := rec.interceptors()
	var clock *activity.Clock // nil without a daemon (tests)
	if d != nil {
		clock = d.Activity()
	}
	actU, actS := activityInterceptors(clock)
	logU, logS := requestLog(log)
	panicU, panicS := recovery(log)
	// Order: log every call (including auth failures and recovered
	// panics, which the recovery below turns into Internal), time it for
	// the metrics (when on), then authenticate, then record activity for
	// the sandbox's idle clock (Info's last_activity) and the reclaimer (a
	// caller without the token makes neither do anything), then refuse new
	// work while draining.
	unary := []grpc.UnaryServerInterceptor{logU, panicU, auth.unary, actU, recU, gate.unary}
	stream := []grpc.StreamServerInterceptor{logS, panicS, auth.stream, actS, recS, gate.stream}
	if ms != nil {
		mU, mS := rpcMetrics(ms)
		unary = slices.Insert(unary, 1, mU)
		stream = slices.Insert(stream, 1, mS)
	}
	maxProcs := 0 // a test's server without a daemon gets the floor
	if d != nil {
		maxProcs = d.Config().MaxProcesses
	}
	opts := []grpc.ServerOption{
		// Before any stream exists: bounded headers, bounded streams, and
		// calls without the token refused on their headers (earlyRefusal).
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.MaxConcurrentStreams(maxConcurrentStreams(maxProcs)),
		// A connection stalled in its handshake or preface is closed
		// (gRPC's default waits 120 s); see also connLimiter.
		grpc.ConnectionTimeout(o.handshake),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: clientMinPingTime, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.MaxSendMsgSize(maxMessageBytes),
		grpc.InitialWindowSize(streamWindowBytes),
		grpc.InitialConnWindowSize(connWindowBytes),
		grpc.ReadBufferSize(ioBufferBytes),
		grpc.WriteBufferSize(ioBufferBytes),
		// Buffers are not cleared before reuse, and WriteFile data is
		// decoded with one copy (see codec).
		experimental.BufferPool(pool),
		grpc.ForceServerCodecV2(codec{}),
		// Streams are served by goroutines that are kept (one per CPU)
		// rather than a new one each, whose stack would grow again through
		// the interceptors and the exec path on every call. When all are
		// busy (long Attach, Exec or Forward streams) grpc starts a new
		// goroutine as without them.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	early := &earlyRefusal{auth: auth, log: log}
	if !insecureNoAuth {
		opts = append(opts, grpc.InTapHandle(early.handle))
	}
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	sys := &systemService{d: d, auth: auth}
	agentdv1.RegisterSystemServiceServer(gs, sys)
	agentdv1.RegisterProcessServiceServer(gs, &processService{d: d, m: ms})
	agentdv1.RegisterFileServiceServer(gs, &fileService{d: d, m: ms})
	agentdv1.RegisterWorkspaceServiceServer(gs, &workspaceService{d: d, m: ms, bulk: newBulkProcs(o.bulkProcs)})
	agentdv1.RegisterPortServiceServer(gs, &portService{d: d})
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	var methods []string
	for svc, info := range gs.GetServiceInfo() {
		for _, m := range info.Methods {
			methods = append(methods, "/"+svc+"/"+m.Name)
		}
	}
	early.known = make(map[string]bool, len(methods))
	for _, m := range methods {
		early.known[m] = true
	}
	ms.KnownMethods(methods)
	return &Server{GRPC: gs, Health: hs, Daemon: d, drain: gate, reclaim: rec, Metrics: ms, log: log, system: sys}, nil
}

// Shutdown drains: health says NOT_SERVING, new work is refused, every
// process group is killed (which ends Attach and Exec streams), then the
// server stops gracefully, or forcibly once ctx is done.
func (s *Server) Shutdown(ctx context.Context) {
	s.Health.Shutdown()
	s.drain.draining.Store(true)
	if err := s.Daemon.Shutdown(ctx); err != nil {
		s.log.Warn("shutdown: stopping processes", zap.Error(err))
	}
	done := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("shutdown: drain timed out; closing remaining streams")
		s.GRPC.Stop()
		<-done
	}
}

// startReclaimer gives memory back once each burst of calls has been over
// for idle, and during one when the runtime's memory grew by growth bytes
// (see reclaimer), until ctx is done or the returned stop is called, which
// waits for it to end. idle <= 0 disables it; growth <= 0 disables
// reclaiming during a burst.
func (s *Server) startReclaimer(ctx context.Context, idle time.Duration, growth int64) (stop func()) {
	if idle <= 0 {
		return func() {}
	}
	s.reclaim.idle = idle
	s.reclaim.growth = uint64(max(growth, 0))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.reclaim.run(ctx)
	}()
	return func() { cancel(); <-done }
}

// Run starts sandbox-agentd and serves until ctx is canceled (SIGTERM in the
// main), then shuts down gracefully.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	// The token is read (and its file removed) before anything listens, so
	// there is no window in which calls go unauthenticated.
	token, err := cfg.loadToken()
	if err != nil {
		return err
	}
	if cfg.InsecureNoAuth {
		log.Warn("AUTHENTICATION IS DISABLED (--insecure-no-auth): anyone who can reach the listen address controls this sandbox; use only for local development")
	}
	creds, err := cfg.transportCredentials()
	if err != nil {
		return err
	}
	d, err := agentd.New(cfg.Daemon, log)
	if err != nil {
		return err
	}
	srvOpts := []Option{WithBulkGOMAXPROCS(cfg.BulkGOMAXPROCS), WithHandshakeTimeout(cfg.HandshakeTimeout)}
	if cfg.MetricsListen != "" {
		srvOpts = append(srvOpts, WithMetrics())
	}
	srv, err := New(d, token, cfg.InsecureNoAuth, creds, log, srvOpts...)
	if err != nil {
		return err
	}
	listeners, err := listenAll(cfg.Listen)
	if err != nil {
		_ = d.Shutdown(context.Background())
		return err
	}
	serveErr := make(chan error, len(listeners)+1)
	// Checkpoints (checkpoint.go): listeners that close and listen again,
	// and SIGUSR1 to come back.
	listeners = srv.checkpointable(cfg, listeners, serveErr)
	defer resumeOnSignal(d, log)()
	var stopMetrics func()
	if cfg.MetricsListen != "" {
		if stopMetrics, err = serveMetrics(cfg.MetricsListen, srv.Metrics, serveErr, log); err != nil {
			for _, l := range listeners {
				l.Close()
			}
			_ = d.Shutdown(context.Background())
			return err
		}
	}
	// Without a token there is no authenticated call to wait for: only
	// gRPC's handshake timeout applies.
	authTimeout := cfg.HandshakeTimeout
	if cfg.InsecureNoAuth {
		authTimeout = 0
	}
	for _, l := range listeners {
		log.Info("listening", zap.String("address", l.Addr().Network()+"://"+l.Addr().String()),
			zap.Int("max_connections", cfg.MaxConnections))
		l := limitConnections(l, cfg.MaxConnections, authTimeout, srv.Metrics, log)
		go func() { serveErr <- srv.GRPC.Serve(l) }()
	}
	log.Info("sandbox-agentd ready", zap.String("workspace", cfg.Daemon.WorkspaceRoot), zap.Bool("tls", creds != nil), zap.Bool("auth", !cfg.InsecureNoAuth))
	stopReclaim := srv.startReclaimer(ctx, cfg.ReclaimIdle, cfg.ReclaimGrowth)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	}
	stopReclaim()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	srv.Shutdown(sctx)
	if stopMetrics != nil {
		stopMetrics()
	}
	for _, l := range cfg.Listen {
		if network, addr, _ := parseListen(l); network == "unix" {
			_ = os.Remove(addr)
		}
	}
	return runErr
}

func listenAll(addresses []string) ([]net.Listener, error) {
	var out []net.Listener
	fail := func(err error) ([]net.Listener, error) {
		for _, l := range out {
			l.Close()
		}
		return nil, err
	}
	for _, a := range addresses {
		network, addr, err := parseListen(a)
		if err != nil {
			return fail(err)
		}
		if network == "unix" {
			if err := removeStaleSocket(addr); err != nil {
				return fail(err)
			}
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			return fail(fmt.Errorf("listen %s: %w", a, err))
		}
		if network == "unix" {
			// Only the daemon's user (and root) may connect; the token is
			// still required.
			if err := os.Chmod(addr, 0o600); err != nil {
				l.Close()
				return fail(fmt.Errorf("restrict socket %s: %w", addr, err))
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// removeStaleSocket removes a socket left by a daemon that died, and refuses
// to remove anything that is not a socket.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check socket path %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("socket path %s exists and is not a socket", path)
	}
	return os.Remove(path)
}

func (c *Config) transportCredentials() (credentials.TransportCredentials, error) {
	if c.TLSCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCAFile != "" {
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s holds no PEM certificate", c.ClientCAFile)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(tc), nil
}
