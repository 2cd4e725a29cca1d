package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/process"
)

// MetricsPath is where --metrics-listen serves the metrics.
const MetricsPath = "/metrics"

// rpcMetrics times every call and records it by method and status code.
func rpcMetrics(ms *metrics.Set) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		ms.ObserveRPC(info.FullMethod, uint32(status.Code(err)), time.Since(start))
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		ms.ObserveRPC(info.FullMethod, uint32(status.Code(err)), time.Since(start))
		return err
	}
	return unary, stream
}

// countOutput adds the chunks' bytes to the output counters.
func countOutput(ms *metrics.Set, chunks []process.Chunk) {
	if ms == nil {
		return
	}
	for _, c := range chunks {
		s := metrics.Stdout
		switch c.Stream {
		case process.Stderr:
			s = metrics.Stderr
		case process.PTY:
			s = metrics.PTY
		}
		ms.OutputBytes(s, len(c.Data))
	}
}

// parseMetricsListen accepts tcp://host:port, unix:///path.sock or a bare
// host:port.
func parseMetricsListen(s string) (network, address string, err error) {
	if !strings.Contains(s, "://") {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return "", "", fmt.Errorf("--metrics-listen %q: %w", s, err)
		}
		return "tcp", s, nil
	}
	network, address, err = parseListen(s)
	if err != nil {
		return "", "", fmt.Errorf("--metrics-listen: %w", err)
	}
	return network, address, nil
}

// serveMetrics serves ms at MetricsPath on address until the returned stop
// is called; a failure of the listener after it started is sent to errc.
// The endpoint is unauthenticated (it carries no secrets, see package
// metrics): operators bind it to a loopback or private address.
//
// It answers with metrics.Serve, a minimal HTTP/1.x responder, rather than
// net/http's server: linking http.Server made the daemon 0.7 MB larger and
// its idle RSS 0.25 MiB higher even with metrics off (see package metrics).
func serveMetrics(address string, ms *metrics.Set, errc chan<- error, log *zap.Logger) (stop func(), err error) {
	network, addr, err := parseMetricsListen(address)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		if err := removeStaleSocket(addr); err != nil {
			return nil, err
		}
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", address, err)
	}
	log.Info("serving metrics (unauthenticated)", zap.String("address", l.Addr().Network()+"://"+l.Addr().String()+MetricsPath))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ms.Serve(l, MetricsPath); err != nil && !errors.Is(err, net.ErrClosed) {
			errc <- fmt.Errorf("metrics: %w", err)
		}
	}()
	return func() {
		l.Close()
		<-done
		if network == "unix" {
			_ = os.Remove(addr)
		}
	}, nil
}
