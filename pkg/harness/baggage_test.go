package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// TestNoBaggageOrTraceContextReachesTheDaemon runs an agent whose context
// carries baggage and a trace, with the global propagator sending both and
// the compute client tracing its gRPC calls, and reads the HTTP/2 headers
// on the wire to the daemon: the calls arrive (with their token) but no
// traceparent, tracestate or baggage header, and no baggage value, does.
func TestNoBaggageOrTraceContextReachesTheDaemon(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	d := agentdtest.Start(t, nil)
	tap := newHeaderTap(t, d.Socket)
	prov := &tapProvider{socket: tap.socket}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	client := compute.NewClient(prov, compute.ClientOptions{TracerProvider: tp})

	const secret = "tenant-secret-7f3a"
	member, err := baggage.NewMember("tenant", secret)
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(ctxT(t), bag)
	ctx, parent := tp.Tracer("test").Start(ctx, "application request")

	_, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "write", `{}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("done")}})
	write := tool.Func{Def: model.FunctionTool("write", "write", []byte(`{"type":"object"}`), false),
		Fn: func(ctx context.Context, tc tool.Context, _ string) (tool.Result, error) {
			if baggage.FromContext(ctx).Member("tenant").Value() != secret {
				t.Error("the tool's context lost the application's baggage (the test proves nothing)")
			}
			if _, err := tc.Agent.WriteFile(ctx, "out.txt", compute.WriteFileOptions{}, strings.NewReader("x")); err != nil {
				return tool.Result{}, err
			}
			return tool.Result{Output: "ok"}, nil
		}}
	r := &Runner{Model: m, ModelName: "test-model", TracerProvider: tp}
	if _, err := r.Run(ctx, &Agent{Name: "bag", Tools: []tool.Tool{write}, Capabilities: nil},
		"go", RunConfig{Sandbox: &SandboxConfig{Client: client}}); err != nil {
		t.Fatal(err)
	}
	parent.End()

	fields := tap.fields()
	var paths []string
	for _, f := range fields {
		if f.Name == ":path" {
			paths = append(paths, f.Value)
		}
		switch strings.ToLower(f.Name) {
		case "traceparent", "tracestate", "baggage", "grpc-trace-bin":
			t.Errorf("the daemon received %s: %q", f.Name, f.Value)
		}
		if strings.Contains(f.Value, secret) {
			t.Errorf("the daemon received the baggage value in %s", f.Name)
		}
	}
	if !contains(paths, "/bulkhead.agentd.v1.FileService/WriteFile") {
		t.Fatalf("the tap saw no WriteFile call (paths %v): the test proves nothing", paths)
	}
	// The calls were traced on the harness side: the RPC client spans exist.
	rpc := 0
	for _, s := range exp.GetSpans() {
		if strings.HasPrefix(s.Name, "bulkhead.agentd.v1.") {
			rpc++
		}
	}
	if rpc == 0 {
		t.Error("no gRPC client span: the compute client was not tracing, so the test proves nothing")
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// headerTap is a unix-socket proxy in front of a daemon that decodes the
// HTTP/2 headers the client sends.
type headerTap struct {
	socket string
	mu     sync.Mutex
	seen   []hpack.HeaderField
}

func newHeaderTap(t *testing.T, upstream string) *headerTap {
	tap := &headerTap{socket: filepath.Join(t.TempDir(), "tap.sock")}
	l, err := net.Listen("unix", tap.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go tap.relay(t, c, upstream)
		}
	}()
	return tap
}

func (tap *headerTap) relay(t *testing.T, c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.Dial("unix", upstream)
	if err != nil {
		t.Errorf("tap: %v", err)
		return
	}
	defer u.Close()
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.Copy(u, io.TeeReader(c, pw))
		pw.Close()
		u.Close()
	}()
	go func() {
		_, _ = io.Copy(c, u)
		c.Close()
	}()
	tap.decode(t, pr)
	_, _ = io.Copy(io.Discard, pr)
}

// decode reads the client's side of an HTTP/2 connection and records every
// header field.
func (tap *headerTap) decode(t *testing.T, r io.Reader) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || !bytes.Equal(preface, []byte(http2.ClientPreface)) {
		return
	}
	fr := http2.NewFramer(nil, r)
	fr.SetMaxReadFrameSize(1 << 24)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) && !strings.Contains(err.Error(), "closed") {
				t.Logf("tap: %v", err)
			}
			return
		}
		if mh, ok := f.(*http2.MetaHeadersFrame); ok {
			tap.mu.Lock()
			tap.seen = append(tap.seen, mh.Fields...)
			tap.mu.Unlock()
		}
	}
}

func (tap *headerTap) fields() []hpack.HeaderField {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return append([]hpack.HeaderField(nil), tap.seen...)
}

// tapProvider's sandboxes are the daemon behind the tap, dialed as real
// providers dial (with the tracer provider compute.RPCTracing finds in the
// context).
type tapProvider struct{ socket string }

func (p *tapProvider) Name() string { return "tap" }

func (p *tapProvider) Launch(ctx context.Context, _ compute.LaunchSpec) (compute.Sandbox, error) {
	c, err := agentclient.Dial(agentclient.Options{Address: "unix://" + p.socket, Token: agentdtest.Token, TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return nil, err
	}
	return &tapSandbox{c: c}, nil
}

func (p *tapProvider) Reattach(context.Context, compute.LaunchSpec, json.RawMessage) (compute.Sandbox, error) {
	return nil, compute.ErrNotFound
}
func (p *tapProvider) Destroy(context.Context, json.RawMessage) error      { return nil }
func (p *tapProvider) List(context.Context) ([]compute.SandboxInfo, error) { return nil, nil }

type tapSandbox struct{ c *agentclient.Client }

func (s *tapSandbox) Agent() *agentclient.Client      { return s.c }
func (s *tapSandbox) State() (json.RawMessage, error) { return json.RawMessage(`{}`), nil }
func (s *tapSandbox) WorkspaceKept() bool             { return false }
func (s *tapSandbox) Touch(context.Context) error     { return nil }
func (s *tapSandbox) Shutdown(context.Context) error  { return nil }
func (s *tapSandbox) Close() error                    { return s.c.Close() }
