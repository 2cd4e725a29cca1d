package server

import (
	"context"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// requestLog logs every call's method, code and duration — never payloads,
// paths, environment or output.
func requestLog(log *zap.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	record := func(method string, start time.Time, err error) {
		code := status.Code(err)
		fields := []zap.Field{zap.String("method", method), zap.String("code", code.String()), zap.Duration("duration", time.Since(start))}
		switch code {
		case codes.OK, codes.Canceled:
			log.Debug("rpc", fields...)
		case codes.Internal, codes.Unknown, codes.DataLoss:
			log.Error("rpc", fields...)
		default:
			log.Info("rpc", fields...)
		}
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		record(info.FullMethod, start, err)
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		record(info.FullMethod, start, err)
		return err
	}
	return unary, stream
}

// recovery turns a panic in a handler into an Internal error (and a log line
// with the stack) instead of killing the daemon and every process it runs.
func recovery(log *zap.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	recovered := func(method string, p any) error {
		log.Error("panic in handler", zap.String("method", method), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		return status.Errorf(codes.Internal, "internal error in %s", method)
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = recovered(info.FullMethod, p)
			}
		}()
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = recovered(info.FullMethod, p)
			}
		}()
		return handler(srv, ss)
	}
	return unary, stream
}

// drainGate refuses new work once shutdown began. Health, Info and reads of
// existing processes stay open so clients can still collect final output.
type drainGate struct{ draining atomic.Bool }

func (g *drainGate) refuses(method string) bool {
	if !g.draining.Load() {
		return false
	}
	for _, m := range []string{"/Start", "/Exec", "/WriteFile", "/ApplyPatch", "/Restore", "/MakeDir", "/Remove", "/Rename"} {
		if strings.HasSuffix(method, m) {
			return true
		}
	}
	return false
}

func (g *drainGate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if g.refuses(info.FullMethod) {
		return nil, status.Error(codes.Unavailable, "sandbox-agentd is shutting down")
	}
	return handler(ctx, req)
}

func (g *drainGate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if g.refuses(info.FullMethod) {
		return status.Error(codes.Unavailable, "sandbox-agentd is shutting down")
	}
	return handler(srv, ss)
}
