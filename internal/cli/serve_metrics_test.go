package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// sample returns the value of the sample of the metric name whose labels
// include every k="v" of labels, from a Prometheus text exposition (-1
// when there is none).
func sample(t *testing.T, exposition, name string, labels ...string) float64 {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			if rest, ok = strings.CutPrefix(line, name+" "); ok {
				rest = "} " + rest
			}
		}
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && strings.Contains(","+set+",", ","+labels[i]+`="`+labels[i+1]+`",`)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return v
	}
	return -1
}

// TestServeMetricsAcrossApproval runs `harness serve` with a run that waits
// for an approval and then completes, and checks /metrics at both points:
// the runs gauge by state (set by the service from its store) and the
// sandbox create latency of the local provider (the compute client's
// observer).
func TestServeMetricsAcrossApproval(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("tok-metrics-0123456789 acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := replay.NewServer()
	defer script.Close()
	script.SetFallback(func(req *replay.Request) replay.Turn {
		if len(req.InputOfType("function_call_output")) == 0 {
			return replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", `{"cmd": "echo approved"}`)}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message("Done.")}}
	})
	t.Setenv("OPENAI_API_KEY", "sk-test-metrics")
	t.Setenv("OPENAI_BASE_URL", script.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	var errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Execute(sctx, []string{"--state-dir", state, "--agentd", bin, "--isolation", "none", "serve",
			"--listen", "127.0.0.1:0", "--tokens-file", tokens, "--model", "scripted", "--sandbox-retention", "0"},
			Streams{In: strings.NewReader(""), Out: io.Discard, Err: &errb})
	}()
	addr := regexp.MustCompile(`serving on (http://\S+)`)
	var url string
	for url == "" {
		if m := addr.FindStringSubmatch(errb.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, errb.String())
		case <-ctx.Done():
			t.Fatalf("serve did not start: %s", errb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	post := func(method, body string) map[string]any {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/bulkhead.harness.v1.RunService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok-metrics-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", method, resp.StatusCode, b)
		}
		return out
	}
	waitFor := func(id, status string) {
		t.Helper()
		for {
			run := post("GetRun", `{"runId": "`+id+`"}`)["run"].(map[string]any)
			if run["status"] == status {
				return
			}
			if run["status"] == "RUN_STATUS_FAILED" {
				t.Fatalf("run failed: %v", run["error"])
			}
			select {
			case <-ctx.Done():
				t.Fatalf("run never reached %s: %v", status, run)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	scrape := func() string {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	checkRuns := func(when, text string, want map[string]float64) {
		t.Helper()
		for st, n := range want {
			if got := sample(t, text, "bulkhead_harness_runs", "state", st); got != n {
				t.Errorf("%s: bulkhead_harness_runs{state=%q} = %v, want %v", when, st, got, n)
			}
		}
	}

	// Before any run every state is present at zero.
	checkRuns("at start", scrape(), map[string]float64{"pending": 0, "running": 0, "waiting_approval": 0,
		"checkpointed": 0, "succeeded": 0, "failed": 0, "canceled": 0})

	started := post("StartRun", `{"input": "run it", "agent": {"name": "a"}, "approvals": {"requireApproval": ["exec_command"]}}`)
	id := started["run"].(map[string]any)["runId"].(string)
	waitFor(id, "RUN_STATUS_WAITING_APPROVAL")
	text := scrape()
	checkRuns("waiting", text, map[string]float64{"pending": 0, "running": 0, "waiting_approval": 1, "succeeded": 0})
	create := `bulkhead_harness_sandbox_operation_duration_seconds_count`
	if got := sample(t, text, create, "provider", "local", "operation", "create", "outcome", "ok"); got != 1 {
		t.Errorf("waiting: %s{provider=local,operation=create,outcome=ok} = %v, want 1\n%s", create, got, text)
	}

	run := post("GetRun", `{"runId": "`+id+`"}`)["run"].(map[string]any)
	pending, _ := run["pendingApprovals"].([]any)
	if len(pending) != 1 {
		t.Fatalf("pending approvals: %v", run)
	}
	callID := pending[0].(map[string]any)["callId"].(string)
	post("ApproveToolCall", `{"runId": "`+id+`", "callId": "`+callID+`", "approved": true}`)
	waitFor(id, "RUN_STATUS_SUCCEEDED")
	text = scrape()
	checkRuns("succeeded", text, map[string]float64{"pending": 0, "running": 0, "waiting_approval": 0, "succeeded": 1, "failed": 0})
	// The sandbox was made once: the approval continued in the same one.
	if got := sample(t, text, create, "provider", "local", "operation", "create", "outcome", "ok"); got != 1 {
		t.Errorf("succeeded: %s{provider=local,operation=create,outcome=ok} = %v, want 1", create, got)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("serve exit %d: %s", code, errb.String())
	}
}
