package server

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

const testToken = "0123456789abcdef0123456789abcdef"

// testDaemon is a server on a real unix socket with its own workspace.
type testDaemon struct {
	srv       *Server
	socket    string
	workspace string
	client    *agentclient.Client
}

func newTestDaemon(t testing.TB, mutate func(*agentd.Config)) *testDaemon {
	t.Helper()
	dir := t.TempDir()
	cfg := agentd.DefaultConfig()
	cfg.WorkspaceRoot = filepath.Join(dir, "ws")
	cfg.ReapAll = false // tests share the process with go test; reap only our children
	if mutate != nil {
		mutate(&cfg)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
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
	client, err := agentclient.Dial(agentclient.Options{Address: "unix://" + socket, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	td := &testDaemon{srv: srv, socket: socket, workspace: cfg.WorkspaceRoot, client: client}
	t.Cleanup(func() {
		client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return td
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawConn dials the socket with no credentials at all.
func rawConn(t *testing.T, socket string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// authConn dials the socket with the test token: a hand-made connection
// for speaking to the services below agentclient (raw streams).
func authConn(t *testing.T, socket string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(staticToken(testToken)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestAuth(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	conn := rawConn(t, td.socket)
	sys := agentdv1.NewSystemServiceClient(conn)
	proc := agentdv1.NewProcessServiceClient(conn)

	cases := []struct {
		name   string
		header string
	}{
		{"no token", ""},
		{"wrong token", "Bearer " + strings.Repeat("x", len(testToken))},
		{"wrong length", "Bearer short"},
		{"not bearer", "Basic " + testToken},
		{"token with suffix", "Bearer " + testToken + "x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cctx := ctx
			if c.header != "" {
				cctx = metadata.AppendToOutgoingContext(ctx, "authorization", c.header)
			}
			if _, err := sys.Info(cctx, &agentdv1.InfoRequest{}); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("Info: want Unauthenticated, got %v", err)
			}
			// Streams are guarded too, and nothing runs.
			stream, err := proc.Exec(cctx, &agentdv1.ExecRequest{Spec: &agentdv1.ProcessSpec{Argv: []string{"/bin/sh", "-c", "touch " + filepath.Join(td.workspace, "pwned")}}})
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("Exec: want Unauthenticated, got %v", err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(td.workspace, "pwned")); !os.IsNotExist(err) {
		t.Fatal("an unauthenticated Exec ran")
	}
	// Health needs no token.
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without token: %v %v", resp, err)
	}
	// The right token works, and the client maps errors.
	info, err := td.client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.WorkspaceRoot != td.workspace || len(info.Features) == 0 {
		t.Fatalf("unexpected info %v", info)
	}
	bad, err := agentclient.Dial(agentclient.Options{Address: "unix://" + td.socket, Token: "wrong-token-wrong-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.Info(ctx); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("client with wrong token: want ErrUnauthenticated, got %v", err)
	}
}

func TestReflectionNeedsToken(t *testing.T) {
	td := newTestDaemon(t, nil)
	conn := rawConn(t, td.socket)
	// Reflection is a stream; without a token it is refused like any other call.
	stream, err := conn.NewStream(ctxT(t), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
	if err == nil {
		err = stream.CloseSend()
		if err == nil {
			err = stream.RecvMsg(new(healthpb.HealthCheckResponse))
		}
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("reflection without token: want Unauthenticated, got %v", err)
	}
}

func TestDrainRefusesNewWork(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	td.srv.drain.draining.Store(true)
	// A raw call: agentclient would retry Unavailable (a restarting daemon
	// comes back) until its budget ends.
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
	_, err := agentdv1.NewProcessServiceClient(rawConn(t, td.socket)).Start(authed, &agentdv1.StartRequest{Spec: &agentdv1.ProcessSpec{Argv: []string{"true"}}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Start while draining: want Unavailable, got %v", err)
	}
	if _, err := td.client.Info(ctx); err != nil {
		t.Fatalf("Info while draining should still work: %v", err)
	}
}

func TestListenRefusesNonSocket(t *testing.T) {
	p := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(p, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenAll([]string{"unix://" + p}); err == nil {
		t.Fatal("listening over a regular file should fail")
	}
	if b, _ := os.ReadFile(p); string(b) != "keep me" {
		t.Fatal("the file was touched")
	}
	// A stale socket is replaced.
	s := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", s)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ls, err := listenAll([]string{"unix://" + s})
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	fi, _ := os.Stat(s)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	ls[0].Close()
}
