package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/metrics"
	hmodel "github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testModel(t *testing.T, turns ...replay.Turn) hmodel.Model {
	t.Helper()
	srv := replay.NewServer(turns...)
	t.Cleanup(srv.Close)
	m, err := hmodel.NewOpenAI(hmodel.Config{Model: "test-model", APIKey: "sk-test", BaseURL: srv.URL(), Retry: hmodel.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var schema = []byte(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`)

// tools: write_note writes into the sandbox through the daemon; boom
// calls during (when set), then returns an error result.
func tools(during func()) []tool.Tool {
	return []tool.Tool{
		tool.Func{Def: hmodel.FunctionTool("write_note", "Write a note.", schema, true),
			Fn: func(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
				if _, err := call.Agent.WriteFile(ctx, "note.txt", compute.WriteFileOptions{}, strings.NewReader(input)); err != nil {
					return tool.Result{}, err
				}
				return tool.Result{Output: "saved"}, nil
			}},
		tool.Func{Def: hmodel.FunctionTool("boom", "Fail.", schema, true),
			Fn: func(context.Context, tool.Context, string) (tool.Result, error) {
				if during != nil {
					during()
				}
				return tool.Result{Output: "it broke", IsError: true}, nil
			}},
	}
}

// scrape reads the registry over real HTTP, as Prometheus would, and
// parses the text.
func scrape(t *testing.T, reg *prometheus.Registry) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, body)
	}
	return fams, string(body)
}

func value(fams map[string]*dto.MetricFamily, name string, kv ...string) float64 {
	for _, m := range fams[name].GetMetric() {
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == kv[i] && l.GetValue() == kv[i+1]
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// TestRunMetrics runs agents against the scripted Responses server with a
// real (in-process) daemon behind the compute client, then scrapes the
// registry: runs by outcome, model latency and tokens, tool calls by tool
// and outcome, sandbox operations and sandboxes.
func TestRunMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg); err == nil {
		t.Error("registering twice succeeded")
	}
	prov := agentdtest.NewProvider(t, nil)
	client := compute.NewClient(prov, compute.ClientOptions{Log: zaptest.NewLogger(t), Observer: m})
	m.WatchSandboxes(client)

	// Run 1: three tool calls (ok, error result, a tool the model made
	// up), then the final answer.
	mod := testModel(t,
		replay.Turn{Items: []replay.Item{
			replay.FunctionCall("call_1", "write_note", `{"text":"hi"}`),
			replay.FunctionCall("call_2", "boom", `{"text":"x"}`),
			replay.FunctionCall("call_3", "made_up_tool_secret", `{}`),
		}, Usage: replay.Usage{InputTokens: 100, OutputTokens: 20}},
		replay.Turn{Items: []replay.Item{replay.Message("done")}, Usage: replay.Usage{InputTokens: 150, OutputTokens: 5}},
		// Run 2: stops for approval, then is resumed and the call rejected.
		replay.Turn{Items: []replay.Item{replay.FunctionCall("call_4", "write_note", `{"text":"again"}`)}, Usage: replay.Usage{InputTokens: 10, OutputTokens: 2}},
		replay.Turn{Items: []replay.Item{replay.Message("ok, not writing")}, Usage: replay.Usage{InputTokens: 12, OutputTokens: 3}},
		// Run 3: the model fails.
		replay.Fail(500),
	)
	r := &harness.Runner{Model: mod, ModelName: "test-model", Log: zaptest.NewLogger(t)}
	sandbox := &harness.SandboxConfig{Client: client, Manifest: &manifest.Manifest{}}
	runningDuring := -1.0
	a := &harness.Agent{Name: "writer", Tools: tools(func() {
		fams, _ := scrape(t, reg)
		runningDuring = value(fams, "bulkhead_harness_runs", "state", "running")
	}), Capabilities: []capability.Capability{}}
	if _, err := r.Run(ctxT(t), a, "write", harness.RunConfig{Sandbox: sandbox, Observer: m}); err != nil {
		t.Fatal(err)
	}

	if runningDuring != 1 {
		t.Errorf("runs{running} during the run = %v, want 1", runningDuring)
	}

	b := &harness.Agent{Name: "careful", Tools: tools(nil), Capabilities: []capability.Capability{},
		Approvals: map[string]harness.ApprovalPolicy{"write_note": harness.AlwaysApprove()}}
	res, err := r.Run(ctxT(t), b, "write again", harness.RunConfig{Sandbox: sandbox, Observer: m})
	if err != nil || len(res.Interruptions) != 1 {
		t.Fatalf("approval run: %v, %v", res, err)
	}
	if err := res.State.Reject("call_4", "no"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resume(ctxT(t), b, res.State, harness.RunConfig{Sandbox: sandbox, Observer: m}); err != nil {
		t.Fatal(err)
	}
	c := &harness.Agent{Name: "failing", Capabilities: []capability.Capability{}}
	if _, err := r.Run(ctxT(t), c, "fail", harness.RunConfig{Observer: m}); err == nil {
		t.Fatal("the failing model's run succeeded")
	}
	if err := m.SetRuns("awaiting_approval", 2); err != nil {
		t.Fatal(err)
	}
	if err := m.SetRuns(metrics.StateRunning, 2); err == nil {
		t.Error("SetRuns(running) succeeded")
	}

	fams, body := scrape(t, reg)
	if strings.Contains(body, "made_up_tool_secret") {
		t.Errorf("a tool name the model made up became a label:\n%s", body)
	}
	types := map[string]dto.MetricType{
		"bulkhead_harness_runs":                               dto.MetricType_GAUGE,
		"bulkhead_harness_runs_finished_total":                dto.MetricType_COUNTER,
		"bulkhead_harness_run_interruptions_total":            dto.MetricType_COUNTER,
		"bulkhead_harness_run_duration_seconds":               dto.MetricType_HISTOGRAM,
		"bulkhead_harness_model_request_duration_seconds":     dto.MetricType_HISTOGRAM,
		"bulkhead_harness_model_tokens_total":                 dto.MetricType_COUNTER,
		"bulkhead_harness_tool_calls_total":                   dto.MetricType_COUNTER,
		"bulkhead_harness_tool_call_duration_seconds":         dto.MetricType_HISTOGRAM,
		"bulkhead_harness_sandbox_operation_duration_seconds": dto.MetricType_HISTOGRAM,
		"bulkhead_harness_sandboxes":                          dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		if f := fams[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want type %v", name, f, typ)
		}
	}
	checks := []struct {
		what      string
		got, want float64
	}{
		{"runs running", value(fams, "bulkhead_harness_runs", "state", "running"), 0},
		{"runs awaiting approval", value(fams, "bulkhead_harness_runs", "state", "awaiting_approval"), 2},
		{"completed runs", value(fams, "bulkhead_harness_runs_finished_total", "outcome", "completed"), 2},
		// The run that waited for an approval counts once, as completed, and its pause as an interruption.
		{"interrupted runs counted as finished (-1: no such series)", value(fams, "bulkhead_harness_runs_finished_total", "outcome", "interrupted"), -1},
		{"interruptions", value(fams, "bulkhead_harness_run_interruptions_total"), 1},
		{"failed runs", value(fams, "bulkhead_harness_runs_finished_total", "outcome", "failed"), 1},
		{"completed run durations", value(fams, "bulkhead_harness_run_duration_seconds", "outcome", "completed"), 2},
		{"model requests ok", value(fams, "bulkhead_harness_model_request_duration_seconds", "model", "test-model", "outcome", "ok"), 4},
		{"model requests failed", value(fams, "bulkhead_harness_model_request_duration_seconds", "model", "test-model", "outcome", "error"), 1},
		{"input tokens", value(fams, "bulkhead_harness_model_tokens_total", "model", "test-model", "type", "input"), 272},
		{"output tokens", value(fams, "bulkhead_harness_model_tokens_total", "model", "test-model", "type", "output"), 30},
		{"write_note ok", value(fams, "bulkhead_harness_tool_calls_total", "tool", "write_note", "outcome", "ok"), 1},
		{"write_note rejected", value(fams, "bulkhead_harness_tool_calls_total", "tool", "write_note", "outcome", "rejected"), 1},
		{"boom error", value(fams, "bulkhead_harness_tool_calls_total", "tool", "boom", "outcome", "error"), 1},
		{"unknown tool", value(fams, "bulkhead_harness_tool_calls_total", "tool", metrics.UnknownTool, "outcome", "unknown_tool"), 1},
		{"write_note durations", value(fams, "bulkhead_harness_tool_call_duration_seconds", "tool", "write_note"), 1},
		{"sandbox creates", value(fams, "bulkhead_harness_sandbox_operation_duration_seconds", "provider", prov.Name(), "operation", "create", "outcome", "ok"), 2},
		{"sandbox resumes", value(fams, "bulkhead_harness_sandbox_operation_duration_seconds", "provider", prov.Name(), "operation", "resume", "outcome", "ok"), 1},
		{"sandbox starts", value(fams, "bulkhead_harness_sandbox_operation_duration_seconds", "provider", prov.Name(), "operation", "start", "outcome", "ok"), 3},
		{"sandbox deletes", value(fams, "bulkhead_harness_sandbox_operation_duration_seconds", "provider", prov.Name(), "operation", "delete", "outcome", "ok"), 2},
		{"sandboxes running", value(fams, "bulkhead_harness_sandboxes", "provider", prov.Name(), "state", "running"), float64(prov.Live())},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}
