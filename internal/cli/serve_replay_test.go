package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// call calls a method of a service of the API with a JSON body, as curl
// would, and returns the status and the decoded answer.
func (s *served) call(service, method, body string) (int, map[string]any) {
	s.t.Helper()
	req, _ := http.NewRequestWithContext(s.ctx, http.MethodPost, s.url+"/bulkhead.harness.v1."+service+"/"+method, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		s.t.Fatalf("%s: %d %q", method, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

// events reads a run's whole event log as Server-Sent Events (the stream
// ends once the run has).
func (s *served) events(id string) string {
	s.t.Helper()
	req, _ := http.NewRequestWithContext(s.ctx, http.MethodGet, s.url+"/v1/runs/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("events of %s: %d %s", id, resp.StatusCode, b)
	}
	return string(b)
}

// TestServeReplay: `harness serve --replay FILE` needs no model key, and
// every run replays the recording from its first turn, its tool calls
// really executed in the run's local sandbox.
func TestServeReplay(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "replay.json")
	if err := os.WriteFile(rec, []byte(`{"description": "one command, then the answer", "turns": [
  {"items": [{"type": "message", "text": "Checking."},
             {"type": "function_call", "call_id": "call_1", "name": "exec_command",
              "arguments": "{\"cmd\": \"echo replayed-$((6*7)) > proof.txt && cat proof.txt\"}"}]},
  {"items": [{"type": "message", "text": "Replayed."}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OPENAI_API_KEY", "")
	s := launchServe(t, "--replay", rec)
	if out := s.errb.String(); !strings.Contains(out, "[REPLAY]") || strings.Contains(out, "runs are off") {
		t.Errorf("stderr: %s", out)
	}
	// Two runs side by side, then a third: each replays from the start.
	ids := make([]string, 3)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			ids[i] = s.post("StartRun", `{"input": "prove it", "agent": {"name": "a"}}`)["run"].(map[string]any)["runId"].(string)
		})
	}
	wg.Wait()
	ids[2] = s.post("StartRun", `{"input": "again"}`)["run"].(map[string]any)["runId"].(string)
	for _, id := range ids {
		if run := s.waitFor(id, "RUN_STATUS_SUCCEEDED"); run["finalOutput"] != "Replayed." || run["turns"] != float64(2) {
			t.Errorf("run %s: %v", id, run)
		}
		// The command ran in the sandbox: its shell did the arithmetic.
		if evs := s.events(id); !strings.Contains(evs, "event: tool_result") || !strings.Contains(evs, `replayed-42\n`) {
			t.Errorf("run %s's events have no tool result of the command:\n%s", id, evs)
		}
	}
	s.shutdown()
}

// TestServeWithoutKey: without OPENAI_API_KEY (and no --replay) the
// service starts, says once that runs are off and why, answers StartRun
// and ResumeRun with FailedPrecondition saying so, and serves the rest.
func TestServeWithoutKey(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	s := launchServe(t)
	if out := s.errb.String(); strings.Count(out, "runs are off") != 1 || !strings.Contains(out, "OPENAI_API_KEY is not set") ||
		!strings.Contains(out, "--replay FILE") {
		t.Errorf("stderr does not say once that runs are off:\n%s", out)
	}
	for _, c := range []struct{ method, body string }{
		{"StartRun", `{"input": "hello"}`},
		{"ResumeRun", `{"runId": "run-0123456789abcdef01234567"}`},
	} {
		code, out := s.call("RunService", c.method, c.body)
		msg, _ := out["message"].(string)
		if code != http.StatusBadRequest || out["code"] != "failed_precondition" || !strings.Contains(msg, "no model key") ||
			!strings.Contains(msg, "OPENAI_API_KEY") || !strings.Contains(msg, "--replay") {
			t.Errorf("%s without a model: %d %v", c.method, code, out)
		}
	}
	if code, out := s.call("RunService", "ListRuns", `{}`); code != http.StatusOK {
		t.Errorf("ListRuns: %d %v", code, out)
	}
	if code, out := s.call("SandboxService", "ListSandboxes", `{}`); code != http.StatusOK {
		t.Errorf("ListSandboxes: %d %v", code, out)
	}
	if out := s.shutdown(); strings.Count(out, "runs are off") != 1 {
		t.Errorf("stderr:\n%s", out)
	}
}
