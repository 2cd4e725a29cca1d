package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/metrics"
)

// AuthorizationHeader is the metadata key carrying "Bearer <token>".
const AuthorizationHeader = "authorization"

// healthPrefix is the only service callable without a token, so that probes
// (grpc_health_probe, Kubernetes) work.
const healthPrefix = "/grpc.health.v1.Health/"

// tokenAuth checks the bearer token of every call except health checks.
// The comparison is constant-time over SHA-256 digests, so neither the
// token's content nor its length leaks through timing.
type tokenAuth struct {
	digest  [sha256.Size]byte
	none    bool         // --insecure-no-auth
	metrics *metrics.Set // counts refused tokens; nil: off
}

func newTokenAuth(token []byte, insecureNoAuth bool) *tokenAuth {
	return &tokenAuth{digest: sha256.Sum256(token), none: insecureNoAuth}
}

func (a *tokenAuth) check(ctx context.Context, method string) error {
	if a.none || strings.HasPrefix(method, healthPrefix) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
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
	if subtle.ConstantTimeCompare(got[:], a.digest[:]) != 1 {
		a.metrics.AuthRejected(metrics.AuthInvalid)
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
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
