package console_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
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

	// Sandboxes made with CreateSandbox or ForkSandbox (after sb-1 and
	// sb-2, a run's each), their exposed ports, the snapshots, and the
	// sandbox calls made ("PauseSandbox sb-new-1").
	made      []map[string]any
	ports     map[string][]map[string]any
	snapshots []map[string]any
	calls     []string
}

// sandboxQuota is how many sandboxes the fake's tenant may have: ForkSandbox
// beyond it is refused, to show a refusal in the page.
const sandboxQuota = 4

// patchXSS is an apply_patch call's input (the V4A text, as the freeform
// tool sends it) whose added lines carry markup: the diff must show them
// as text.
const patchXSS = "*** Begin Patch\n*** Update File: web/index.html\n@@ <body>\n <h1>Hi</h1>\n-<p>old</p>\n" +
	"+<img src=x onerror=alert(1)>\n+<img src=y onerror=\"window.__xss = 4\"><script>window.__xss = 5</script>\n" +
	"*** Add File: notes.md\n+# Notes\n*** End Patch\n"

// patchOps is the same tool's JSON form: file operations.
const patchOps = `{"operations":[{"type":"update_file","path":"a.go","diff":"@@ func a() {\n-\treturn 1\n+\treturn 2\n }\n","move_to":"b.go"},` +
	`{"type":"delete_file","path":"<b>gone</b>.txt"}]}`

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
	f.runs["run-3"] = map[string]any{
		"runId": "run-3", "status": "RUN_STATUS_SUCCEEDED", "agent": "coder", "model": "gpt-test",
		"input": "Edit the page", "createTime": created, "updateTime": created, "turns": 1, "finalOutput": "Edited.",
	}
	f.add("run-3", "turnStarted", map[string]any{"turn": 1})
	f.add("run-3", "toolCall", map[string]any{"callId": "p-1", "tool": "apply_patch", "input": patchXSS})
	f.add("run-3", "toolResult", map[string]any{"callId": "p-1", "tool": "apply_patch", "output": "Updated web/index.html\nCreated notes.md"})
	f.add("run-3", "toolCall", map[string]any{"callId": "p-2", "tool": "apply_patch", "input": patchOps})
	f.add("run-3", "toolResult", map[string]any{"callId": "p-2", "tool": "apply_patch", "output": "Updated a.go\nMoved a.go to b.go\nDeleted <b>gone</b>.txt"})
	f.add("run-3", "runFinished", map[string]any{"finalOutput": "Edited.", "turns": 1})
	f.ports = map[string][]map[string]any{}
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
		return map[string]any{"sandboxes": f.sandboxes()}, 0, ""
	})
	f.sandboxRPCs(rpc)
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

// sandboxes is every sandbox of the fake (callers hold mu): the two runs'
// and the ones made since.
func (f *fakeService) sandboxes() []any {
	now := time.Now().UTC()
	out := []any{
		map[string]any{"sandboxId": "sb-1", "runId": "run-1", "provider": "local", "status": "SANDBOX_STATUS_RUNNING",
			"createTime": now.Add(-3 * time.Minute).Format(time.RFC3339Nano)},
		map[string]any{"sandboxId": "sb-2", "runId": "run-2", "provider": "docker", "status": "SANDBOX_STATUS_STOPPED",
			"createTime": now.Add(-2 * time.Hour).Format(time.RFC3339Nano), "expireTime": now.Add(30 * time.Minute).Format(time.RFC3339Nano)},
	}
	for _, sb := range f.made {
		out = append(out, sb)
	}
	return out
}

// sandboxRPCs registers the sandbox lifecycle, snapshot and port calls,
// which act on the sandboxes made through the API (f.made).
func (f *fakeService) sandboxRPCs(rpc func(string, func(map[string]any) (any, int, string))) {
	find := func(req map[string]any) map[string]any {
		for _, sb := range f.made {
			if sb["sandboxId"] == req["sandboxId"] {
				return sb
			}
		}
		return nil
	}
	newSandbox := func() map[string]any {
		now := time.Now().UTC()
		sb := map[string]any{"sandboxId": fmt.Sprintf("sb-new-%d", len(f.calls)), "provider": "local", "status": "SANDBOX_STATUS_RUNNING",
			"createTime": now.Format(time.RFC3339Nano), "expireTime": now.Add(time.Hour).Format(time.RFC3339Nano)}
		f.made = append(f.made, sb)
		return sb
	}
	// lifecycle registers a call on a sandbox made through the API: it is
	// logged, and NotFound for any other sandbox.
	lifecycle := func(name string, fn func(sb, req map[string]any) (any, int, string)) {
		rpc("SandboxService/"+name, func(req map[string]any) (any, int, string) {
			f.calls = append(f.calls, fmt.Sprint(name, " ", req["sandboxId"]))
			sb := find(req)
			if sb == nil {
				return fmt.Sprintf("sandbox %v not found", req["sandboxId"]), http.StatusNotFound, "not_found"
			}
			return fn(sb, req)
		})
	}
	rpc("SandboxService/CreateSandbox", func(req map[string]any) (any, int, string) {
		if len(req) != 0 {
			return fmt.Sprintf("want an empty request, got %v", req), http.StatusBadRequest, "invalid_argument"
		}
		f.calls = append(f.calls, "CreateSandbox")
		return map[string]any{"sandbox": newSandbox()}, 0, ""
	})
	rpc("SandboxService/GetSandbox", func(req map[string]any) (any, int, string) {
		for _, sb := range f.sandboxes() {
			if sb := sb.(map[string]any); sb["sandboxId"] == req["sandboxId"] {
				return map[string]any{"sandbox": sb}, 0, ""
			}
		}
		return "sandbox not found", http.StatusNotFound, "not_found"
	})
	lifecycle("DeleteSandbox", func(sb, _ map[string]any) (any, int, string) {
		f.made = slices.DeleteFunc(f.made, func(m map[string]any) bool { return m["sandboxId"] == sb["sandboxId"] })
		return map[string]any{}, 0, ""
	})
	lifecycle("PauseSandbox", func(sb, _ map[string]any) (any, int, string) {
		sb["status"] = "SANDBOX_STATUS_PAUSED"
		return map[string]any{"sandbox": sb}, 0, ""
	})
	lifecycle("ResumeSandbox", func(sb, _ map[string]any) (any, int, string) {
		sb["status"] = "SANDBOX_STATUS_RUNNING"
		return map[string]any{"sandbox": sb}, 0, ""
	})
	lifecycle("ForkSandbox", func(sb, req map[string]any) (any, int, string) {
		if req["count"] != 1.0 {
			return fmt.Sprintf("count %v, want 1", req["count"]), http.StatusBadRequest, "invalid_argument"
		}
		if n := len(f.sandboxes()); n >= sandboxQuota {
			return fmt.Sprintf("sandbox quota: %d of %d sandboxes in use", n, sandboxQuota), http.StatusTooManyRequests, "resource_exhausted"
		}
		return map[string]any{"sandboxes": []any{newSandbox()}}, 0, ""
	})
	lifecycle("SnapshotSandbox", func(sb, _ map[string]any) (any, int, string) {
		snap := map[string]any{"snapshotId": fmt.Sprintf("snap-%d", len(f.calls)), "sandboxId": sb["sandboxId"],
			"createTime": time.Now().UTC().Format(time.RFC3339Nano), "sizeBytes": "2048"}
		f.snapshots = append([]map[string]any{snap}, f.snapshots...)
		return map[string]any{"snapshot": snap}, 0, ""
	})
	rpc("SandboxService/ListSnapshots", func(map[string]any) (any, int, string) {
		return map[string]any{"snapshots": f.snapshots}, 0, ""
	})
	rpc("SandboxService/DeleteSnapshot", func(req map[string]any) (any, int, string) {
		f.calls = append(f.calls, fmt.Sprint("DeleteSnapshot ", req["snapshotId"]))
		n := len(f.snapshots)
		f.snapshots = slices.DeleteFunc(f.snapshots, func(m map[string]any) bool { return m["snapshotId"] == req["snapshotId"] })
		if len(f.snapshots) == n {
			return "snapshot not found", http.StatusNotFound, "not_found"
		}
		return map[string]any{}, 0, ""
	})
	lifecycle("ExposePort", func(sb, req map[string]any) (any, int, string) {
		port, _ := req["port"].(float64)
		if port == 22 {
			return "port 22: the operator does not allow exposing it", http.StatusForbidden, "permission_denied"
		}
		id := fmt.Sprint(sb["sandboxId"])
		now := time.Now().UTC()
		p := map[string]any{"sandboxId": id, "port": port, "url": fmt.Sprintf("/v1/preview/tok-%s-%d/", id, int(port)),
			"createTime": now.Format(time.RFC3339Nano), "expireTime": now.Add(time.Hour).Format(time.RFC3339Nano)}
		f.ports[id] = append(f.ports[id], p)
		return map[string]any{"port": p}, 0, ""
	})
	lifecycle("RevokePort", func(sb, req map[string]any) (any, int, string) {
		id := fmt.Sprint(sb["sandboxId"])
		f.ports[id] = slices.DeleteFunc(f.ports[id], func(p map[string]any) bool { return p["port"] == req["port"] })
		return map[string]any{}, 0, ""
	})
	rpc("SandboxService/ListPorts", func(req map[string]any) (any, int, string) {
		return map[string]any{"ports": f.ports[fmt.Sprint(req["sandboxId"])]}, 0, ""
	})
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
