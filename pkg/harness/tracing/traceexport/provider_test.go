package traceexport_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/tracing"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tracing/traceexport"
)

func TestNewProviderNone(t *testing.T) {
	for _, exp := range []string{"", "none", " None "} {
		tp, shutdown, err := traceexport.NewProvider(context.Background(), traceexport.Config{Exporter: exp})
		if err != nil {
			t.Fatal(err)
		}
		_, sp := tracing.New(tp).StartRun(context.Background(), "a")
		if sp.SpanContext().IsValid() {
			t.Errorf("%q: spans are recorded", exp)
		}
		sp.End()
		if err := shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewProviderStdout(t *testing.T) {
	var buf bytes.Buffer
	tp, shutdown, err := traceexport.NewProvider(context.Background(), traceexport.Config{Exporter: "stdout", Writer: &buf, ServiceName: "svc-test"})
	if err != nil {
		t.Fatal(err)
	}
	_, sp := tracing.New(tp).StartToolCall(context.Background(), "exec_command", "call_9")
	tracing.EndToolCall(sp, false, nil)
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("second shutdown: %v", err)
	}
	out := buf.String()
	for _, want := range []string{"execute_tool exec_command", "bulkhead.tool.call_id", "call_9", "svc-test"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout export lacks %q:\n%s", want, out)
		}
	}
}

func TestNewProviderOTLP(t *testing.T) {
	var mu sync.Mutex
	var paths, auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		auth = append(auth, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	for _, c := range []struct {
		cfg  traceexport.Config
		path string
	}{
		{traceexport.Config{Endpoint: srv.URL}, "/v1/traces"},
		{traceexport.Config{Endpoint: srv.URL + "/custom/traces"}, "/custom/traces"},
		{traceexport.Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Insecure: true}, "/v1/traces"},
	} {
		paths, auth = nil, nil
		c.cfg.Exporter = "otlp"
		c.cfg.Headers = map[string]string{"X-Api-Key": "collector-key"}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		tp, shutdown, err := traceexport.NewProvider(ctx, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, sp := tracing.New(tp).StartRun(ctx, "a")
		tracing.EndRun(sp, tracing.RunResult{}, nil)
		if err := shutdown(ctx); err != nil {
			t.Fatalf("%+v: shutdown: %v", c.cfg, err)
		}
		cancel()
		mu.Lock()
		if len(paths) != 1 || paths[0] != c.path || auth[0] != "collector-key" {
			t.Errorf("%s: exports to %v with keys %v, want one to %s", c.cfg.Endpoint, paths, auth, c.path)
		}
		mu.Unlock()
	}
}

func TestNewProviderErrors(t *testing.T) {
	for _, cfg := range []traceexport.Config{
		{Exporter: "jaeger"},
		{Exporter: "otlp", Endpoint: "ftp://collector:21"},
		{Exporter: "otlp", Endpoint: "http://"},
	} {
		if _, _, err := traceexport.NewProvider(context.Background(), cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
