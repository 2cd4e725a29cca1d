package console_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/console"
)

// fakeService answers the JSON shapes of bulkhead.harness.v1 (Connect's
// JSON mapping: lowerCamelCase names, enums by name, timestamps as RFC
// 3339, bytes as base64) for the calls the console makes, plus the run
// event stream (SSE), file downloads and the terminal WebSocket. It holds
// two runs: run-1 waits for approval of call-1 and finishes once it is
// approved; run-2 finished, and a tool output of it carries markup.
type fakeService struct {
	token string

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every change
	runs      map[string]map[string]any
	events    map[string][]map[string]any
	downloads []string         // paths downloaded, with a valid token
	approvals []string         // "call-1=true" for each ApproveToolCall
	resumed   []int            // the after= of event streams that resumed
	starts    []map[string]any // StartRun requests that started a run
}

// xssOutput is a tool output that must show as text, never as markup.
const xssOutput = `<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"><b>bold?</b>`

func newFakeService(token string) *fakeService {
	f := &fakeService{token: token, changed: make(chan struct{}), runs: map[string]map[string]any{}, events: map[string][]map[string]any{}}
	created := time.Now().Add(-3 * time.Minute).UTC().Format(time.RFC3339Nano)
	f.runs["run-1"] = map[string]any{
		"runId": "run-1", "status": "RUN_STATUS_WAITING_APPROVAL", "agent": "coder", "model": "gpt-test",
		"input": "Fix the bug", "createTime": created, "updateTime": created, "turns": 1, "sandboxId": "sb-1",
		"usage":            map[string]any{"inputTokens": "120", "outputTokens": "30"},
		"pendingApprovals": []any{map[string]any{"callId": "call-1", "tool": "exec_command", "input": `{"cmd":"rm -rf build"}`, "agent": "coder"}},
	}
	f.runs["run-2"] = map[string]any{
		"runId": "run-2", "status": "RUN_STATUS_SUCCEEDED", "agent": "coder", "model": "gpt-test",
		"input": "<b>hello</b>", "createTime": created, "updateTime": created, "turns": 2, "sandboxId": "sb-2",
		"finalOutput": "done: <i>not italic</i>",
	}
	f.add("run-1", "turnStarted", map[string]any{"turn": 1})
	f.add("run-1", "modelText", map[string]any{"text": "Let me clean "})
	f.add("run-1", "modelText", map[string]any{"text": "the build."})
	f.add("run-1", "toolCall", map[string]any{"callId": "call-0", "tool": "exec_command", "input": `{"cmd":"ls"}`})
	f.add("run-1", "toolOutput", map[string]any{"callId": "call-0", "output": base64.StdEncoding.EncodeToString([]byte("build\nsrc\n"))})
	f.add("run-1", "toolResult", map[string]any{"callId": "call-0", "tool": "exec_command", "output": "build\nsrc\n"})
	f.add("run-1", "approvalRequested", map[string]any{"call": map[string]any{"callId": "call-1", "tool": "exec_command", "input": `{"cmd":"rm -rf build"}`}})
	f.add("run-2", "turnStarted", map[string]any{"turn": 1})
	f.add("run-2", "toolCall", map[string]any{"callId": "x-1", "tool": "exec_command", "input": `{"cmd":"cat page.html"}`})
	f.add("run-2", "toolOutput", map[string]any{"callId": "x-1", "output": base64.StdEncoding.EncodeToString([]byte(xssOutput))})
	f.add("run-2", "toolResult", map[string]any{"callId": "x-1", "tool": "exec_command", "output": xssOutput})
	f.add("run-2", "modelText", map[string]any{"text": "<script>window.__xss = 3</script>"})
	f.add("run-2", "runFinished", map[string]any{"finalOutput": "done: <i>not italic</i>", "turns": 2})
	return f
}

// add appends an event to a run (callers hold mu, or run before serving).
func (f *fakeService) add(runID, kind string, body map[string]any) {
	seq := len(f.events[runID]) + 1
	f.events[runID] = append(f.events[runID], map[string]any{
		"sequence": fmt.Sprint(seq), "runId": runID, "time": time.Now().UTC().Format(time.RFC3339Nano), "agent": "coder", kind: body,
	})
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeService) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(console.MountPath, console.Handler())
	rpc := func(name string, fn func(req map[string]any) (any, int, string)) {
		mux.HandleFunc("POST /bulkhead.harness.v1."+name, func(w http.ResponseWriter, r *http.Request) {
			if !f.authorized(w, r) {
				return
			}
			if ct := r.Header.Get("Content-Type"); ct != "application/json" {
				writeError(w, http.StatusUnsupportedMediaType, "unknown", "content type "+ct)
				return
			}
			var req map[string]any
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
				return
			}
			// Encoded under the lock: the answer holds the fake's maps.
			f.mu.Lock()
			resp, status, code := fn(req)
			body, err := json.Marshal(resp)
			f.mu.Unlock()
			if status != 0 {
				writeError(w, status, code, fmt.Sprint(resp))
				return
			}
			if err != nil {
				writeError(w, http.StatusInternalServerError, "internal", err.Error())
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		})
	}
	rpc("RunService/ListRuns", func(req map[string]any) (any, int, string) {
		runs := []any{}
		for _, id := range []string{"run-2", "run-1"} {
			if st, _ := req["status"].(string); st == "" || st == f.runs[id]["status"] {
				runs = append(runs, f.runs[id])
			}
		}
		return map[string]any{"runs": runs}, 0, ""
	})
	rpc("RunService/GetRun", func(req map[string]any) (any, int, string) {
		run, ok := f.runs[fmt.Sprint(req["runId"])]
		if !ok {
			return "run not found", http.StatusNotFound, "not_found"
		}
		return map[string]any{"run": run}, 0, ""
	})
	rpc("RunService/ApproveToolCall", func(req map[string]any) (any, int, string) {
		run, ok := f.runs[fmt.Sprint(req["runId"])]
		if !ok || req["callId"] != "call-1" || run["status"] != "RUN_STATUS_WAITING_APPROVAL" {
			return "no such pending call", http.StatusPreconditionFailed, "failed_precondition"
		}
		approved, _ := req["approved"].(bool)
		f.approvals = append(f.approvals, fmt.Sprintf("call-1=%v", approved))
		delete(run, "pendingApprovals")
		run["status"] = "RUN_STATUS_RUNNING"
		f.add("run-1", "approvalDecided", map[string]any{"callId": "call-1", "approved": approved})
		// The run goes on a moment later, as a real one would.
		go func() {
			time.Sleep(100 * time.Millisecond)
			f.mu.Lock()
			defer f.mu.Unlock()
			f.add("run-1", "toolCall", map[string]any{"callId": "call-1", "tool": "exec_command", "input": `{"cmd":"rm -rf build"}`})
			f.add("run-1", "toolResult", map[string]any{"callId": "call-1", "tool": "exec_command", "output": "removed"})
			f.add("run-1", "runFinished", map[string]any{"finalOutput": "Cleaned the build.", "turns": 2})
			run["status"] = "RUN_STATUS_SUCCEEDED"
			run["finalOutput"] = "Cleaned the build."
		}()
		return map[string]any{"run": run}, 0, ""
	})
	rpc("RunService/StartRun", func(req map[string]any) (any, int, string) {
		if in, _ := req["input"].(string); strings.TrimSpace(in) == "" {
			return "input: the run needs a task", http.StatusBadRequest, "invalid_argument"
		}
		if m, _ := req["manifest"].(string); strings.Contains(m, "local_dir") {
			return "manifest: host sources are not allowed here", http.StatusBadRequest, "invalid_argument"
		}
		f.starts = append(f.starts, req)
		id := fmt.Sprintf("run-new-%d", len(f.starts))
		agent, _ := req["agent"].(map[string]any)
		now := time.Now().UTC().Format(time.RFC3339Nano)
		f.runs[id] = map[string]any{"runId": id, "status": "RUN_STATUS_RUNNING", "agent": agent["name"], "model": agent["model"],
			"input": req["input"], "createTime": now, "updateTime": now}
		f.add(id, "turnStarted", map[string]any{"turn": 1})
		return map[string]any{"run": f.runs[id]}, 0, ""
	})
	rpc("SandboxService/ListSandboxes", func(map[string]any) (any, int, string) {
		now := time.Now().UTC()
		return map[string]any{"sandboxes": []any{
			map[string]any{"sandboxId": "sb-1", "runId": "run-1", "provider": "local", "status": "SANDBOX_STATUS_RUNNING",
				"createTime": now.Add(-3 * time.Minute).Format(time.RFC3339Nano)},
			map[string]any{"sandboxId": "sb-2", "runId": "run-2", "provider": "docker", "status": "SANDBOX_STATUS_STOPPED",
				"createTime": now.Add(-2 * time.Hour).Format(time.RFC3339Nano), "expireTime": now.Add(30 * time.Minute).Format(time.RFC3339Nano)},
		}}, 0, ""
	})
	rpc("SandboxService/ListSandboxDir", func(req map[string]any) (any, int, string) {
		if req["sandboxId"] != "sb-1" {
			return "sandbox not found", http.StatusNotFound, "not_found"
		}
		switch p, _ := req["path"].(string); p {
		case "":
			return map[string]any{"entries": []any{
				map[string]any{"name": "src", "path": "src", "type": "FILE_TYPE_DIRECTORY", "mode": 493},
				map[string]any{"name": "<b>odd name</b>.txt", "path": "<b>odd name</b>.txt", "type": "FILE_TYPE_FILE", "size": "3", "mode": 420},
			}}, 0, ""
		case "src":
			return map[string]any{"entries": []any{
				map[string]any{"name": "notes.txt", "path": "src/notes.txt", "type": "FILE_TYPE_FILE", "size": "12", "mode": 420,
					"modifyTime": time.Now().UTC().Format(time.RFC3339Nano)},
			}}, 0, ""
		default:
			return "no such directory", http.StatusNotFound, "not_found"
		}
	})
	mux.HandleFunc("GET /v1/runs/{id}/events", f.serveEvents)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if !f.authorized(w, r) {
			return
		}
		f.mu.Lock()
		f.downloads = append(f.downloads, r.PathValue("path"))
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte("hello notes\n"))
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminal", f.serveTerminal)
	return mux
}

func (f *fakeService) authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "bad token")
		return false
	}
	return true
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": msg})
}

// serveEvents replays a run's events after after_sequence as SSE, then
// follows it until it ends or the client goes.
func (f *fakeService) serveEvents(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(w, r) {
		return
	}
	id := r.PathValue("id")
	after := 0
	fmt.Sscan(r.URL.Query().Get("after"), &after)
	// run-2's first stream breaks after three events, as a dropped
	// connection would: the console must resume after the last it saw.
	cut := -1
	if id == "run-2" && after == 0 {
		cut = 3
	}
	if after > 0 {
		f.mu.Lock()
		f.resumed = append(f.resumed, after)
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl := w.(http.Flusher)
	fl.Flush()
	for {
		f.mu.Lock()
		evs := f.events[id][min(after, len(f.events[id])):]
		changed := f.changed
		f.mu.Unlock()
		for _, ev := range evs {
			if after == cut {
				fl.Flush()
				return
			}
			b, _ := json.Marshal(ev)
			after++
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", after, kindOf(ev), b)
			if _, end := ev["runFinished"]; end {
				fmt.Fprint(w, "event: end\ndata: {}\n\n")
				fl.Flush()
				return
			}
		}
		fl.Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// serveTerminal echoes what is typed, prefixed; "exit" ends it with
// exit code 3. It checks the credential in the bearer subprotocol and the
// size in the query.
func (f *fakeService) serveTerminal(w http.ResponseWriter, r *http.Request) {
	want := "bearer." + f.token
	ok := false
	for _, p := range strings.Split(r.Header.Get("Sec-WebSocket-Protocol"), ",") {
		ok = ok || strings.TrimSpace(p) == want
	}
	if !ok {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "bad token")
		return
	}
	if q := r.URL.Query(); q.Get("cols") == "" || q.Get("cols") == "0" || q.Get("rows") == "" || q.Get("rows") == "0" {
		writeError(w, http.StatusBadRequest, "invalid_argument", "no terminal size")
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"bulkhead.terminal.v1"}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	_ = c.Write(ctx, websocket.MessageBinary, []byte("fake shell ready\r\n$ "))
	var line []byte
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageText {
			continue // a resize
		}
		line = append(line, b...)
		if string(line) == "exit\r" {
			_ = c.Write(ctx, websocket.MessageText, []byte(`{"exit_code":3,"signal":""}`))
			_ = c.Close(websocket.StatusNormalClosure, "")
			return
		}
		if i := strings.LastIndexByte(string(line), '\r'); i >= 0 {
			line = line[i+1:]
		}
		out := strings.ReplaceAll(string(b), "\r", "\r\necho: ")
		if err := c.Write(ctx, websocket.MessageBinary, []byte(out)); err != nil {
			return
		}
	}
}

// kindOf is the SSE event name of a fake event: its kind, in proto's
// snake_case.
func kindOf(ev map[string]any) string {
	for k := range ev {
		switch k {
		case "sequence", "runId", "time", "agent":
		default:
			var b strings.Builder
			for _, r := range k {
				if r >= 'A' && r <= 'Z' {
					b.WriteByte('_')
					r += 'a' - 'A'
				}
				b.WriteRune(r)
			}
			return b.String()
		}
	}
	return "unknown"
}

func (f *fakeService) start(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	return srv
}
