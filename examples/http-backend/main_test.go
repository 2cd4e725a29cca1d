package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

// event is one Server-Sent Event as a client sees it.
type event struct {
	Name string
	Data map[string]any
}

// post sends a JSON body and returns the status and, for an event stream,
// its events (read to the end).
func post(t *testing.T, url, body string) (int, []event) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		return resp.StatusCode, nil
	}
	var events []event
	readEvents(t, resp.Body, func(e event) bool { events = append(events, e); return true })
	return resp.StatusCode, events
}

// readEvents calls fn with each event of an SSE stream until fn returns
// false or the stream ends.
func readEvents(t *testing.T, r io.Reader, fn func(event) bool) {
	t.Helper()
	var name string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var data map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data); err != nil {
				t.Errorf("event %s: %v", name, err)
				return
			}
			if !fn(event{name, data}) {
				return
			}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Error(err)
	}
}

// untilTurn starts a run and reads its stream until the first turn began
// (its sandbox exists by then); the rest of the stream is returned.
func untilTurn(t *testing.T, ctx context.Context, url, task string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/runs", strings.NewReader(`{"task": "`+task+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	started := false
	readEvents(t, resp.Body, func(e event) bool {
		started = e.Name == string(harness.EventTurnStarted)
		return !started
	})
	if !started {
		resp.Body.Close()
		t.Fatal("the run's stream ended before its first turn")
	}
	return resp
}

// eventually polls cond for a few seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// last returns the stream's last event, which says how the run ended.
func last(t *testing.T, events []event, want string) map[string]any {
	t.Helper()
	if len(events) == 0 || events[len(events)-1].Name != want {
		t.Fatalf("the stream does not end with %q: %v", want, events)
	}
	return events[len(events)-1].Data
}

// text joins the text deltas; results maps call ids to tool results.
func text(events []event) (string, map[string]string) {
	var b strings.Builder
	results := map[string]string{}
	for _, e := range events {
		switch e.Name {
		case string(harness.EventTextDelta):
			b.WriteString(e.Data["text"].(string))
		case string(harness.EventToolResult):
			call := e.Data["call"].(map[string]any)
			results[call["id"].(string)] = e.Data["result"].(map[string]any)["output"].(string)
		}
	}
	return b.String(), results
}

func TestBackend(t *testing.T) {
	dir, err := os.MkdirTemp("", "bh-http-test-") // short: unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Sandbox accounts of a root harness pass through to the workspaces.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}

	// The scripted model: three runs, one after the other.
	script := replay.NewServer(
		// Run 1: a listing (allowed), then a command that needs approval.
		replay.Turn{Items: []replay.Item{replay.Message("Let me look around."), replay.FunctionCall("c1", "exec_command", `{"cmd": "ls notes"}`)}},
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c2", "exec_command", `{"cmd": "echo hello > greeting.txt && cat greeting.txt"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("greeting.txt says hello.")}},
		// Run 2: a command the user rejects.
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c3", "exec_command", `{"cmd": "rm -rf notes"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("Understood: I left notes/ alone.")}},
		// Run 3: the client goes away while the model is thinking.
		replay.Turn{Items: []replay.Item{replay.Message("This will take a while.")}}.Stalled(2),
		// Run 4: waits for approval when the server shuts down, while run 5
		// is still thinking.
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c4", "exec_command", `{"cmd": "touch x"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("This will take a while too.")}}.Stalled(2),
	)
	t.Cleanup(script.Close)
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: "x", BaseURL: script.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	client, err := local.NewClient(local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone},
		compute.ClientOptions{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	app := NewApp(AppConfig{
		Runner: &harness.Runner{Model: mdl, Log: log},
		Client: client,
		Manifest: &manifest.Manifest{Entries: map[string]*manifest.Entry{
			"notes": {Type: manifest.TypeDir, Children: map[string]*manifest.Entry{"todo.md": {Type: manifest.TypeFile, Content: []byte("- say hello\n")}}},
		}},
		NewAgent: newAgent,
		Log:      log,
	})
	srv := httptest.NewServer(app.Handler())
	t.Cleanup(srv.Close)
	// On failure too, end the runs and delete their sandboxes (before
	// srv.Close, which waits for the streams).
	t.Cleanup(func() { _ = app.Shutdown(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sandboxes := func() int {
		infos, err := client.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(infos)
	}

	// Bad requests change nothing.
	if code, _ := post(t, srv.URL+"/runs", `{"task": ""}`); code != http.StatusBadRequest {
		t.Errorf("empty task: %d", code)
	}
	if code, _ := post(t, srv.URL+"/runs/run_nope/approvals", `{"decisions": [{"call_id": "c1", "approved": true}]}`); code != http.StatusNotFound {
		t.Errorf("unknown run: %d", code)
	}

	// Run 1 streams text, a tool call and its result, then stops for approval.
	code, events := post(t, srv.URL+"/runs", `{"task": "Say hello in a file."}`)
	if code != http.StatusOK || len(events) == 0 || events[0].Name != "run" {
		t.Fatalf("start: %d %v", code, events)
	}
	id := events[0].Data["run_id"].(string)
	approval := last(t, events, "approval_required")
	calls := approval["calls"].([]any)
	if len(calls) != 1 || calls[0].(map[string]any)["id"] != "c2" {
		t.Fatalf("pending calls: %v", calls)
	}
	txt, results := text(events)
	if txt != "Let me look around." || !strings.Contains(results["c1"], "todo.md") {
		t.Errorf("text %q, results %v", txt, results)
	}
	if n := sandboxes(); n != 1 {
		t.Errorf("%d sandboxes while run 1 waits, want 1", n)
	}
	// Approve: the rest of the run streams in the approval's response.
	code, events = post(t, srv.URL+"/runs/"+id+"/approvals", `{"decisions": [{"call_id": "c2", "approved": true}]}`)
	done := last(t, events, "done")
	if _, results := text(events); code != http.StatusOK || !strings.Contains(results["c2"], "hello") || done["final_output"] != "greeting.txt says hello." {
		t.Fatalf("approved: %d %v", code, events)
	}
	if code, _ := post(t, srv.URL+"/runs/"+id+"/approvals", `{"decisions": [{"call_id": "c2", "approved": true}]}`); code != http.StatusNotFound {
		t.Errorf("a finished run was resumed again: %d", code)
	}
	if n := sandboxes(); n != 0 {
		t.Errorf("%d sandboxes after run 1, want 0", n)
	}

	// Run 2: an unknown call id is refused and the run stays parked; the
	// rejection reaches the model.
	_, events = post(t, srv.URL+"/runs", `{"task": "Tidy up."}`)
	id = events[0].Data["run_id"].(string)
	last(t, events, "approval_required")
	if code, _ := post(t, srv.URL+"/runs/"+id+"/approvals", `{"decisions": [{"call_id": "nope", "approved": true}]}`); code != http.StatusBadRequest {
		t.Errorf("unknown call: %d", code)
	}
	_, events = post(t, srv.URL+"/runs/"+id+"/approvals", `{"decisions": [{"call_id": "c3", "approved": false, "message": "Keep the notes."}]}`)
	if done := last(t, events, "done"); done["final_output"] != "Understood: I left notes/ alone." {
		t.Errorf("rejected: %v", done)
	}
	if _, results := text(events); results["c3"] != "Keep the notes." {
		t.Errorf("the model saw %q for the rejected call", results["c3"])
	}
	if reqs := script.Requests(); !strings.Contains(string(reqs[len(reqs)-1].Raw), "Keep the notes.") {
		t.Errorf("the rejection did not reach the model")
	}

	// Run 3: the client goes away mid-run. The run is cancelled and the
	// runner deletes its sandbox.
	rctx, rcancel := context.WithCancel(ctx)
	resp := untilTurn(t, rctx, srv.URL, "Think hard.")
	if n := sandboxes(); n != 1 {
		t.Errorf("%d sandboxes while run 3 runs, want 1", n)
	}
	// Leave once the model call is under way (the scripted model stalls).
	eventually(t, "run 3 calls the model", func() bool { return script.Remaining() == 2 })
	rcancel()
	resp.Body.Close()
	eventually(t, "the sandbox of the abandoned run is deleted", func() bool { return sandboxes() == 0 })

	// Run 4 waits for approval and run 5 is running when the server shuts
	// down: run 5 is cancelled (its stream says so), both sandboxes are
	// deleted, and new runs are refused.
	_, events = post(t, srv.URL+"/runs", `{"task": "Touch x."}`)
	last(t, events, "approval_required")
	resp = untilTurn(t, ctx, srv.URL, "Think hard again.")
	defer resp.Body.Close()
	if n := sandboxes(); n != 2 {
		t.Errorf("%d sandboxes before shutdown, want 2", n)
	}
	eventually(t, "run 5 calls the model", func() bool { return script.Remaining() == 0 })
	if err := app.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := sandboxes(); n != 0 {
		t.Errorf("%d sandboxes after shutdown, want 0", n)
	}
	var rest []event
	readEvents(t, resp.Body, func(e event) bool { rest = append(rest, e); return true })
	if msg := last(t, rest, "error")["message"]; msg != "the server is shutting down; the run was cancelled" {
		t.Errorf("run 5 ended with %q", msg)
	}
	if code, _ := post(t, srv.URL+"/runs", `{"task": "More."}`); code != http.StatusServiceUnavailable {
		t.Errorf("a run started after shutdown: %d", code)
	}
	if err := script.Err(); err != nil {
		t.Error(err)
	}
}
