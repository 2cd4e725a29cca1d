package server

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// TestMaxConcurrentStreams checks the per-connection stream limit: 1024
// for the default process limit and anything up to 256 processes, four
// streams per process above, without overflow for absurd limits.
func TestMaxConcurrentStreams(t *testing.T) {
	for _, c := range []struct {
		procs int
		want  uint32
	}{
		{-1, 1024},
		{0, 1024},
		{agentd.DefaultConfig().MaxProcesses, 1024},
		{256, 1024},
		{257, 1028},
		{10000, 40000},
		{1 << 30, math.MaxUint32},
		{math.MaxInt>>1 + 1, math.MaxUint32}, // 1<<62 on 64 bits: 4x that wraps a uint64
		{math.MaxInt, math.MaxUint32},
	} {
		if got := maxConcurrentStreams(c.procs); got != c.want {
			t.Errorf("maxConcurrentStreams(%d) = %d, want %d", c.procs, got, c.want)
		}
	}
}

// TestRefusedBeforeItsStream checks that a call without the token is
// refused before grpc opens a stream for it: a client-streaming WriteFile
// that sends its header and 1 MiB of data gets Unauthenticated, writes
// nothing, and is logged by the early refusal alone (no interceptor, hence
// no handler, ever saw it); a method the daemon does not serve is refused
// the same way (Unauthenticated, not Unimplemented, and logged as
// "unknown"); health needs no token; and a call with the token still goes
// through the interceptors.
func TestRefusedBeforeItsStream(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	dir := t.TempDir()
	cfg := agentd.DefaultConfig()
	cfg.WorkspaceRoot = filepath.Join(dir, "ws")
	cfg.ReapAll = false
	d, err := agentd.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(d, []byte(testToken), false, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "agentd.sock")
	l, err := listenAll([]string{"unix://" + socket})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.GRPC.Serve(l[0]) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	ctx := ctxT(t)
	conn := rawConn(t, socket)

	stream, err := agentdv1.NewFileServiceClient(conn).WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Sends may fail once the refusal arrived (io.EOF): CloseAndRecv has
	// the status.
	_ = stream.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Header{Header: &agentdv1.WriteFileHeader{Path: "pwned.txt"}}})
	_ = stream.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: bytes.Repeat([]byte{'x'}, 1<<20)}})
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("WriteFile without a token: %v, want Unauthenticated", err)
	}
	if _, err := os.Lstat(filepath.Join(cfg.WorkspaceRoot, "pwned.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused WriteFile left a file: %v", err)
	}
	err = conn.Invoke(ctx, "/bulkhead.agentd.v1.NoSuchService/Probe", &agentdv1.InfoRequest{}, &agentdv1.InfoResponse{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("an unknown method without a token: %v, want Unauthenticated", err)
	}
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v %v", resp, err)
	}
	authed := authConn(t, socket)
	if _, err := agentdv1.NewSystemServiceClient(authed).Info(ctx, &agentdv1.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Info with the token: %v", err)
	}

	type entry struct {
		method, code string
		early        bool
	}
	var got []entry
	for _, e := range logs.FilterMessage("rpc").All() {
		f := e.ContextMap()
		early, _ := f["before_stream"].(bool)
		method, _ := f["method"].(string)
		code, _ := f["code"].(string)
		got = append(got, entry{method, code, early})
	}
	want := []entry{
		{agentdv1.FileService_WriteFile_FullMethodName, "Unauthenticated", true},
		{"unknown", "Unauthenticated", true},
		{"/grpc.health.v1.Health/Check", "OK", false},
		{agentdv1.SystemService_Info_FullMethodName, "OK", false},
	}
	if len(got) != len(want) {
		t.Fatalf("rpc log entries %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rpc log entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
