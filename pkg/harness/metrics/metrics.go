// Package metrics gives the harness Prometheus metrics (client_golang):
// runs, model requests and tokens, tool calls, and sandboxes. A Harness
// implements harness.RunObserver (set it as RunConfig.Observer) and
// compute.Observer (set it as compute.ClientOptions.Observer), and counts
// the sandboxes of the compute clients it is told to watch.
//
// Wiring, in a service or an application embedding the harness:
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.New(reg)
//	client := compute.NewClient(provider, compute.ClientOptions{Observer: m, ...})
//	m.WatchSandboxes(client)
//	res, err := runner.Run(ctx, agent, input, harness.RunConfig{Observer: m, Sandbox: &harness.SandboxConfig{Client: client}})
//	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
//
// Add collectors.NewGoCollector() and collectors.NewProcessCollector(...)
// to reg for the process's own metrics. The endpoint needs no secrets but
// says what runs: serve it on a private address or behind the service's
// authentication.
//
// # Metrics
//
//	bulkhead_harness_runs{state}                                         gauge      runs by state: "running" (counted here); pending, waiting_approval, checkpointed, succeeded, failed, canceled set by the service (SetRuns, service.Config.Runs)
//	bulkhead_harness_runs_finished_total{outcome}                        counter    runs that ended for good: completed, max_turns, cancelled, timed_out, failed (a run paused for approval and resumed counts once)
//	bulkhead_harness_run_interruptions_total                             counter    runs (or resumptions) that stopped to wait for an approval
//	bulkhead_harness_run_duration_seconds{outcome}                       histogram  one run (or resumption) from start to end
//	bulkhead_harness_model_request_duration_seconds{model,outcome}       histogram  one model request, retries included; outcome ok or error
//	bulkhead_harness_model_tokens_total{model,type}                      counter    tokens from the Responses usage; type input or output
//	bulkhead_harness_tool_calls_total{tool,outcome}                      counter    ok, error, failed, rejected, unknown_tool
//	bulkhead_harness_tool_call_duration_seconds{tool}                    histogram  tools that ran
//	bulkhead_harness_sandbox_operation_duration_seconds{provider,operation,outcome}  histogram  create, resume, start, delete; outcome ok or error
//	bulkhead_harness_sandboxes{provider,state}                           gauge      sandboxes the watched clients' providers manage: running or stopped (listed at scrape time)
//	bulkhead_harness_sandbox_list_errors_total{provider}                 counter    scrapes whose listing of a provider failed
//
// Label values are names chosen by the application (agents' tools, model
// names, providers) or fixed sets; a tool name the model made up is
// recorded as tool="unknown", so the model cannot grow the label set.
// Nothing from prompts, inputs, outputs or errors' messages becomes a
// label.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
)

// Namespace prefixes every metric of the package.
const Namespace = "bulkhead_harness"

// UnknownTool is the tool label of calls to tools the agent does not have.
const UnknownTool = "unknown"

// StateRunning is the runs gauge's state for runs in progress, which the
// Harness counts itself.
const StateRunning = "running"

// DefaultListTimeout bounds a watched client's List at scrape time.
const DefaultListTimeout = 5 * time.Second

// Buckets of the duration histograms, in seconds.
var (
	// RunBuckets: a run takes seconds to an hour.
	RunBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600}
	// ModelBuckets: a model request takes 100 ms to minutes.
	ModelBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}
	// ToolBuckets: a tool call takes milliseconds to many minutes.
	ToolBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900}
	// SandboxBuckets: creating a sandbox takes 10 ms (local) to minutes (a pod pulling an image).
	SandboxBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// Harness holds the harness's metrics. It is safe for concurrent use.
type Harness struct {
	runs         *prometheus.GaugeVec
	finished     *prometheus.CounterVec
	interrupted  prometheus.Counter
	runDuration  *prometheus.HistogramVec
	modelLatency *prometheus.HistogramVec
	tokens       *prometheus.CounterVec
	toolCalls    *prometheus.CounterVec
	toolDuration *prometheus.HistogramVec
	sandboxOps   *prometheus.HistogramVec
	sandboxes    *sandboxCollector
}

// Harness implements both observer interfaces.
var (
	_ harness.RunObserver = (*Harness)(nil)
	_ compute.Observer    = (*Harness)(nil)
)

// New makes the metrics and registers them with reg.
func New(reg prometheus.Registerer) (*Harness, error) {
	h := &Harness{
		runs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "runs",
			Help: "Runs by state: running (in this process), and states the service reports."}, []string{"state"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "runs_finished_total",
			Help: "Runs that ended for good, by outcome; a run that waited for an approval and was resumed counts once, when it ends."}, []string{"outcome"}),
		interrupted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "run_interruptions_total",
			Help: "Runs (or resumptions) that stopped to wait for an approval: not finished, they go on when resumed."}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "run_duration_seconds",
			Help: "Duration of a run (or resumption), by outcome.", Buckets: RunBuckets}, []string{"outcome"}),
		modelLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "model_request_duration_seconds",
			Help: "Duration of a model request, retries included, by requested model and outcome.", Buckets: ModelBuckets}, []string{"model", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "model_tokens_total",
			Help: "Tokens used by model requests (the Responses usage), by requested model and type (input, output)."}, []string{"model", "type"}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "tool_calls_total",
			Help: "Tool calls by tool and outcome."}, []string{"tool", "outcome"}),
		toolDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "tool_call_duration_seconds",
			Help: "Duration of tool calls that ran, by tool.", Buckets: ToolBuckets}, []string{"tool"}),
		sandboxOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "sandbox_operation_duration_seconds",
			Help: "Duration of sandbox operations (create, resume, start, delete), by provider and outcome.", Buckets: SandboxBuckets},
			[]string{"provider", "operation", "outcome"}),
		sandboxes: &sandboxCollector{timeout: DefaultListTimeout, desc: prometheus.NewDesc(Namespace+"_sandboxes",
			"Sandboxes the watched providers manage (listed at scrape time), by provider and state (running, stopped).",
			[]string{"provider", "state"}, nil),
			listErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "sandbox_list_errors_total",
				Help: "Scrapes whose listing of a watched provider's sandboxes failed (those scrapes leave the provider out of bulkhead_harness_sandboxes)."},
				[]string{"provider"})},
	}
	for _, c := range []prometheus.Collector{h.runs, h.finished, h.interrupted, h.runDuration, h.modelLatency, h.tokens, h.toolCalls, h.toolDuration, h.sandboxOps, h.sandboxes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register harness metrics: %w", err)
		}
	}
	h.runs.WithLabelValues(StateRunning).Set(0) // present from the first scrape
	return h, nil
}

// RunStarted implements harness.RunObserver.
func (h *Harness) RunStarted(_ context.Context, _ harness.RunInfo) {
	h.runs.WithLabelValues(StateRunning).Inc()
}

// RunEnded implements harness.RunObserver.
func (h *Harness) RunEnded(_ context.Context, _ harness.RunInfo, outcome harness.RunOutcome, d time.Duration) {
	h.runs.WithLabelValues(StateRunning).Dec()
	if outcome == harness.OutcomeInterrupted {
		// Not an end: the run goes on when resumed, and counts when it ends.
		h.interrupted.Inc()
	} else {
		h.finished.WithLabelValues(string(outcome)).Inc()
	}
	h.runDuration.WithLabelValues(string(outcome)).Observe(d.Seconds())
}

// SetRuns sets the runs gauge for a state other than StateRunning (which
// the Harness counts itself): for example the service's runs waiting for
// an approval, which live in its store rather than in a runner.
func (h *Harness) SetRuns(state string, n int) error {
	if state == StateRunning {
		return errors.New("metrics: the running state is counted by the runs' observer")
	}
	h.runs.WithLabelValues(state).Set(float64(n))
	return nil
}

// ModelCalled implements harness.RunObserver.
func (h *Harness) ModelCalled(_ context.Context, c harness.ModelCallInfo) {
	h.modelLatency.WithLabelValues(c.Model, outcome(c.Err)).Observe(c.Duration.Seconds())
	if c.Usage.InputTokens > 0 {
		h.tokens.WithLabelValues(c.Model, "input").Add(float64(c.Usage.InputTokens))
	}
	if c.Usage.OutputTokens > 0 {
		h.tokens.WithLabelValues(c.Model, "output").Add(float64(c.Usage.OutputTokens))
	}
}

// ToolCalled implements harness.RunObserver.
func (h *Harness) ToolCalled(_ context.Context, c harness.ToolCallInfo) {
	tool := c.Tool
	if c.Outcome == harness.ToolUnknown {
		tool = UnknownTool
	}
	h.toolCalls.WithLabelValues(tool, string(c.Outcome)).Inc()
	switch c.Outcome {
	case harness.ToolOK, harness.ToolError, harness.ToolFailed:
		h.toolDuration.WithLabelValues(tool).Observe(c.Duration.Seconds())
	}
}

// SandboxOperation implements compute.Observer.
func (h *Harness) SandboxOperation(provider, operation string, d time.Duration, err error) {
	h.sandboxOps.WithLabelValues(provider, operation, outcome(err)).Observe(d.Seconds())
}

// WatchSandboxes adds c's provider to the sandboxes gauge: at every scrape
// the Harness lists its sandboxes (compute.Client.List, bounded by
// DefaultListTimeout) and counts them by state. A provider whose listing
// fails is left out of that scrape and counted in
// bulkhead_harness_sandbox_list_errors_total.
func (h *Harness) WatchSandboxes(c *compute.Client) {
	h.sandboxes.mu.Lock()
	defer h.sandboxes.mu.Unlock()
	h.sandboxes.clients = append(h.sandboxes.clients, c)
}

func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// sandboxCollector lists the watched clients' sandboxes when scraped.
type sandboxCollector struct {
	desc       *prometheus.Desc
	listErrors *prometheus.CounterVec
	timeout    time.Duration
	mu         sync.Mutex
	clients    []*compute.Client
}

func (s *sandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.desc
	s.listErrors.Describe(ch)
}

func (s *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	clients := append([]*compute.Client(nil), s.clients...)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	type counts struct{ running, stopped int }
	by := map[string]*counts{} // clients of the same provider add up
	var order []string
	for _, c := range clients {
		infos, err := c.List(ctx)
		if err != nil {
			s.listErrors.WithLabelValues(c.Provider()).Inc()
			continue
		}
		n := by[c.Provider()]
		if n == nil {
			n = &counts{}
			by[c.Provider()] = n
			order = append(order, c.Provider())
		}
		for _, i := range infos {
			if i.Running {
				n.running++
			} else {
				n.stopped++
			}
		}
	}
	for _, p := range order {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(by[p].running), p, "running")
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(by[p].stopped), p, "stopped")
	}
	s.listErrors.Collect(ch)
}
