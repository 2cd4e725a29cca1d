package cli

import (
	"strconv"
	"strings"
	"testing"
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
	s := startServe(t, "echo approved", "Done.", "sk-test-metrics")
	post, waitFor, scrape := s.post, s.waitFor, s.scrape
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
	s.shutdown()
}
