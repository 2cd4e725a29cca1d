package service_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// The sandbox API (sandboxes as a service) as a backend in Python or
// TypeScript uses it: plain JSON POSTs and plain PUT/GET, no generated
// client.

// obj is a decoded JSON object.
type obj = map[string]any

// sbxCall POSTs a JSON request to a SandboxService method and decodes the
// answer (a Connect error is {"code","message"}).
func sbxCall(t *testing.T, ctx context.Context, e *env, token, method string, req any) (int, obj) {
	t.Helper()
	return jsonCall(t, ctx, e, token, "SandboxService/"+method, req)
}

// jsonCall POSTs a JSON request to a method ("Service/Method") of the
// service and decodes the answer.
func jsonCall(t *testing.T, ctx context.Context, e *env, token, method string, req any) (int, obj) {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	code, text := rawPost(t, ctx, e.url+"/bulkhead.harness.v1."+method, token, string(body))
	out := obj{}
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		t.Fatalf("%s: %d %q: %v", method, code, text, err)
	}
	return code, out
}

// sbxOK is sbxCall that must succeed.
func sbxOK(t *testing.T, ctx context.Context, e *env, token, method string, req any) obj {
	t.Helper()
	code, out := sbxCall(t, ctx, e, token, method, req)
	if code != http.StatusOK {
		t.Fatalf("%s %v: %d %v", method, req, code, out)
	}
	return out
}

// sbxRefused is sbxCall that must fail with the Connect code (and HTTP
// status) given, its message holding words.
func sbxRefused(t *testing.T, ctx context.Context, e *env, token, method string, req any, status int, code string, words ...string) obj {
	t.Helper()
	got, out := sbxCall(t, ctx, e, token, method, req)
	if got != status || out["code"] != code {
		t.Fatalf("%s %v: %d %v, want %d %s", method, req, got, out, status, code)
	}
	for _, w := range words {
		if msg, _ := out["message"].(string); !strings.Contains(msg, w) {
			t.Fatalf("%s: message %q does not say %q", method, msg, w)
		}
	}
	return out
}

// field reads a nested field of a decoded object ("" / nil when absent).
func field(o obj, path ...string) any {
	var v any = o
	for _, p := range path {
		m, ok := v.(obj)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func fieldStr(o obj, path ...string) string { s, _ := field(o, path...).(string); return s }

func fieldNum(o obj, path ...string) float64 {
	switch v := field(o, path...).(type) {
	case float64:
		return v
	case string: // int64 fields are strings in protojson
		var f float64
		_, _ = fmt.Sscan(v, &f)
		return f
	}
	return 0
}

// httpDo sends a plain HTTP request with the bearer token.
func httpDo(t *testing.T, ctx context.Context, method, url, token string, body io.Reader) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, method, url, body)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

const sbxManifest = "entries:\n  notes.md:\n    type: file\n    content: hello\n"

// createSandbox makes an API sandbox over JSON and returns its id.
func createSandbox(t *testing.T, ctx context.Context, e *env, token string, req obj) string {
	t.Helper()
	out := sbxOK(t, ctx, e, token, "CreateSandbox", req)
	id := fieldStr(out, "sandbox", "sandboxId")
	if !strings.HasPrefix(id, "sbx-") || fieldStr(out, "sandbox", "status") != "SANDBOX_STATUS_RUNNING" || fieldStr(out, "sandbox", "runId") != "" {
		t.Fatalf("created sandbox: %v", out)
	}
	return id
}

// waitGone waits until an API sandbox is deleted: NotFound, gone from the
// provider, and recorded gone in the store.
func (e *env) waitAPISandboxGone(t *testing.T, ctx context.Context, token, tenant, id string) {
	t.Helper()
	for {
		code, _ := sbxCall(t, ctx, e, token, "GetSandbox", obj{"sandboxId": id})
		rec, err := e.store.GetSandbox(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusNotFound && rec.Gone && !e.sandboxExists(t, id) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox %s was never deleted (GetSandbox %d, record gone %v)", id, code, rec.Gone)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestSandboxAPIOverPlainJSON: every unary call of the sandbox API over
// plain JSON, and files with curl's PUT and GET.
func TestSandboxAPIOverPlainJSON(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) {
		c.Sandboxes = manager.SandboxPolicy{MaxOutputBytes: 1000, MaxFileBytes: 1 << 20}
	})
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest, "ttl": "600s", "idleTimeout": "300s",
		"labels": obj{"team": "a", "app.example/tier": "web"}})
	other := createSandbox(t, ctx, e, acmeToken, obj{"labels": obj{"team": "b"}})
	if !e.sandboxExists(t, id) {
		t.Fatal("the provider has no such sandbox")
	}

	// Commands: a shell line, exit code and both streams.
	out := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "cat notes.md; echo oops >&2; exit 3"})
	if fieldStr(out, "stdout") != "hello" || fieldStr(out, "stderr") != "oops\n" || fieldNum(out, "exitCode") != 3 {
		t.Fatalf("RunCommand: %v", out)
	}
	// argv, env, cwd, stdin.
	sbxOK(t, ctx, e, acmeToken, "MakeDir", obj{"sandboxId": id, "path": "work/sub", "parents": true})
	out = sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "argv": []string{"sh", "-c", `cat; echo "$FOO"; pwd`},
		"env": obj{"FOO": "bar"}, "cwd": "work/sub", "stdin": "in\n"})
	if got := fieldStr(out, "stdout"); !strings.HasPrefix(got, "in\nbar\n") || !strings.HasSuffix(got, "/work/sub\n") {
		t.Fatalf("RunCommand with argv: %v", out)
	}
	// Output that is not UTF-8 comes as bytes (base64), not as text.
	out = sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": `printf '\377\376ok'; printf 'fine' >&2`})
	if fieldStr(out, "stdout") != "" || fieldStr(out, "stdoutBytes") != base64.StdEncoding.EncodeToString([]byte("\xff\xfeok")) ||
		fieldStr(out, "stderr") != "fine" || field(out, "stderrBytes") != nil {
		t.Fatalf("non-UTF-8 output: %v", out)
	}
	// Past the cap, output is counted, not kept; text stays text.
	out = sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": `i=0; while [ $i -lt 1500 ]; do printf 'é'; i=$((i+1)); done`})
	if got := fieldStr(out, "stdout"); len(got) != 1000 || fieldNum(out, "droppedBytes") != 2000 {
		t.Fatalf("capped output: %d bytes, %v dropped", len(got), field(out, "droppedBytes"))
	}
	// A timeout kills it.
	out = sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "sleep 30", "timeout": "1s"})
	if field(out, "timedOut") != true {
		t.Fatalf("a command past its timeout: %v", out)
	}
	// The run_as policy and bounds.
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id", "user": "root"}, 400, "invalid_argument", "user")
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id", "user": "daemon"}, 400, "invalid_argument", "user")
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id", "timeout": "100000s"}, 400, "invalid_argument", "timeout")
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id}, 400, "invalid_argument", "command")
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id", "cwd": "../.."}, 400, "invalid_argument", "cwd")

	// Files: PUT, then GET it back, with curl's verbs.
	filesURL := e.url + "/v1/sandboxes/" + id + "/files/"
	code, body := httpDo(t, ctx, http.MethodPut, filesURL+"dir/p.txt", acmeToken, strings.NewReader("line1\nline2\n"))
	if code != http.StatusOK || !strings.Contains(string(body), `"p.txt"`) {
		t.Fatalf("PUT: %d %s", code, body)
	}
	if code, body = httpDo(t, ctx, http.MethodGet, filesURL+"dir/p.txt", acmeToken, nil); code != http.StatusOK || string(body) != "line1\nline2\n" {
		t.Fatalf("GET after PUT: %d %q", code, body)
	}
	if code, body = httpDo(t, ctx, http.MethodPut, filesURL+"big.bin", acmeToken, bytes.NewReader(make([]byte, 2<<20))); code != http.StatusTooManyRequests ||
		!strings.Contains(string(body), "resource_exhausted") {
		t.Fatalf("PUT over the cap: %d %s", code, body)
	}
	if code, _ = httpDo(t, ctx, http.MethodPut, filesURL+"x?mode=4755", acmeToken, strings.NewReader("x")); code != http.StatusBadRequest {
		t.Fatalf("PUT of a setuid file: %d", code)
	}
	if code, _ = httpDo(t, ctx, http.MethodPut, filesURL+"no/such/dir/x?parents=false", acmeToken, strings.NewReader("x")); code != http.StatusNotFound {
		t.Fatalf("PUT without parents: %d", code)
	}
	// Stat, MakeDir, Remove.
	out = sbxOK(t, ctx, e, acmeToken, "Stat", obj{"sandboxId": id, "path": "dir/p.txt"})
	if fieldStr(out, "file", "type") != "FILE_TYPE_FILE" || fieldNum(out, "file", "size") != 12 || fieldStr(out, "file", "path") != "dir/p.txt" {
		t.Fatalf("Stat: %v", out)
	}
	out = sbxOK(t, ctx, e, acmeToken, "MakeDir", obj{"sandboxId": id, "path": "a/b/c", "parents": true})
	if fieldStr(out, "file", "type") != "FILE_TYPE_DIRECTORY" {
		t.Fatalf("MakeDir: %v", out)
	}
	sbxRefused(t, ctx, e, acmeToken, "MakeDir", obj{"sandboxId": id, "path": "x/y"}, 404, "not_found")
	sbxRefused(t, ctx, e, acmeToken, "Remove", obj{"sandboxId": id, "path": "a"}, 400, "failed_precondition")
	sbxOK(t, ctx, e, acmeToken, "Remove", obj{"sandboxId": id, "path": "a", "recursive": true})
	sbxRefused(t, ctx, e, acmeToken, "Stat", obj{"sandboxId": id, "path": "a"}, 404, "not_found")
	sbxRefused(t, ctx, e, acmeToken, "Remove", obj{"sandboxId": id, "path": ""}, 400, "invalid_argument", "path")
	sbxRefused(t, ctx, e, acmeToken, "Stat", obj{"sandboxId": id, "path": "../etc/passwd"}, 400, "invalid_argument", "path")

	// A patch applies, or says why not (and changes nothing).
	out = sbxOK(t, ctx, e, acmeToken, "ApplyPatch", obj{"sandboxId": id,
		"patch": "*** Begin Patch\n*** Update File: dir/p.txt\n@@\n line1\n-line2\n+line two\n*** End Patch\n"})
	if changes, _ := field(out, "changes").([]any); len(changes) != 1 || fieldStr(changes[0].(obj), "kind") != "PATCH_CHANGE_KIND_UPDATED" || field(out, "rejection") != nil {
		t.Fatalf("ApplyPatch: %v", out)
	}
	if _, body = httpDo(t, ctx, http.MethodGet, filesURL+"dir/p.txt", acmeToken, nil); string(body) != "line1\nline two\n" {
		t.Fatalf("the patched file: %q", body)
	}
	out = sbxOK(t, ctx, e, acmeToken, "ApplyPatch", obj{"sandboxId": id,
		"patch": "*** Begin Patch\n*** Update File: dir/p.txt\n@@\n-no such line\n+x\n*** End Patch\n"})
	if fieldStr(out, "rejection", "path") != "dir/p.txt" || fieldStr(out, "rejection", "message") == "" || field(out, "changes") != nil {
		t.Fatalf("a rejected patch: %v", out)
	}
	sbxRefused(t, ctx, e, acmeToken, "ApplyPatch", obj{"sandboxId": id, "patch": "not a patch"}, 400, "invalid_argument", "patch")

	// Processes: start with a stdin pipe, write, read its output.
	out = sbxOK(t, ctx, e, acmeToken, "StartProcess", obj{"sandboxId": id, "argv": []string{"sh", "-c", "read x; echo got $x"}, "stdin": true})
	pid := fieldStr(out, "process", "processId")
	if pid == "" || fieldStr(out, "process", "state") != "PROCESS_STATE_RUNNING" {
		t.Fatalf("StartProcess: %v", out)
	}
	out = sbxOK(t, ctx, e, acmeToken, "WriteStdin", obj{"sandboxId": id, "processId": pid, "data": base64.StdEncoding.EncodeToString([]byte("hi\n")), "close": true})
	if fieldNum(out, "nextOffset") != 3 {
		t.Fatalf("WriteStdin: %v", out)
	}
	if got, exit := readProcess(t, ctx, e, id, pid); got != "got hi\n" || fieldNum(exit, "exitCode") != 0 {
		t.Fatalf("process output %q, exit %v", got, exit)
	}
	out = sbxOK(t, ctx, e, acmeToken, "StartProcess", obj{"sandboxId": id, "command": "sleep 60"})
	sleeper := fieldStr(out, "process", "processId")
	out = sbxOK(t, ctx, e, acmeToken, "ListProcesses", obj{"sandboxId": id})
	if ps, _ := field(out, "processes").([]any); !strings.Contains(fmt.Sprint(ps), sleeper) {
		t.Fatalf("ListProcesses does not list %s: %v", sleeper, out)
	}
	sbxRefused(t, ctx, e, acmeToken, "SignalProcess", obj{"sandboxId": id, "processId": sleeper, "signal": "SIGSEGV"}, 400, "invalid_argument", "signal")
	sbxOK(t, ctx, e, acmeToken, "SignalProcess", obj{"sandboxId": id, "processId": sleeper, "signal": "KILL"})
	if _, exit := readProcess(t, ctx, e, id, sleeper); fieldStr(exit, "signal") != "SIGKILL" {
		t.Fatalf("a killed process's exit: %v", exit)
	}

	// Lists: by label, pages.
	out = sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{"labels": obj{"team": "a"}})
	if sbs, _ := field(out, "sandboxes").([]any); len(sbs) != 1 || fieldStr(sbs[0].(obj), "sandboxId") != id ||
		fieldStr(sbs[0].(obj), "labels", "app.example/tier") != "web" || fieldStr(sbs[0].(obj), "idleTimeout") != "300s" {
		t.Fatalf("ListSandboxes by label: %v", out)
	}
	var paged []string
	token := ""
	for range 3 {
		out = sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{"pageSize": 1, "pageToken": token})
		for _, sb := range field(out, "sandboxes").([]any) {
			paged = append(paged, fieldStr(sb.(obj), "sandboxId"))
		}
		if token = fieldStr(out, "nextPageToken"); token == "" {
			break
		}
	}
	if fmt.Sprint(paged) != fmt.Sprint([]string{other, id}) {
		t.Fatalf("pages: %v, want %v (newest first)", paged, []string{other, id})
	}
	out = sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{"status": "SANDBOX_STATUS_STOPPED"})
	if field(out, "sandboxes") != nil {
		t.Fatalf("stopped sandboxes: %v", out)
	}
	sbxRefused(t, ctx, e, acmeToken, "ListSandboxes", obj{"pageToken": "nope"}, 400, "invalid_argument", "page_token")

	// SetTimeout moves the deadlines, within bounds.
	before := sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id})
	out = sbxOK(t, ctx, e, acmeToken, "SetTimeout", obj{"sandboxId": id, "ttl": "7200s", "idleTimeout": "60s"})
	if fieldStr(out, "sandbox", "idleTimeout") != "60s" || fieldStr(out, "sandbox", "expireTime") <= fieldStr(before, "sandbox", "expireTime") {
		t.Fatalf("SetTimeout: %v (before: %v)", out, before)
	}
	sbxRefused(t, ctx, e, acmeToken, "SetTimeout", obj{"sandboxId": id, "ttl": "1000000s"}, 400, "invalid_argument", "ttl")

	// Delete: gone everywhere, its id NotFound.
	sbxOK(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": id})
	if e.sandboxExists(t, id) {
		t.Fatal("DeleteSandbox left the sandbox")
	}
	if rec, err := e.store.GetSandbox(ctx, "token:acme", id); err != nil || !rec.Gone {
		t.Fatalf("the record of a deleted sandbox: %+v %v", rec, err)
	}
	for _, m := range []string{"GetSandbox", "DeleteSandbox", "ListProcesses"} {
		sbxRefused(t, ctx, e, acmeToken, m, obj{"sandboxId": id}, 404, "not_found")
	}
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "true"}, 404, "not_found")
	if code, _ = httpDo(t, ctx, http.MethodGet, filesURL+"notes.md", acmeToken, nil); code != http.StatusNotFound {
		t.Fatalf("GET from a deleted sandbox: %d", code)
	}
}

// readProcess reads a started process's output until it exits.
func readProcess(t *testing.T, ctx context.Context, e *env, id, pid string) (string, obj) {
	t.Helper()
	var buf strings.Builder
	cursor := "0"
	for {
		out := sbxOK(t, ctx, e, acmeToken, "ReadProcessOutput", obj{"sandboxId": id, "processId": pid, "cursor": cursor, "wait": "2s"})
		for _, o := range func() []any { v, _ := field(out, "output").([]any); return v }() {
			data, _ := base64.StdEncoding.DecodeString(fieldStr(o.(obj), "data"))
			buf.Write(data)
		}
		if ex, ok := field(out, "exited").(obj); ok {
			return buf.String(), ex
		}
		if c := fieldStr(out, "nextCursor"); c != "" {
			cursor = c
		}
		if ctx.Err() != nil {
			t.Fatalf("process %s never exited; output so far %q", pid, buf.String())
		}
	}
}

// TestSandboxAPITenantsApart: another tenant's sandbox answers NotFound,
// exactly like an unknown id, in every call; nothing it does touches it.
func TestSandboxAPITenantsApart(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest, "labels": obj{"team": "a"}})
	unknown := "sbx-0123456789abcdef01234567"
	calls := map[string]obj{
		"GetSandbox":        {},
		"DeleteSandbox":     {},
		"SetTimeout":        {"ttl": "60s"},
		"RunCommand":        {"command": "touch evil"},
		"StartProcess":      {"command": "touch evil"},
		"ReadProcessOutput": {"processId": "p1"},
		"WriteStdin":        {"processId": "p1", "data": "eA=="},
		"SignalProcess":     {"processId": "p1", "signal": "SIGKILL"},
		"ListProcesses":     {},
		"Stat":              {"path": "notes.md"},
		"Remove":            {"path": "notes.md"},
		"MakeDir":           {"path": "evil"},
		"ApplyPatch":        {"patch": "*** Begin Patch\n*** Delete File: notes.md\n*** End Patch\n"},
		"ListSandboxDir":    {},
	}
	for method, req := range calls {
		var bodies []obj
		for _, sbx := range []string{id, unknown} {
			r := obj{"sandboxId": sbx}
			for k, v := range req {
				r[k] = v
			}
			out := sbxRefused(t, ctx, e, evilToken, method, r, 404, "not_found", "not found")
			if msg, _ := out["message"].(string); strings.Contains(msg, "run") {
				t.Errorf("%s: a sandbox id answers %q: it names a run", method, msg)
			}
			bodies = append(bodies, out)
		}
		if fmt.Sprint(bodies[0]) != fmt.Sprint(bodies[1]) {
			t.Errorf("%s: another tenant's sandbox answers %v, an unknown one %v", method, bodies[0], bodies[1])
		}
	}
	for _, method := range []string{http.MethodGet, http.MethodPut} {
		if code, body := httpDo(t, ctx, method, e.url+"/v1/sandboxes/"+id+"/files/notes.md", evilToken, strings.NewReader("evil")); code != http.StatusNotFound {
			t.Errorf("%s of another tenant's file: %d %s", method, code, body)
		}
	}
	out := sbxOK(t, ctx, e, evilToken, "ListSandboxes", obj{})
	if field(out, "sandboxes") != nil {
		t.Fatalf("another tenant lists %v", out)
	}
	out = sbxOK(t, ctx, e, evilToken, "ListSandboxes", obj{"labels": obj{"team": "a"}})
	if field(out, "sandboxes") != nil {
		t.Fatalf("another tenant finds by label %v", out)
	}
	// Untouched: its files are as they were, and it lives.
	out = sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "cat notes.md; ls"})
	if fieldStr(out, "stdout") != "hellonotes.md\n" {
		t.Fatalf("the sandbox after another tenant's calls: %v", out)
	}
	if rec, err := e.store.GetSandbox(ctx, "token:evil", id); err == nil {
		t.Fatalf("the store gives another tenant the record: %+v", rec)
	}
}

// TestSandboxAPIQuota: API sandboxes count against the tenant's sandbox
// quota with its runs'; a deleted one gives its slot back.
func TestSandboxAPIQuota(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Sandboxes: 2} })
	ctx := ctxT(t)
	first := createSandbox(t, ctx, e, acmeToken, obj{})
	createSandbox(t, ctx, e, acmeToken, obj{})
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{}, http.StatusTooManyRequests, "resource_exhausted", "sandboxes per tenant")
	// A run needs a sandbox slot too.
	acme := e.clients(acmeToken)
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "another"}))
	refusedWith(t, "a run while API sandboxes hold every slot", err, connect.CodeResourceExhausted, "sandboxes per tenant")
	// Another tenant's quota is its own.
	createSandbox(t, ctx, e, evilToken, obj{})
	sbxOK(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": first})
	createSandbox(t, ctx, e, acmeToken, obj{})
}

// TestSandboxAPIRequestPolicy: CreateSandbox's fields are checked like
// StartRun's: the manifest as an untrusted one, labels, ttl bounds.
func TestSandboxAPIRequestPolicy(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	for _, c := range []struct {
		req   obj
		words []string
	}{
		{obj{"manifest": "users:\n  - name: dev\n    uid: 0\n"}, []string{"manifest", "uid"}},
		{obj{"manifest": "run_as: root\n"}, []string{"manifest"}},
		{obj{"manifest": "users:\n  - name: daemon\n"}, []string{"manifest", "system account"}},
		{obj{"manifest": "entries:\n  x:\n    type: local_file\n    src: /etc/passwd\n"}, []string{"manifest"}},
		{obj{"labels": obj{"Bad Key": "x"}}, []string{"labels"}},
		{obj{"labels": obj{"k": strings.Repeat("v", 300)}}, []string{"labels"}},
		{obj{"ttl": "100000000s"}, []string{"ttl"}},
		{obj{"ttl": "0.1s"}, []string{"ttl"}},
		{obj{"idleTimeout": "-5s"}, []string{"idle_timeout"}},
	} {
		sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", c.req, 400, "invalid_argument", c.words...)
	}
	if infos, _ := e.prov.List(ctx); len(infos) != 0 {
		t.Fatalf("refused requests made %d sandboxes", len(infos))
	}
	// A user the manifest declares may run commands: another account
	// than the sandbox's own.
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": "users:\n  - name: dev\n"})
	own := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id -u"})
	dev := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id -u", "user": "dev"})
	if fieldStr(dev, "stdout") == "" || fieldStr(dev, "stdout") == fieldStr(own, "stdout") || fieldStr(dev, "stdout") == "0\n" {
		t.Fatalf("a declared user: %v, the sandbox's own: %v", dev, own)
	}
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "id", "user": "stranger"}, 400, "invalid_argument", "user")
}

// TestSandboxAPIDeadlines: an API sandbox is deleted at its ttl, or once
// idle for its idle timeout, but not while a call uses it.
func TestSandboxAPIDeadlines(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	byTTL := createSandbox(t, ctx, e, acmeToken, obj{"ttl": "2s"})
	byIdle := createSandbox(t, ctx, e, acmeToken, obj{"ttl": "600s", "idleTimeout": "3s"})
	busy := createSandbox(t, ctx, e, acmeToken, obj{"ttl": "600s", "idleTimeout": "2s"})
	// A command longer than the idle timeout keeps it alive.
	out := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": busy, "command": "sleep 3; echo done"})
	if fieldStr(out, "stdout") != "done\n" {
		t.Fatalf("a command longer than the idle timeout: %v", out)
	}
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", byTTL)
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", byIdle)
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", busy)
}

// TestSandboxAPIRestart: API sandboxes outlive a restart of the service,
// graceful or not, and are found again (reattached on use, their files as
// they were); one whose ttl passed while no service ran is deleted.
func TestSandboxAPIRestart(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Sandboxes: 2} })
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest, "labels": obj{"keep": "yes"}})
	expiring := createSandbox(t, ctx, e, acmeToken, obj{})
	if code, body := httpDo(t, ctx, http.MethodPut, e.url+"/v1/sandboxes/"+id+"/files/state.txt", acmeToken, strings.NewReader("kept")); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}

	e.restart()
	out := sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id})
	if fieldStr(out, "sandbox", "status") != "SANDBOX_STATUS_STOPPED" || fieldStr(out, "sandbox", "labels", "keep") != "yes" {
		t.Fatalf("after a restart: %v", out)
	}
	// It holds its slot in the new service.
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{}, http.StatusTooManyRequests, "resource_exhausted")
	out = sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "cat notes.md state.txt"})
	if fieldStr(out, "stdout") != "hellokept" {
		t.Fatalf("a command after the restart: %v", out)
	}
	if out = sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id}); fieldStr(out, "sandbox", "status") != "SANDBOX_STATUS_RUNNING" {
		t.Fatalf("reattached: %v", out)
	}

	// A crash: the service dies without Shutdown; one ttl passes while
	// it is down.
	e.crash()
	rec, err := e.store.GetSandbox(ctx, "token:acme", expiring)
	if err != nil {
		t.Fatal(err)
	}
	rec.Expires = time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	if err := e.store.UpdateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", expiring)
	if code, body := httpDo(t, ctx, http.MethodGet, e.url+"/v1/sandboxes/"+id+"/files/state.txt", acmeToken, nil); code != http.StatusOK || string(body) != "kept" {
		t.Fatalf("GET after a crash: %d %q", code, body)
	}
	// Its slot came back with the deletion.
	createSandbox(t, ctx, e, acmeToken, obj{})
}

// TestSandboxAPIStreams: Exec and WriteFile with the Connect Go client
// (gRPC over h2c).
func TestSandboxAPIStreams(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	created, err := acme.sandbox.CreateSandbox(ctx, connect.NewRequest(&harnessv1.CreateSandboxRequest{Manifest: sbxManifest}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetSandbox().GetSandboxId()

	// WriteFile: a header, then chunks.
	ws := acme.sandbox.WriteFile(ctx)
	msgs := []*harnessv1.WriteFileRequest{
		{Kind: &harnessv1.WriteFileRequest_Header{Header: &harnessv1.WriteFileHeader{SandboxId: id, Path: "up/load.txt", CreateParents: true, Mode: 0o600}}},
		{Kind: &harnessv1.WriteFileRequest_Data{Data: []byte("part one, ")}},
		{Kind: &harnessv1.WriteFileRequest_Data{Data: []byte("part two")}},
	}
	for _, m := range msgs {
		if err := ws.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	wr, err := ws.CloseAndReceive()
	if err != nil || wr.Msg.GetFile().GetSize() != 18 || wr.Msg.GetFile().GetMode() != 0o600 {
		t.Fatalf("WriteFile: %v %v", wr, err)
	}

	// Exec: started, output as it comes, exited.
	stream, err := acme.sandbox.Exec(ctx, connect.NewRequest(&harnessv1.ExecRequest{SandboxId: id,
		Command: "cat up/load.txt; echo; echo to-stderr >&2; cat; exit 4", Stdin: []byte("from stdin")}))
	if err != nil {
		t.Fatal(err)
	}
	var started string
	var stdout, stderr bytes.Buffer
	var exited *harnessv1.ExecExited
	for stream.Receive() {
		switch k := stream.Msg().GetKind().(type) {
		case *harnessv1.ExecResponse_Started:
			if started != "" || stdout.Len() > 0 {
				t.Fatal("started twice, or after output")
			}
			started = k.Started.GetProcessId()
		case *harnessv1.ExecResponse_Output:
			if k.Output.GetStream() == harnessv1.OutputStream_OUTPUT_STREAM_STDERR {
				stderr.Write(k.Output.GetData())
			} else {
				stdout.Write(k.Output.GetData())
			}
		case *harnessv1.ExecResponse_Exited:
			exited = k.Exited
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if started == "" || exited.GetExitCode() != 4 || stdout.String() != "part one, part two\nfrom stdin" || stderr.String() != "to-stderr\n" {
		t.Fatalf("Exec: started %q, exit %v, stdout %q, stderr %q", started, exited, stdout.String(), stderr.String())
	}
	// Another tenant cannot stream into it.
	evil := e.clients(evilToken)
	es, err := evil.sandbox.Exec(ctx, connect.NewRequest(&harnessv1.ExecRequest{SandboxId: id, Command: "true"}))
	if err == nil {
		for es.Receive() {
		}
		err = es.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("another tenant's Exec: %v", err)
	}
}

// TestSandboxAPIOnRunSandboxes: the calls work in a run's sandbox too;
// deleting it is refused while its run is active.
func TestSandboxAPIOnRunSandboxes(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := waitStatus(t, ctx, acme, startRun(t, ctx, acme, "exec_command").GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	sbx := run.GetSandboxId()
	out := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": sbx, "command": "cat notes.md"})
	if fieldStr(out, "stdout") != "hello" {
		t.Fatalf("RunCommand in a run's sandbox: %v", out)
	}
	out = sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": sbx})
	if fieldStr(out, "sandbox", "runId") != run.GetRunId() {
		t.Fatalf("GetSandbox of a run's sandbox: %v", out)
	}
	sbxRefused(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": sbx}, 400, "failed_precondition", "cancel the run")
	sbxRefused(t, ctx, e, acmeToken, "SetTimeout", obj{"sandboxId": sbx, "ttl": "60s"}, 400, "failed_precondition")
	sbxRefused(t, ctx, e, evilToken, "RunCommand", obj{"sandboxId": sbx, "command": "true"}, 404, "not_found")
	// A label filter leaves runs' sandboxes out; none does not.
	if out = sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{"labels": obj{"a": "b"}}); field(out, "sandboxes") != nil {
		t.Fatalf("a label filter lists %v", out)
	}
	if out = sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{"runId": run.GetRunId()}); len(field(out, "sandboxes").([]any)) != 1 {
		t.Fatalf("a run's sandbox: %v", out)
	}
}

// TestSandboxAPIShutdownLeavesNoGoroutine: an Exec stream in progress ends
// at Shutdown, no goroutine of the service is left, and the API sandbox
// stays (released, not deleted) for the next service.
func TestSandboxAPIShutdownLeavesNoGoroutine(t *testing.T) {
	before := serviceGoroutines()
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest, "idleTimeout": "2s"})
	stream, err := acme.sandbox.Exec(ctx, connect.NewRequest(&harnessv1.ExecRequest{SandboxId: id, Command: "echo up; sleep 60"}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if o := stream.Msg().GetOutput(); o != nil && strings.Contains(string(o.GetData()), "up") {
			break
		}
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.svc.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	checkNoGoroutines(t, before)
	e.stop()
	for stream.Receive() {
	}
	if stream.Err() == nil {
		t.Error("the Exec stream ended without an error at Shutdown")
	}
	rec, err := e.store.GetSandbox(ctx, "token:acme", id)
	if err != nil || rec.Gone || len(rec.SessionState) == 0 || !e.sandboxExists(t, id) {
		t.Fatalf("the API sandbox after Shutdown: %+v %v (exists %v)", rec, err, e.sandboxExists(t, id))
	}
}
