package server

import (
	"context"
	"strings"

	"google.golang.org/grpc"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// infoMethod is SystemService.Info, which a harness polls to learn how
// long the sandbox has been idle: it must not count as activity itself.
var infoMethod = "/" + agentdv1.SystemService_ServiceDesc.ServiceName + "/Info"

// idleMethod reports whether a call is no activity of the sandbox: Info
// and health checks.
func idleMethod(method string) bool {
	return method == infoMethod || strings.HasPrefix(method, healthPrefix)
}

// activityInterceptors touch the daemon's activity clock at the start and
// the end of every call that counts (they run after authentication, so a
// refused call does not), and at every message of a stream: a long
// transfer or a followed process stays active while it moves. A nil clock
// (a test's server without a daemon) makes them pass calls through.
func activityInterceptors(c *activity.Clock) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c == nil || idleMethod(info.FullMethod) {
			return handler(ctx, req)
		}
		c.Touch()
		defer c.Touch()
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if c == nil || idleMethod(info.FullMethod) {
			return handler(srv, ss)
		}
		c.Touch()
		defer c.Touch()
		return handler(srv, &touchingStream{ServerStream: ss, c: c})
	}
	return unary, stream
}

// touchingStream touches the activity clock at each message.
type touchingStream struct {
	grpc.ServerStream
	c *activity.Clock
}

func (s *touchingStream) SendMsg(m any) error {
	s.c.Touch()
	return s.ServerStream.SendMsg(m)
}

func (s *touchingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m) // after: the wait for a message is no activity
	if err == nil {
		s.c.Touch()
	}
	return err
}
