package main

// Service figures (`harness serve`): 100 concurrent runs against the
// scripted Responses server, each followed by an SSE client: how long a
// tool result takes from the runner to the client, the process's memory,
// and what the embedded run store (bbolt) costs per run.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
)

// timedStore measures the time spent in a store's calls.
type timedStore struct {
	store.Store
	mu    sync.Mutex
	spent time.Duration
	calls int
}

func (t *timedStore) time(start time.Time) {
	t.mu.Lock()
	t.spent += time.Since(start)
	t.calls++
	t.mu.Unlock()
}

func (t *timedStore) CreateRun(ctx context.Context, r *store.Run) error {
	defer t.time(time.Now())
	return t.Store.CreateRun(ctx, r)
}

func (t *timedStore) UpdateRun(ctx context.Context, r *store.Run) error {
	defer t.time(time.Now())
	return t.Store.UpdateRun(ctx, r)
}

func (t *timedStore) AppendEvents(ctx context.Context, id string, evs []store.Event) error {
	defer t.time(time.Now())
	return t.Store.AppendEvents(ctx, id, evs)
}

const benchToken = "bench-token-0123456789"

// modelClock numbers the scripted model's calls and records when the
// model received each call's output: the moment the runner had the tool
// result, whatever the service then does with its event. It is the
// reference of the "from the runner" latency, which does not depend on
// where the service stamps an event's time.
type modelClock struct {
	mu  sync.Mutex
	n   int
	saw map[string]time.Time
}

// nextCall returns a new call id.
func (m *modelClock) nextCall() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	return fmt.Sprintf("c%d", m.n)
}

// got records the first time the model received call id's output.
func (m *modelClock) got(id string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.saw[id]; !ok {
		m.saw[id] = at
	}
}

// since returns how long after the model received id's output at is.
func (m *modelClock) since(id string, at time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.saw[id]
	return at.Sub(t), ok
}

// benchServe runs n concurrent runs through a service on loopback.
func benchServe(ctx context.Context, agentd string, n int) ([]row, error) {
	dir, err := os.MkdirTemp("", "bench-serve-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	script := replay.NewServer()
	defer script.Close()
	clock := &modelClock{saw: map[string]time.Time{}}
	script.SetFallback(func(req *replay.Request) replay.Turn {
		outs := req.InputOfType("function_call_output")
		if len(outs) == 0 {
			return replay.Turn{Items: []replay.Item{replay.FunctionCall(clock.nextCall(), "exec_command", `{"cmd":"echo hello"}`)}}
		}
		if id, _ := outs[0]["call_id"].(string); id != "" {
			clock.got(id, time.Now())
		}
		return replay.Turn{Items: []replay.Item{replay.Message("done")}}
	})
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: "bench", BaseURL: script.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		return nil, err
	}
	prov, err := local.New(local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: agentd, Isolation: local.IsolationNone}, zap.NewNop())
	if err != nil {
		return nil, err
	}
	defer prov.Close()
	client := compute.NewClient(prov, compute.ClientOptions{Log: zap.NewNop()})
	dbPath := filepath.Join(dir, "runs.db")
	db, err := bolt.Open(dbPath)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	st := &timedStore{Store: db}
	tokens, err := auth.ParseTokens([]byte(benchToken+" bench\n"), "tokens")
	if err != nil {
		return nil, err
	}
	before, err := readRSS(os.Getpid())
	if err != nil {
		return nil, err
	}
	svc, err := service.New(ctx, service.Config{Store: st, Compute: client, Model: mdl, DefaultModel: "scripted", Auth: tokens, Log: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- service.Serve(sctx, ln, svc.Handler(), time.Second) }()
	defer func() {
		_ = svc.Shutdown(context.Background())
		stop()
		<-served
	}()
	url := "http://" + ln.Addr().String()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}

	var (
		mu        sync.Mutex
		latencies []time.Duration
		arrivals  []arrival
		peak      rss
		firstErr  error
	)
	sample := func() {
		if r, err := readRSS(os.Getpid()); err == nil {
			mu.Lock()
			if r.total > peak.total {
				peak = r
			}
			mu.Unlock()
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, arr, err := serveOneRun(ctx, hc, url)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			latencies = append(latencies, lat...)
			arrivals = append(arrivals, arr...)
		}()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
loop:
	for {
		select {
		case <-waited:
			break loop
		case <-tick.C:
			sample()
		}
	}
	tick.Stop()
	wall := time.Since(start)
	if firstErr != nil {
		return nil, firstErr
	}
	if len(latencies) == 0 {
		return nil, fmt.Errorf("no tool results were streamed")
	}
	fi, err := os.Stat(dbPath)
	if err != nil {
		return nil, err
	}
	p50, p99 := percentiles(latencies)
	// The model may get a call's output after the client got its result
	// (negative delays count as such); calls it never saw are left out.
	var fromRunner []time.Duration
	for _, a := range arrivals {
		if d, ok := clock.since(a.callID, a.at); ok {
			fromRunner = append(fromRunner, d)
		}
	}
	if len(fromRunner) == 0 {
		return nil, fmt.Errorf("the scripted model saw no tool output")
	}
	r50, r99 := percentiles(fromRunner)
	st.mu.Lock()
	spent, calls := st.spent, st.calls
	st.mu.Unlock()
	label := fmt.Sprintf("harness serve, %d concurrent runs (scripted model, exec_command in local sandboxes, one SSE client each)", n)
	return []row{
		{label + ": tool result to SSE client, from the event's time (the service got it from the runner), p50", us(p50), "", "", ""},
		{label + ": tool result to SSE client, from the event's time (the service got it from the runner), p99", us(p99), "", "", ""},
		{label + ": tool result to SSE client, from the model receiving the output (the runner had the result), p50", us(r50), "", "", ""},
		{label + ": tool result to SSE client, from the model receiving the output (the runner had the result), p99", us(r99), "", "", ""},
		{label + ": wall time for all runs", fmt.Sprintf("%.2f s", wall.Seconds()), "", "", ""},
		{label + ": process RSS growth at peak (service, clients and scripted model in one process)",
			mib((peak.total - before.total) * 1024), "", "", "bounded"},
		{label + ": bbolt store: bytes on disk per run", fmt.Sprintf("%.1f KiB", float64(fi.Size())/float64(n)/1024), "", "", ""},
		{label + ": bbolt store: time in store calls per run (fsync, group commit, incl. waiting for the writer)",
			fmt.Sprintf("%.1f ms (%d calls)", float64(spent.Microseconds())/1000/float64(n), calls/n), "", "", ""},
	}, nil
}

// arrival is when a client received the tool result of a call.
type arrival struct {
	callID string
	at     time.Time
}

// serveOneRun starts a run with a JSON POST, follows its SSE stream to the
// end, and returns the delay from each tool result's publication (the
// event's time) to its arrival at the client, and the arrivals.
func serveOneRun(ctx context.Context, hc *http.Client, url string) ([]time.Duration, []arrival, error) {
	body := `{"input": "say hello", "agent": {"name": "bench"}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/bulkhead.harness.v1.RunService/StartRun", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	var started struct {
		Run struct {
			RunID string `json:"runId"`
		} `json:"run"`
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(b, &started); err != nil || resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("start run: %d %s", resp.StatusCode, b)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/runs/"+started.Run.RunID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err = hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var out []time.Duration
	var arr []arrival
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && name == "tool_result":
			now := time.Now()
			var ev struct {
				Time       time.Time `json:"time"`
				ToolResult struct {
					CallID string `json:"callId"`
				} `json:"toolResult"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				return nil, nil, err
			}
			out = append(out, now.Sub(ev.Time))
			arr = append(arr, arrival{ev.ToolResult.CallID, now})
		case strings.HasPrefix(line, "data: ") && name == "run_failed":
			return nil, nil, fmt.Errorf("run failed: %s", line)
		}
	}
	return out, arr, sc.Err()
}
