package agentclient_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

func recorder() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	return rec, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
}

// With a TracerProvider every call has a client span, named by its method,
// under the caller's span; a failed call's span has the code, not the
// daemon's message (a rejected patch quotes the lines it searched for).
func TestTracerProviderSpans(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	rec, tp := recorder()
	c, err := agentclient.Dial(agentclient.Options{Address: "unix://" + d.Socket, Token: agentdtest.Token, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, parent := tp.Tracer("test").Start(ctx, "parent")
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	const secret = "TOPSECRET-file-line"
	if _, err := c.WriteFile(ctx, "notes.txt", agentclient.WriteFileOptions{}, strings.NewReader(secret+"\n")); err != nil {
		t.Fatal(err)
	}
	patch := "*** Begin Patch\n*** Update File: notes.txt\n@@\n-" + secret + "-not-there\n+replaced\n*** End Patch\n"
	_, err = c.ApplyPatch(ctx, patch, agentclient.ApplyPatchOptions{})
	if err == nil || !strings.Contains(err.Error(), secret) {
		t.Fatalf("the patch should fail quoting the searched lines (the test relies on it): %v", err)
	}
	if !errkind.Classified(err) {
		t.Fatalf("error mapping changed: %v", err)
	}
	parent.End()

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	for _, name := range []string{
		"bulkhead.agentd.v1.SystemService/Info",
		"bulkhead.agentd.v1.FileService/WriteFile",
		"bulkhead.agentd.v1.WorkspaceService/ApplyPatch",
	} {
		s, ok := byName[name]
		if !ok {
			t.Fatalf("no span %q among %v", name, names(rec.Ended()))
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: not a child of the caller's span", name)
		}
	}
	failed := byName["bulkhead.agentd.v1.WorkspaceService/ApplyPatch"]
	if failed.Status().Code != codes.Error {
		t.Errorf("failed call status = %v", failed.Status())
	}
	for _, s := range rec.Ended() {
		if strings.Contains(s.Status().Description, secret) {
			t.Errorf("span %s: status quotes the file: %q", s.Name(), s.Status().Description)
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), secret) || strings.Contains(kv.Value.String(), agentdtest.Token) {
				t.Errorf("span %s: attribute %s = %q", s.Name(), kv.Key, kv.Value.String())
			}
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), secret) {
					t.Errorf("span %s: event %s: %s = %q", s.Name(), ev.Name, kv.Key, kv.Value.String())
				}
			}
		}
	}
}

// Without a TracerProvider nothing is recorded, even with a global one.
func TestNoTracerProviderNoSpans(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	rec, tp := recorder()
	ctx, parent := tp.Tracer("test").Start(ctx, "parent")
	c, err := agentclient.Dial(agentclient.Options{Address: "unix://" + d.Socket, Token: agentdtest.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()
	if got := names(rec.Ended()); len(got) != 1 {
		t.Fatalf("spans = %v, want only the test's own", got)
	}
}

type infoServer struct {
	agentdv1.UnimplementedSystemServiceServer
}

func (infoServer) Info(context.Context, *agentdv1.InfoRequest) (*agentdv1.InfoResponse, error) {
	return &agentdv1.InfoResponse{}, nil
}

// The sandbox is untrusted: no trace context or baggage reaches it, even
// when the application installed a global propagator.
func TestNoContextPropagatedToTheDaemon(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	seen := make(chan metadata.MD, 1)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		select {
		case seen <- md:
		default:
		}
		return h(ctx, req)
	}))
	agentdv1.RegisterSystemServiceServer(srv, infoServer{})
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	rec, tp := recorder()
	c, err := agentclient.Dial(agentclient.Options{Address: "unix://" + sock, Token: "t", TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, parent := tp.Tracer("test").Start(testCtx(t), "parent")
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()
	md := <-seen
	for _, k := range []string{"traceparent", "tracestate", "baggage"} {
		if v := md.Get(k); len(v) > 0 {
			t.Errorf("the daemon received %s: %v", k, v)
		}
	}
	if len(rec.Ended()) != 2 {
		t.Errorf("spans = %v, want the call's and the test's", names(rec.Ended()))
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}
