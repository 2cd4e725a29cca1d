package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
)

// AuthorizationHeader is the metadata key carrying "Bearer <token>".
const AuthorizationHeader = "authorization"

// healthPrefix is the only service callable without a token, so that probes
// (grpc_health_probe, Kubernetes) work.
const healthPrefix = "/grpc.health.v1.Health/"

// tokenAuth checks the bearer token of every call except health checks.
// The comparison is constant-time over SHA-256 digests, so neither the
// token's content nor its length leaks through timing. Only the digest is
// kept. rotate replaces it atomically: a call checked after rotate
// returned sees the new digest only.
type tokenAuth struct {
	digest  atomic.Pointer[[sha256.Size]byte]
	none    bool         // --insecure-no-auth
	metrics *metrics.Set // counts refused tokens; nil: off
}

func newTokenAuth(token []byte, insecureNoAuth bool) *tokenAuth {
	a := &tokenAuth{none: insecureNoAuth}
	d := sha256.Sum256(token)
	a.digest.Store(&d)
	return a
}

// Limits on a token given to RotateToken.
const (
	minRotateTokenBytes = 32
	// minRotateTokenBits is the least entropy a new token must show by
	// its characters' frequencies (an estimate: it rejects repeated or
	// low-variety strings, not every guessable one). 32 random bytes in
	// hex show about 240 bits, in base64 about 250.
	minRotateTokenBits = 128
)

// errTokenRejected is returned by rotate for an unacceptable new token.
// Its messages describe the rule broken, never the token.
var errTokenRejected = errors.New("new token rejected")

// errRotationRaced says another RotateToken changed the token between this
// call's authentication and its swap.
var errRotationRaced = errors.New("a concurrent rotation replaced the token first")

// checkNewToken applies RotateToken's rules to a candidate token: length
// between minRotateTokenBytes and maxTokenBytes, visible ASCII only (it
// travels in a header as "Bearer <token>"), and an estimated entropy of at
// least minRotateTokenBits.
func checkNewToken(token string) error {
	if len(token) < minRotateTokenBytes || len(token) > maxTokenBytes {
		return fmt.Errorf("%w: must be %d to %d bytes", errTokenRejected, minRotateTokenBytes, maxTokenBytes)
	}
	var counts [256]int
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: must be visible ASCII without spaces", errTokenRejected)
		}
		counts[c]++
	}
	// Shannon entropy of the character frequencies, times the length.
	n := float64(len(token))
	bits := 0.0
	for _, k := range counts {
		if k > 0 {
			p := float64(k) / n
			bits -= float64(k) * math.Log2(p)
		}
	}
	if periodic(token) {
		return fmt.Errorf("%w: a repeated pattern", errTokenRejected)
	}
	if bits < minRotateTokenBits {
		return fmt.Errorf("%w: too little entropy (use at least 32 random bytes, hex or base64 encoded)", errTokenRejected)
	}
	return nil
}

// periodic reports whether s repeats a pattern of up to 256 bytes that is
// at most half its length ("abcabcab").
func periodic(s string) bool {
	for p := 1; p <= len(s)/2 && p <= 256; p++ {
		if s[p:] == s[:len(s)-p] {
			return true
		}
	}
	return false
}

// rotate makes token the only one accepted from now on, provided the
// caller's own token (caller, already authenticated by check) is still the
// current one at the moment of the swap: of two rotations racing with the
// same token one wins, the other gets errRotationRaced. A token equal to
// the current one is refused: a rotation that changes nothing would leave
// a token believed retired in force.
func (a *tokenAuth) rotate(caller, token string) error {
	if err := checkNewToken(token); err != nil {
		return err
	}
	d := sha256.Sum256([]byte(token))
	was := sha256.Sum256([]byte(caller))
	cur := a.digest.Load()
	if subtle.ConstantTimeCompare(was[:], cur[:]) != 1 {
		return errRotationRaced
	}
	if subtle.ConstantTimeCompare(d[:], cur[:]) == 1 {
		return fmt.Errorf("%w: equals the current token", errTokenRejected)
	}
	if !a.digest.CompareAndSwap(cur, &d) {
		return errRotationRaced
	}
	return nil
}

// bearerToken is the token a call carries, "" when it carries none.
func bearerToken(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(AuthorizationHeader)
	if len(values) != 1 {
		return ""
	}
	token, _ := strings.CutPrefix(values[0], "Bearer ")
	return token
}

// check is checkHeader on the metadata of a call's context. The
// interceptors (unary, stream) run it again after earlyRefusal let the
// call in: a rotation in between is then seen.
func (a *tokenAuth) check(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	return a.checkHeader(md, method)
}

// checkHeader is check on a call's header metadata: nil for a call that
// needs no token (health, --insecure-no-auth) or carries the current one,
// else an Unauthenticated status (counted in the metrics by reason).
func (a *tokenAuth) checkHeader(md metadata.MD, method string) error {
	if a.none || strings.HasPrefix(method, healthPrefix) {
		return nil
	}
	values := md.Get(AuthorizationHeader)
	if len(values) != 1 {
		a.metrics.AuthRejected(metrics.AuthMissing)
		return status.Error(codes.Unauthenticated, "missing bearer token")
	}
	token, ok := strings.CutPrefix(values[0], "Bearer ")
	if !ok {
		a.metrics.AuthRejected(metrics.AuthMalformed)
		return status.Error(codes.Unauthenticated, "authorization is not a bearer token")
	}
	got := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(got[:], a.digest.Load()[:]) != 1 {
		a.metrics.AuthRejected(metrics.AuthInvalid)
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
}

// earlyRefusal refuses a call without the token before grpc opens a
// stream for it (a tap.ServerInHandle, see New). grpc runs it in the
// connection's reading goroutine as soon as the call's header list is
// decoded, before it registers the stream, gives it a receive buffer or a
// handler goroutine: a refused call's body is never read (its DATA frames
// are dropped as they arrive, only the connection's window is given back)
// and nothing of it is kept. The interceptors never see such a call, so
// the refusal is logged and counted here as requestLog and rpcMetrics
// would; a method name the daemon does not serve is logged as "unknown"
// (the name is the caller's, up to the header list limit).
type earlyRefusal struct {
	auth *tokenAuth
	log  *zap.Logger
	// known holds the served methods; New fills it after registering the
	// services, before anything is served, and nothing changes it after.
	known map[string]bool
}

// handle is the tap.ServerInHandle. It does no blocking work: a digest
// and a log line.
func (e *earlyRefusal) handle(ctx context.Context, info *tap.Info) (context.Context, error) {
	err := e.auth.checkHeader(info.Header, info.FullMethodName)
	health := strings.HasPrefix(info.FullMethodName, healthPrefix)
	if err == nil && !health {
		// The connection carried the token: its handshake timeout and
		// its budget of calls without one no longer apply (see
		// connLimiter).
		authenticated(ctx)
		return ctx, nil
	}
	if !callBeforeAuth(ctx) {
		// Closed: a client that sends calls without the token and
		// does not read the answers would make the daemon queue them.
		return ctx, status.Error(codes.ResourceExhausted, "too many calls without the token on one connection")
	}
	if err == nil {
		return ctx, nil
	}
	method := info.FullMethodName
	if !e.known[method] {
		method = "unknown"
	}
	e.auth.metrics.ObserveRPC(info.FullMethodName, uint32(codes.Unauthenticated), 0)
	e.log.Info("rpc", zap.String("method", method), zap.String("code", codes.Unauthenticated.String()), zap.Bool("before_stream", true))
	return ctx, err
}

func (a *tokenAuth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *tokenAuth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
