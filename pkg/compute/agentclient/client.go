// Package agentclient is the typed gRPC client of sandbox-agentd, used by
// every provider. It authenticates every call with the sandbox's token and
// turns gRPC statuses back into compute errors, so callers test failures
// with errors.Is(err, errkind.ErrNotFound) and errkind.Retryable(err).
//
// # The shape of the API
//
// The API is in Go types (types.go): the wire's messages
// (proto/bulkhead/agentd/v1) stay inside this package, converted in one
// file (convert.go), so a caller never imports the wire contract and a
// field added to it is a field added to a Go struct, not a new signature.
// Every method of Client that maps to one RPC has the same shape:
//
//   - It takes ctx, what the call is about (a path, a process id, a
//     ProcessSpec), and an options struct for everything optional, and
//     returns a typed result (or only an error when the daemon answers
//     nothing):
//
//     Stat(ctx, path string, StatOptions) (*FileInfo, error)
//     Signal(ctx, processID, signal string) error
//
//   - A streaming call takes, last, the other end of the stream: an
//     io.Writer that receives a download, an io.Reader that supplies an
//     upload, or a callback that sees each message. It returns what the
//     stream ends with (the file's info, the archive's stats, the exit
//     status); Forward returns the tunnel as a net.Conn.
//
//     ReadFile(ctx, path string, ReadFileOptions, io.Writer) (*FileInfo, error)
//     WriteFile(ctx, path string, WriteFileOptions, io.Reader) (*WriteFileResult, error)
//     Follow(ctx, processID string, FollowOptions, func(*Output) error) (*ExitStatus, error)
//     Forward(ctx, port int) (net.Conn, error)
//
// Enums are string constants, durations time.Duration, times time.Time.
// Errors are Go errors from the one registry (package errkind): test them
// with errors.Is and errkind.Retryable. Start and Exec make a request id
// when the options carry none (see NewRequestID). Helpers that are not
// one RPC of the daemon's own services keep plain parameters: Health (the
// standard gRPC health check, one attempt), WaitReady, ListenLocal and
// Close.
//
// The connection itself is not exposed: everything a caller needs from it
// (health, the daemon's services) is a method here.
package agentclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Options says how to reach a daemon.
type Options struct {
	// Address is unix:///path/to.sock, tcp://host:port or host:port.
	Address string
	// Token is the sandbox's bearer token. Empty only against a daemon
	// started with --insecure-no-auth.
	Token string
	// TLS, when set, is used for the connection (add a client certificate for mTLS).
	TLS *tls.Config
	// DialOptions are appended (tests use them for bufconn dialers).
	DialOptions []grpc.DialOption
	// TracerProvider, when set, gets a client span for every call
	// (OpenTelemetry's gRPC conventions: rpc.method, rpc.response.status_code,
	// server.address). A failed call's span has the status code, never the
	// daemon's message (it may quote a file). No trace context or baggage
	// is sent to the daemon. nil: no instrumentation.
	TracerProvider trace.TracerProvider
}

// Client is a connection to one sandbox-agentd.
type Client struct {
	conn      *grpc.ClientConn
	creds     *bearer // Dial's token credentials; nil for New or no token
	system    agentdv1.SystemServiceClient
	process   agentdv1.ProcessServiceClient
	file      agentdv1.FileServiceClient
	workspace agentdv1.WorkspaceServiceClient
}

// Dial prepares a client. Like grpc.NewClient it does no I/O: the first call
// connects, and a dropped connection is re-established on the next call.
func Dial(opts Options) (*Client, error) {
	target, err := grpcTarget(opts.Address)
	if err != nil {
		return nil, err
	}
	dial := []grpc.DialOption{
		// Re-dial quickly: a sandbox's daemon is usually local or one hop
		// away, and a reconnecting harness should not sit out gRPC's
		// default one-second first backoff.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 15 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)),
		// Large windows and buffers: output and file streams are bulk
		// transfers (see the server's settings).
		grpc.WithInitialWindowSize(8 << 20),
		grpc.WithInitialConnWindowSize(16 << 20),
		grpc.WithReadBufferSize(256 << 10),
		grpc.WithWriteBufferSize(256 << 10),
	}
	if opts.TLS != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(opts.TLS)))
	} else {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	var creds *bearer
	if opts.Token != "" {
		creds = newBearer(opts.Token)
		dial = append(dial, grpc.WithPerRPCCredentials(creds))
	}
	if opts.TracerProvider != nil {
		dial = append(dial, grpc.WithStatsHandler(tracingHandler(opts.TracerProvider)))
	}
	dial = append(dial, opts.DialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("agentclient: %s: %w", opts.Address, err)
	}
	c := New(conn)
	c.creds = creds
	return c, nil
}

// New wraps an existing connection (whose credentials the caller set up).
func New(conn *grpc.ClientConn) *Client {
	return &Client{
		conn:      conn,
		system:    agentdv1.NewSystemServiceClient(conn),
		process:   agentdv1.NewProcessServiceClient(conn),
		file:      agentdv1.NewFileServiceClient(conn),
		workspace: agentdv1.NewWorkspaceServiceClient(conn),
	}
}

// Close closes the connection. Processes in the sandbox keep running.
func (c *Client) Close() error { return c.conn.Close() }

// Info describes the daemon.
func (c *Client) Info(ctx context.Context) (*DaemonInfo, error) {
	resp, err := c.system.Info(ctx, &agentdv1.InfoRequest{})
	if err != nil {
		return nil, wrap(err)
	}
	return daemonInfoOf(resp), nil
}

// RotateToken replaces the daemon's bearer token with newToken (see
// SystemService.RotateToken: at least 32 visible ASCII characters of
// random data). The call carries the current token. When it succeeds and
// the client was made by Dial with a token, every later call on this
// client carries the new token; calls already sent (and streams already
// open) keep the old one, so rotate while no other call is starting. A
// client made by New carries whatever credentials its connection has: the
// caller switches them. On failure the client keeps the old token; a
// failure without a reply (the connection dropped) leaves open whether the
// daemon rotated: retry by calling Info with each token. Errors never
// quote a token.
func (c *Client) RotateToken(ctx context.Context, newToken string) error {
	if _, err := c.system.RotateToken(ctx, &agentdv1.RotateTokenRequest{NewToken: newToken}); err != nil {
		return wrap(err)
	}
	if c.creds != nil {
		c.creds.set(newToken)
	}
	return nil
}

// PrepareCheckpoint readies the daemon for a checkpoint of its whole
// sandbox (gVisor's `runsc checkpoint`, which cannot save a socket of the
// host's): once it has answered and this client hung up (Close it; the
// daemon waits half a second at most), it closes every connection, the
// egress relay's connections to the proxy and its listeners, removing its
// unix sockets last, and holds no socket of the host's until it receives
// SIGUSR1 (after the restore) or opts.ResumeAfter passes. Processes,
// their output and the workspace are untouched; it then listens again at
// the same addresses with the same token. A daemon that predates it
// answers an errkind.ErrUnimplemented error; one prepared already, an
// errkind.ErrFailedPrecondition error.
func (c *Client) PrepareCheckpoint(ctx context.Context, opts PrepareCheckpointOptions) error {
	if _, err := c.system.PrepareCheckpoint(ctx, prepareCheckpointToProto(opts)); err != nil {
		return wrap(err)
	}
	return nil
}

// Health asks the daemon's standard gRPC health service once. It returns
// nil when the daemon reports SERVING, an errkind.ErrUnavailable error
// naming the status it reported otherwise, and a compute error when the
// check itself failed. Health needs no token (the daemon answers it before
// authentication); WaitReady polls it.
func (c *Client) Health(ctx context.Context) error {
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return wrap(err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%w: health is %s", errkind.ErrUnavailable, st)
	}
	return nil
}

// BearerMetadata returns the metadata pair a raw gRPC client (grpcurl, a
// test) must send: "authorization", "Bearer <token>".
func BearerMetadata(token string) (key, value string) { return "authorization", "Bearer " + token }

// bearer attaches the token to every call. RotateToken swaps it; each call
// reads it once, atomically, when gRPC asks for its metadata.
type bearer struct {
	header atomic.Pointer[string] // "Bearer <token>"
}

func newBearer(token string) *bearer {
	b := &bearer{}
	b.set(token)
	return b
}

func (b *bearer) set(token string) {
	_, v := BearerMetadata(token)
	b.header.Store(&v)
}

func (b *bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	k, _ := BearerMetadata("")
	return map[string]string{k: *b.header.Load()}, nil
}

// RequireTransportSecurity is false: unix sockets and loopback TCP carry the
// token without TLS; remote sandboxes should use TLS.
func (b *bearer) RequireTransportSecurity() bool { return false }

// tracingHandler is otelgrpc's client handler over tp, with an empty
// propagator (the sandbox is untrusted and has no tracing: it gets neither
// trace context nor baggage) and failed calls reduced to their code.
func tracingHandler(tp trace.TracerProvider) stats.Handler {
	return codeOnly{otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator()),
	)}
}

// codeOnly passes a call's end to the handler with the error replaced by
// its bare status code, so the span's status carries no message from the
// daemon (a rejected patch quotes the file's lines).
type codeOnly struct {
	stats.Handler
}

func (h codeOnly) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	if end, ok := rs.(*stats.End); ok && end.Error != nil {
		e := *end
		code := status.Code(end.Error)
		e.Error = status.Error(code, code.String())
		rs = &e
	}
	h.Handler.HandleRPC(ctx, rs)
}

// wrap converts a gRPC error into a compute error.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	return errmap.FromStatus(err)
}

// PatchRejection returns the structured reason an ApplyPatch failed, if
// err carries one, else nil.
func PatchRejection(err error) *PatchRejectionDetail { return rejectionOf(errmap.PatchRejection(err)) }

func grpcTarget(address string) (string, error) {
	if address == "" {
		return "", fmt.Errorf("agentclient: %w: empty address", errkind.ErrInvalidArgument)
	}
	u, err := url.Parse(address)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return "passthrough:///" + address, nil // host:port
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if u.Host != "" {
			p = u.Host + u.Path
		}
		return "unix://" + p, nil
	case "tcp":
		return "passthrough:///" + u.Host, nil
	case "passthrough", "dns":
		return address, nil
	}
	return "", fmt.Errorf("agentclient: %w: address %q: scheme must be unix:// or tcp://", errkind.ErrInvalidArgument, address)
}

// errStreamEnded reports a server stream that closed without its final message.
var errStreamEnded = errors.New("stream ended before the process exited")
