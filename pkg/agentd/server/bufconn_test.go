package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// bufServer serves srv on an in-memory listener.
func bufServer(t *testing.T, srv *Server) *bufconn.Listener {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.GRPC.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.GRPC.Stop()
		<-served
	})
	return lis
}

func bufDialer(lis *bufconn.Listener) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
}

// bufClient dials lis through agentclient (token as per-RPC credentials).
func bufClient(t *testing.T, lis *bufconn.Listener, token string) *agentclient.Client {
	t.Helper()
	c, err := agentclient.Dial(agentclient.Options{Address: "passthrough:///bufnet", Token: token, DialOptions: []grpc.DialOption{bufDialer(lis)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newBufDaemon runs a real daemon behind New on a bufconn listener.
func newBufDaemon(t *testing.T) (*bufconn.Listener, string) {
	t.Helper()
	cfg := agentd.DefaultConfig()
	cfg.WorkspaceRoot = filepath.Join(t.TempDir(), "ws")
	cfg.ReapAll = false
	log := zap.NewNop()
	d, err := agentd.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(d, []byte(testToken), false, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufServer(t, srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
	})
	return lis, cfg.WorkspaceRoot
}

// staticToken is a per-RPC credential for a hand-made connection.
type staticToken string

func (s staticToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	k, v := agentclient.BearerMetadata(string(s))
	return map[string]string{k: v}, nil
}
func (staticToken) RequireTransportSecurity() bool { return false }

func TestBufconnExec(t *testing.T) {
	lis, ws := newBufDaemon(t)
	c := bufClient(t, lis, testToken)
	ctx := ctxT(t)

	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.WorkspaceRoot != ws {
		t.Fatalf("info %v", info)
	}
	var streamed int
	var stdout, stderr strings.Builder
	res, err := c.Exec(ctx, agentclient.ProcessSpec{Command: "pwd; echo to-err >&2; cat; exit 3"}, agentclient.ExecOptions{Stdin: []byte("from stdin\n")},
		func(msg *agentclient.ExecEvent) error {
			streamed++
			for _, ch := range msg.Chunks {
				if ch.Stream == agentclient.StreamStderr {
					stderr.Write(ch.Data)
				} else {
					stdout.Write(ch.Data)
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if stdout.String() != ws+"\nfrom stdin\n" || stderr.String() != "to-err\n" || res.Exit.ExitCode != 3 {
		t.Fatalf("stdout %q stderr %q exit %v", stdout.String(), stderr.String(), res.Exit)
	}
	if len(res.Stdout) != 0 || len(res.Stderr) != 0 {
		t.Fatal("with a callback, Exec must not also keep the output")
	}
	if res.Process.ProcessID == "" || streamed < 2 {
		t.Fatalf("process %v, %d messages", res.Process, streamed)
	}
	// A start failure is a specific error over bufconn too.
	_, err = c.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"true"}, Cwd: "../outside"}, agentclient.ExecOptions{}, nil)
	if !errors.Is(err, errkind.ErrPathEscape) {
		t.Fatalf("exec with an escaping cwd: %v", err)
	}

	// A file round trip over the in-memory transport.
	data := pseudoRandomBytes(1<<20+3, 3)
	if _, err := c.WriteFile(ctx, "buf.bin", agentclient.WriteFileOptions{}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, _, err := readBytes(ctx, c, "buf.bin", agentclient.ReadFileOptions{})
	if err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("round trip: %d bytes, %v", len(got), err)
	}

	// Without the token nothing runs.
	bad := bufClient(t, lis, "")
	if _, err := bad.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"touch", filepath.Join(ws, "pwned")}}, agentclient.ExecOptions{}, nil); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("exec without token: %v", err)
	}
	assertMissing(t, filepath.Join(ws, "pwned"))

	// agentclient.New over a connection the caller set up.
	conn, err := grpc.NewClient("passthrough:///bufnet", bufDialer(lis), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(staticToken(testToken)))
	if err != nil {
		t.Fatal(err)
	}
	own := agentclient.New(conn)
	defer own.Close()
	res, err = own.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"echo", "own conn"}}, agentclient.ExecOptions{}, nil)
	if err != nil || string(res.Stdout) != "own conn\n" {
		t.Fatalf("agentclient.New: %v %v", res, err)
	}
}

// TestHandlerPanicIsRecovered serves a server whose handlers panic (it has
// no daemon behind it: every service dereferences a nil *agentd.Daemon) and
// checks each panic becomes Internal, is logged, and the server keeps
// serving.
func TestHandlerPanicIsRecovered(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	srv, err := New(nil, []byte(testToken), false, nil, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	lis := bufServer(t, srv)
	c := bufClient(t, lis, testToken)
	ctx := ctxT(t)

	for i := range 3 { // again and again: the server survives each one
		_, err := c.Info(ctx)
		if !errors.Is(err, errkind.ErrInternal) {
			t.Fatalf("round %d: unary panic: want Internal, got %v", i, err)
		}
		if !strings.Contains(err.Error(), "internal error in /bulkhead.agentd.v1.SystemService/Info") {
			t.Fatalf("round %d: message %q", i, err)
		}
		// A server stream (ReadFile) and a client stream (WriteFile).
		_, _, err = readBytes(ctx, c, "x", agentclient.ReadFileOptions{})
		if !errors.Is(err, errkind.ErrInternal) {
			t.Fatalf("round %d: server-stream panic: want ErrInternal, got %v", i, err)
		}
		_, err = c.WriteFile(ctx, "x", agentclient.WriteFileOptions{}, strings.NewReader("data"))
		if !errors.Is(err, errkind.ErrInternal) {
			t.Fatalf("round %d: client-stream panic: want ErrInternal, got %v", i, err)
		}
	}
	// Still serving: health answers, and authentication still comes first.
	if err := c.Health(ctx); err != nil {
		t.Fatalf("health after panics: %v", err)
	}
	if _, err := bufClient(t, lis, "not-the-token-at-all").Info(ctx); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("unauthenticated call to a panicking handler: %v", err)
	}

	panics := logs.FilterMessage("panic in handler").All()
	if len(panics) != 9 {
		t.Fatalf("%d panic log entries, want 9", len(panics))
	}
	methods := map[string]int{}
	for _, e := range panics {
		f := e.ContextMap()
		if e.Level != zapcore.ErrorLevel || f["stack"] == nil || f["panic"] == nil {
			t.Fatalf("panic log entry %v %v", e.Level, f)
		}
		m, _ := f["method"].(string)
		methods[m]++
	}
	for _, m := range []string{"/bulkhead.agentd.v1.SystemService/Info", "/bulkhead.agentd.v1.FileService/ReadFile", "/bulkhead.agentd.v1.FileService/WriteFile"} {
		if methods[m] != 3 {
			t.Fatalf("panic log entries by method %v; want 3 for %s", methods, m)
		}
	}
}

// TestRecoveryInterceptors drives the interceptor functions directly.
func TestRecoveryInterceptors(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	unary, stream := recovery(zap.New(core))

	resp, err := unary(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/svc/Boom"}, func(context.Context, any) (any, error) {
		panic("boom")
	})
	if resp != nil || status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "/svc/Boom") {
		t.Fatalf("unary panic: %v %v", resp, err)
	}
	var nilMap map[string]int
	err = stream(nil, fakeServerStream{}, &grpc.StreamServerInfo{FullMethod: "/svc/Stream"}, func(any, grpc.ServerStream) error {
		nilMap["x"] = 1 // a runtime panic
		return nil
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("stream panic: %v", err)
	}
	// Without a panic, results pass through untouched.
	want := status.Error(codes.NotFound, "nope")
	resp, err = unary(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/svc/Ok"}, func(context.Context, any) (any, error) {
		return "fine", want
	})
	if resp != "fine" || err != want {
		t.Fatalf("pass-through: %v %v", resp, err)
	}
	if err := stream(nil, fakeServerStream{}, &grpc.StreamServerInfo{FullMethod: "/svc/Ok"}, func(any, grpc.ServerStream) error { return nil }); err != nil {
		t.Fatalf("stream pass-through: %v", err)
	}
	if n := logs.FilterMessage("panic in handler").Len(); n != 2 {
		t.Fatalf("%d panic log entries, want 2", n)
	}
	// The panic value goes to the log, never to the client.
	if _, err := unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/svc/Secret"}, func(context.Context, any) (any, error) {
		panic("sk-secret-in-panic")
	}); strings.Contains(err.Error(), "sk-secret") {
		t.Fatalf("the panic value reached the client: %v", err)
	}
}

type fakeServerStream struct{ grpc.ServerStream }

func (fakeServerStream) Context() context.Context { return context.Background() }
