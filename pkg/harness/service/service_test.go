package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	pgserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/postgres"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/postgres"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
	"github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1/harnessv1connect"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

const (
	acmeToken = "tok-acme-0123456789abcdef"
	evilToken = "tok-evil-0123456789abcdef"
	// modelKey is the service's model API key: no response may carry it.
	modelKey = "sk-service-SECRET-0123456789"
)

// env is a service over real sockets, with local sandboxes and a scripted
// Responses server.
type env struct {
	t      *testing.T
	dir    string
	script *replay.Server
	prov   *local.Provider
	client *compute.Client
	store  store.Store
	log    *zap.Logger
	cfg    func(*service.Config)
	// auth, when set, replaces the static tokens of acme and evil.
	auth auth.Authenticator

	svc  *service.Service
	url  string
	stop func()
	// crash stops serving without shutting the service down: what a
	// crashed process leaves behind (its store records, its sandboxes).
	crash func()
}

// agentScript answers like a small agent: a shell command first, then a
// final message once the command's output came back.
func agentScript(cmd string) replay.Responder {
	return func(req *replay.Request) replay.Turn {
		if len(req.InputOfType("function_call_output")) == 0 {
			args, _ := json.Marshal(map[string]string{"cmd": cmd})
			return replay.Turn{Items: []replay.Item{replay.Message("Working."), replay.FunctionCall("c1", "exec_command", string(args))}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message("Done.")}}
	}
}

func newEnv(t *testing.T, st store.Store, cfg func(*service.Config)) *env {
	t.Helper()
	return newEnvWith(t, envOptions{store: st, cfg: cfg})
}

// envOptions shape an env beyond its service's Config.
type envOptions struct {
	store store.Store
	cfg   func(*service.Config)
	// git fetches the sandboxes' git_repo entries (nil: none may be).
	git materializer.GitFetcher
	// auth replaces the static tokens of acme and evil.
	auth auth.Authenticator
	// wrap, when set, wraps the local provider (to watch its launches).
	wrap func(compute.Provider) compute.Provider
	// local, when set, adjusts the local provider's config (isolation).
	local func(*local.Config)
}

func newEnvWith(t *testing.T, o envOptions) *env {
	t.Helper()
	st, cfg := o.store, o.cfg
	dir, err := os.MkdirTemp("", "bh-svc-") // short: unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), cfg: cfg, auth: o.auth}
	e.script = replay.NewServer()
	e.script.SetFallback(agentScript("echo hi > out.txt && cat out.txt"))
	t.Cleanup(e.script.Close)
	snaps, err := snapshot.NewLocal(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	lcfg := local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}
	if o.local != nil {
		o.local(&lcfg)
	}
	e.prov, err = local.New(lcfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	var prov compute.Provider = e.prov
	if o.wrap != nil {
		prov = o.wrap(prov)
	}
	mat := materializer.Options{Git: refuseGit{}}
	if o.git != nil {
		mat.Git = o.git
	}
	e.client = compute.NewClient(prov, compute.ClientOptions{Log: e.log, Snapshots: snaps, Materializer: mat})
	// Whatever happens, no sandbox outlives the test.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		infos, _ := e.prov.List(ctx)
		for _, i := range infos {
			_ = e.prov.Destroy(ctx, i.State)
		}
		_ = e.prov.Close()
	})
	if st == nil {
		if st, err = bolt.Open(filepath.Join(dir, "runs.db")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
	}
	e.store = st
	e.start()
	t.Cleanup(func() { e.stop() })
	return e
}

// start starts a service over the env's store (recovering its runs).
func (e *env) start() {
	t := e.t
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: modelKey, BaseURL: e.script.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var authn auth.Authenticator = e.auth
	if authn == nil {
		tokens, err := auth.ParseTokens([]byte(acmeToken+" acme\n"+evilToken+" evil\n"), "tokens")
		if err != nil {
			t.Fatal(err)
		}
		authn = tokens
	}
	cfg := service.Config{Store: e.store, Compute: e.client, Model: mdl, DefaultModel: "scripted", Auth: authn, Log: e.log,
		SandboxRetention: time.Minute, DrainTimeout: time.Minute}
	if e.cfg != nil {
		e.cfg(&cfg)
	}
	ctx := context.Background()
	svc, err := service.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- service.Serve(sctx, ln, svc.Handler(), time.Second) }()
	e.svc, e.url = svc, "http://"+ln.Addr().String()
	stopped := false
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		sdctx, scancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer scancel()
		if err := svc.Shutdown(sdctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	e.crash = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
}

// restart shuts the service down and starts a new one over the same store.
func (e *env) restart() {
	e.stop()
	e.start()
}

// refuseGit is the env's git fetcher unless a test gives one: tests never
// reach the network.
type refuseGit struct{}

func (refuseGit) Fetch(context.Context, *manifest.GitRepo, string) error {
	return errors.New("this test fetches no git repository")
}

// bearer adds an Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.next.RoundTrip(r)
}

// httpClient is a plain HTTP/1.1 client; h2 speaks HTTP/2 without TLS.
func httpClient(token string, h2 bool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if h2 {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{Transport: bearer{token: token, next: tr}}
}

// clients of one tenant: Connect JSON over HTTP/1.1, and gRPC over h2c.
type clients struct {
	runs    harnessv1connect.RunServiceClient
	grpc    harnessv1connect.RunServiceClient
	sandbox harnessv1connect.SandboxServiceClient
	token   string
}

func (e *env) clients(token string) clients {
	return clients{
		runs:    harnessv1connect.NewRunServiceClient(httpClient(token, false), e.url, connect.WithProtoJSON()),
		grpc:    harnessv1connect.NewRunServiceClient(httpClient(token, true), e.url, connect.WithGRPC()),
		sandbox: harnessv1connect.NewSandboxServiceClient(httpClient(token, true), e.url, connect.WithGRPC()),
		token:   token,
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	id, name, data string
}

// readSSE reads a run's SSE stream with plain net/http into a channel
// (closed at the end of the stream).
func (e *env) readSSE(t *testing.T, ctx context.Context, token, runID, after string) (<-chan sseEvent, *http.Response) {
	t.Helper()
	url := e.url + "/v1/runs/" + runID + "/events"
	if after != "" {
		url += "?after=" + after
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan sseEvent, 1024)
	if resp.StatusCode != http.StatusOK {
		close(out)
		return out, resp
	}
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out, resp
}

// until reads events until one named name (failing at the stream's end).
func until(t *testing.T, events <-chan sseEvent, name string, seen *[]sseEvent) sseEvent {
	t.Helper()
	for ev := range events {
		*seen = append(*seen, ev)
		if ev.name == name {
			return ev
		}
	}
	t.Fatalf("the event stream ended without %q; saw %v", name, names(*seen))
	return sseEvent{}
}

func names(evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.name)
	}
	return out
}

func startRun(t *testing.T, ctx context.Context, c clients, approvals ...string) *harnessv1.Run {
	t.Helper()
	resp, err := c.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{
		Agent:     &harnessv1.AgentSpec{Name: "worker", Instructions: "Do the task."},
		Manifest:  "entries:\n  notes.md:\n    type: file\n    content: hello\n",
		Approvals: &harnessv1.ApprovalPolicy{RequireApproval: approvals},
		Input:     "Write a file.",
	}))
	if err != nil {
		t.Fatalf("start run: %v", err)
	}
	return resp.Msg.GetRun()
}

// waitStatus polls a run until it is in status.
func waitStatus(t *testing.T, ctx context.Context, c clients, id string, status harnessv1.RunStatus) *harnessv1.Run {
	t.Helper()
	for {
		resp, err := c.runs.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.Msg.GetRun(); r.GetStatus() == status {
			return r
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s never reached %s (last: %v)", id, status, resp.Msg.GetRun())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rawPost is a curl-like JSON POST; it returns the status and body.
func rawPost(t *testing.T, ctx context.Context, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRunApprovedOverAPI(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)

	// Bad input is refused and starts nothing.
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "x", Manifest: "entries:\n  a:\n    type: local_file\n    src: /etc/passwd\n"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a manifest reading the service's host: %v, want InvalidArgument", err)
	}
	if _, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("no input: %v", err)
	}

	run := startRun(t, ctx, acme, "exec_command")
	events, _ := e.readSSE(t, ctx, acmeToken, run.GetRunId(), "")
	var seen []sseEvent
	ask := until(t, events, "approval_requested", &seen)
	var askEv harnessv1.RunEvent
	if err := protojson.Unmarshal([]byte(ask.data), &askEv); err != nil {
		t.Fatal(err)
	}
	if c := askEv.GetApprovalRequested().GetCall(); c.GetCallId() != "c1" || c.GetTool() != "exec_command" || !strings.Contains(c.GetInput(), "echo hi") {
		t.Fatalf("approval requested: %v", c)
	}
	waiting := waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if len(waiting.GetPendingApprovals()) != 1 || waiting.GetSandboxId() == "" {
		t.Fatalf("waiting run: %v", waiting)
	}

	// A curl-like JSON POST approves the call.
	code, body := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/ApproveToolCall", acmeToken,
		`{"runId": "`+run.GetRunId()+`", "callId": "c1", "approved": true}`)
	if code != http.StatusOK || !strings.Contains(body, run.GetRunId()) {
		t.Fatalf("approve: %d %s", code, body)
	}
	fin := until(t, events, "run_finished", &seen)
	if !strings.Contains(fin.data, "Done.") {
		t.Errorf("run_finished: %s", fin.data)
	}
	until(t, events, "end", &seen)
	var toolOut string
	for _, ev := range seen {
		if ev.name == "tool_result" {
			toolOut = ev.data
		}
		if strings.Contains(ev.data, modelKey) {
			t.Errorf("an event carries the model API key: %s", ev.data)
		}
	}
	if !strings.Contains(toolOut, `hi\n`) {
		t.Errorf("tool result %q, want the command's output", toolOut)
	}
	want := []string{"turn_started", "model_text", "approval_requested", "approval_decided", "run_resumed", "tool_call", "tool_result", "turn_started", "run_finished"}
	if got := names(seen); !subsequence(got, want) {
		t.Errorf("events %q, want in order %q", got, want)
	}

	// gRPC (Connect's client in gRPC mode, over h2c) sees the run and its
	// sandbox's files; the event log resumes from a sequence.
	got, err := acme.grpc.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: run.GetRunId()}))
	if err != nil || got.Msg.GetRun().GetStatus() != harnessv1.RunStatus_RUN_STATUS_SUCCEEDED || got.Msg.GetRun().GetFinalOutput() != "Done." {
		t.Fatalf("grpc GetRun: %v %v", got, err)
	}
	last := got.Msg.GetRun().GetLastSequence()
	stream, err := acme.grpc.StreamRunEvents(ctx, connect.NewRequest(&harnessv1.StreamRunEventsRequest{RunId: run.GetRunId(), AfterSequence: last - 2}))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for stream.Receive() {
		seqs = append(seqs, stream.Msg().GetEvent().GetSequence())
	}
	if stream.Err() != nil || len(seqs) != 2 || seqs[0] != last-1 || seqs[1] != last {
		t.Fatalf("resumed stream: %v %v (last %d)", seqs, stream.Err(), last)
	}
	sbx := got.Msg.GetRun().GetSandboxId()
	rf, err := acme.sandbox.ReadSandboxFile(ctx, connect.NewRequest(&harnessv1.ReadSandboxFileRequest{SandboxId: sbx, Path: "out.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	var content []byte
	for rf.Receive() {
		content = append(content, rf.Msg().GetData()...)
	}
	if rf.Err() != nil || string(content) != "hi\n" {
		t.Fatalf("ReadSandboxFile: %q %v", content, rf.Err())
	}
	dir, err := acme.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: sbx}))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, en := range dir.Msg.GetEntries() {
		files = append(files, en.GetName())
	}
	if !strings.Contains(strings.Join(files, " "), "notes.md") || !strings.Contains(strings.Join(files, " "), "out.txt") {
		t.Errorf("ListSandboxDir: %v", files)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/v1/sandboxes/"+sbx+"/files/notes.md", nil)
	req.Header.Set("Authorization", "Bearer "+acmeToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "hello" {
		t.Errorf("download: %d %q", resp.StatusCode, b)
	}
	sbs, err := acme.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{}))
	if err != nil || len(sbs.Msg.GetSandboxes()) != 1 || sbs.Msg.GetSandboxes()[0].GetExpireTime() == nil {
		t.Fatalf("ListSandboxes: %v %v", sbs, err)
	}
	// No response echoes the service's configuration.
	for _, path := range []string{"GetRun", "ListRuns"} {
		_, body := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/"+path, acmeToken, `{"runId": "`+run.GetRunId()+`"}`)
		if strings.Contains(body, modelKey) || strings.Contains(body, e.script.URL()) {
			t.Errorf("%s echoes the model configuration: %s", path, body)
		}
	}
	if err := e.script.Err(); err != nil {
		t.Error(err)
	}
}

// subsequence reports whether want appears in got in order.
func subsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestTenantIsolation: every RPC taking an id answers NotFound for another
// tenant's run or sandbox, exactly as for an unknown id.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme, evil := e.clients(acmeToken), e.clients(evilToken)
	run := startRun(t, ctx, acme, "exec_command")
	run = waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	id, sbx := run.GetRunId(), run.GetSandboxId()

	for _, target := range []struct{ run, sandbox string }{{id, sbx}, {"run-000000000000000000000000", "sbx-000000000000000000000000"}} {
		checks := map[string]error{}
		_, checks["GetRun"] = evil.runs.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: target.run}))
		_, checks["ApproveToolCall"] = evil.runs.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: target.run, CallId: "c1", Approved: true}))
		_, checks["CancelRun"] = evil.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: target.run}))
		_, checks["ResumeRun"] = evil.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunId: target.run}))
		_, checks["ListSandboxes"] = evil.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{RunId: target.run}))
		_, checks["ListSandboxDir"] = evil.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: target.sandbox}))
		st, err := evil.grpc.StreamRunEvents(ctx, connect.NewRequest(&harnessv1.StreamRunEventsRequest{RunId: target.run}))
		if err == nil {
			for st.Receive() {
				t.Errorf("another tenant received an event: %v", st.Msg())
			}
			err = st.Err()
		}
		checks["StreamRunEvents"] = err
		rf, err := evil.sandbox.ReadSandboxFile(ctx, connect.NewRequest(&harnessv1.ReadSandboxFileRequest{SandboxId: target.sandbox, Path: "notes.md"}))
		if err == nil {
			for rf.Receive() {
				t.Errorf("another tenant read file bytes")
			}
			err = rf.Err()
		}
		checks["ReadSandboxFile"] = err
		term := evil.sandbox.OpenTerminal(ctx)
		_ = term.Send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Start{Start: &harnessv1.TerminalStart{SandboxId: target.sandbox}}})
		_, err = term.Receive()
		checks["OpenTerminal"] = err
		_ = term.CloseRequest()
		_ = term.CloseResponse()
		for name, err := range checks {
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("%s on %s as another tenant: %v, want NotFound", name, target.run, err)
			}
		}
		// The hand-written routes answer 404 the same way.
		for _, path := range []string{"/v1/runs/" + target.run + "/events", "/v1/sandboxes/" + target.sandbox + "/files/notes.md", "/v1/sandboxes/" + target.sandbox + "/terminal"} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
			req.Header.Set("Authorization", "Bearer "+evilToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET %s as another tenant: %d, want 404", path, resp.StatusCode)
			}
		}
	}
	list, err := evil.runs.ListRuns(ctx, connect.NewRequest(&harnessv1.ListRunsRequest{}))
	if err != nil || len(list.Msg.GetRuns()) != 0 {
		t.Errorf("another tenant lists %v (%v)", list, err)
	}
	sbs, err := evil.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{}))
	if err != nil || len(sbs.Msg.GetSandboxes()) != 0 {
		t.Errorf("another tenant lists sandboxes %v (%v)", sbs, err)
	}
	// No credential, or a wrong one: Unauthenticated.
	for _, tok := range []string{"", "tok-nobody-0123456789abcdef"} {
		_, err := e.clients(tok).runs.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: id}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("token %q: %v, want Unauthenticated", tok, err)
		}
	}
	// The run is untouched: its tenant cancels it.
	c, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: id, Reason: "test over"}))
	if err != nil || c.Msg.GetRun().GetStatus() != harnessv1.RunStatus_RUN_STATUS_CANCELED {
		t.Fatalf("cancel: %v %v", c, err)
	}
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: id})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("second cancel: %v, want FailedPrecondition", err)
	}
}

// TestRestartResumesWaitingRun: a run waiting for approval survives a
// restart of the service and completes when approved by the new one; a run
// the old service lost mid-turn is reported failed.
func TestRestartResumesWaitingRun(t *testing.T) { testRestart(t, nil) }

// TestRestartResumesWaitingRunPostgres is the same over PostgreSQL.
func TestRestartResumesWaitingRunPostgres(t *testing.T) {
	srv := pgserver.Start(t)
	st, err := postgres.Open(context.Background(), srv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	testRestart(t, st)
}

// gauge records a service's runs gauge (service.RunGauge).
type gauge struct {
	mu sync.Mutex
	n  map[string]int
}

func (g *gauge) SetRuns(state string, n int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n[state] = n
	return nil
}

// check compares the gauge's states with want.
func (g *gauge) check(t *testing.T, when string, want map[string]int) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for st, n := range want {
		if got, ok := g.n[st]; !ok || got != n {
			t.Errorf("%s: runs gauge %s = %d (set: %v), want %d", when, st, got, ok, n)
		}
	}
}

func testRestart(t *testing.T, st store.Store) {
	runs := &gauge{n: map[string]int{}}
	e := newEnv(t, st, func(c *service.Config) { c.Runs = runs })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	// A run recorded as mid-turn, as a crashed service leaves it.
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := e.store.CreateRun(ctx, &store.Run{ID: "run-lost00000000000000000000", Tenant: "token:acme", Status: "RUN_STATUS_RUNNING",
		Created: now, Updated: now, Spec: []byte(`{"input":"x"}`)}); err != nil {
		t.Fatal(err)
	}

	// A stream open across the restart ends (it does not hang), and
	// continues on the new service from the last sequence it saw.
	before, _ := e.readSSE(t, ctx, acmeToken, run.GetRunId(), "")
	var seenBefore []sseEvent
	until(t, before, "approval_requested", &seenBefore)

	e.restart()
	var tail []sseEvent
	for ev := range before {
		tail = append(tail, ev)
	}
	if len(tail) == 0 || tail[len(tail)-1].name != "error" || !strings.Contains(tail[len(tail)-1].data, "reconnect") {
		t.Errorf("the stream across the restart ended with %v", tail)
	}
	lastID := seenBefore[len(seenBefore)-1].id
	acme = e.clients(acmeToken)
	after, _ := e.readSSE(t, ctx, acmeToken, run.GetRunId(), lastID)
	lost := waitStatus(t, ctx, acme, "run-lost00000000000000000000", harnessv1.RunStatus_RUN_STATUS_FAILED)
	if !strings.Contains(lost.GetError(), "lost") {
		t.Errorf("lost run's error: %q", lost.GetError())
	}
	w := waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if len(w.GetPendingApprovals()) != 1 {
		t.Fatalf("after restart: %v", w)
	}
	// The new service counted the store's runs, and the lost one failed.
	runs.check(t, "after the restart", map[string]int{"waiting_approval": 1, "failed": 1, "pending": 0, "succeeded": 0, "checkpointed": 0, "canceled": 0})
	// The sandbox is reachable again (reattached on demand).
	if _, err := acme.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: w.GetSandboxId()})); err != nil {
		t.Fatalf("sandbox after restart: %v", err)
	}
	if _, err := acme.grpc.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: run.GetRunId(), CallId: "c1", Approved: true})); err != nil {
		t.Fatal(err)
	}
	done := waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if done.GetFinalOutput() != "Done." {
		t.Errorf("final output %q", done.GetFinalOutput())
	}
	runs.check(t, "after the approval", map[string]int{"waiting_approval": 0, "failed": 1, "pending": 0, "succeeded": 1})
	var resumed []sseEvent
	until(t, after, "run_finished", &resumed)
	if resumed[0].name != "approval_decided" {
		t.Errorf("the reconnected stream starts with %q, want the event after %s", resumed[0].name, lastID)
	}
	// The log is whole across the restart: one sequence, no gaps.
	es, err := acme.grpc.StreamRunEvents(ctx, connect.NewRequest(&harnessv1.StreamRunEventsRequest{RunId: run.GetRunId()}))
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(0)
	var out string
	for es.Receive() {
		n++
		ev := es.Msg().GetEvent()
		if ev.GetSequence() != n {
			t.Fatalf("event %d has sequence %d", n, ev.GetSequence())
		}
		if r := ev.GetToolResult(); r != nil {
			out = r.GetOutput()
		}
	}
	if es.Err() != nil || !strings.HasSuffix(out, "\nhi\n") {
		t.Errorf("log: %v, tool output %q", es.Err(), out)
	}
}

// TestShutdownCheckpointsRunningRun: a run in the middle of a model call
// when the service shuts down stops at the end of that turn with its state
// saved, and the next service continues it to the end.
func TestShutdownCheckpointsRunningRun(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	called, release := make(chan struct{}), make(chan struct{})
	e.script.EnqueueFunc(func(req *replay.Request) replay.Turn {
		close(called)
		<-release
		return agentScript("echo checkpointed > cp.txt && cat cp.txt")(req)
	})
	run := startRun(t, ctx, acme) // no approvals asked for
	select {
	case <-called:
	case <-ctx.Done():
		t.Fatal("the model was never called")
	}
	e.svc.Drain()
	close(release)
	e.stop()
	rec, err := e.store.GetRun(ctx, "token:acme", run.GetRunId())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != "CHECKPOINTED" || len(rec.Checkpoint) != 1 || len(rec.RunState) == 0 || len(rec.SessionState) == 0 {
		t.Fatalf("after shutdown: status %s, checkpoint %v, state %d bytes, session %d bytes", rec.Status, rec.Checkpoint, len(rec.RunState), len(rec.SessionState))
	}
	e.start()
	acme = e.clients(acmeToken)
	done := waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if done.GetFinalOutput() != "Done." {
		t.Errorf("final output %q", done.GetFinalOutput())
	}
	var seen []sseEvent
	events, _ := e.readSSE(t, ctx, acmeToken, run.GetRunId(), "")
	until(t, events, "run_resumed", &seen)
	res := until(t, events, "tool_result", &seen)
	if !strings.Contains(res.data, `checkpointed\n`) {
		t.Errorf("tool result after the restart: %s", res.data)
	}
}

// TestTerminal: the terminal echoes over gRPC (bidi on h2c) and over the
// WebSocket, authenticated with the bearer subprotocol.
func TestTerminal(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme, "exec_command")
	run = waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)

	term := acme.sandbox.OpenTerminal(ctx)
	send := func(m *harnessv1.OpenTerminalRequest) {
		if err := term.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Start{Start: &harnessv1.TerminalStart{SandboxId: run.GetSandboxId(), Command: []string{"/bin/sh"}, Cols: 80, Rows: 24}}})
	send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Resize{Resize: &harnessv1.TerminalSize{Cols: 100, Rows: 30}}})
	send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Stdin{Stdin: []byte("echo $((6*7)); exit\n")}})
	var out strings.Builder
	var exited *harnessv1.TerminalExited
	for exited == nil {
		m, err := term.Receive()
		if err != nil {
			t.Fatalf("terminal: %v (output %q)", err, out.String())
		}
		out.Write(m.GetOutput())
		exited = m.GetExited()
	}
	_ = term.CloseRequest()
	_ = term.CloseResponse()
	if !strings.Contains(out.String(), "42") || exited.GetExitCode() != 0 {
		t.Errorf("terminal output %q, exit %v", out.String(), exited)
	}

	url := strings.Replace(e.url, "http://", "ws://", 1) + "/v1/sandboxes/" + run.GetSandboxId() + "/terminal?command=/bin/sh"
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"bulkhead.terminal.v1", "bearer." + acmeToken}})
	if err != nil {
		t.Fatalf("websocket: %v (%v)", err, resp)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, []byte(`{"cols":90,"rows":20}`)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("echo $((7*6))x; exit\n")); err != nil {
		t.Fatal(err)
	}
	var wsOut strings.Builder
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("websocket read: %v", err)
			}
			break
		}
		if typ == websocket.MessageBinary {
			wsOut.Write(data)
		} else if !strings.Contains(string(data), `"exit_code":0`) {
			t.Errorf("exit message %s", data)
		}
	}
	if !strings.Contains(wsOut.String(), "42x") {
		t.Errorf("websocket terminal output %q", wsOut.String())
	}
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: run.GetRunId()})); err != nil {
		t.Fatal(err)
	}
}

// TestResumeRun: a canceled run continues from its saved state with
// ResumeRun(run_id), and a client's RunState (as `harness run` saves it)
// becomes a new run.
func TestResumeRun(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: run.GetRunId(), Reason: "later"})); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunId: "run-000000000000000000000000"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("resume unknown: %v", err)
	}
	res, err := acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunId: run.GetRunId()}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetRun().GetRunId() != run.GetRunId() {
		t.Fatalf("resumed %v", res.Msg.GetRun())
	}
	w := waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if len(w.GetPendingApprovals()) != 1 {
		t.Fatalf("resumed run: %v", w)
	}
	if _, err := acme.runs.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: run.GetRunId(), CallId: "c1", Approved: true})); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if _, err := acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunId: run.GetRunId()})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("resume a succeeded run: %v", err)
	}

	// A client's run state: the conversation so far, stopped on a call
	// that is rejected; the new run answers the model and finishes.
	call := harness.ToolCall{ID: "c1", Name: "exec_command", Kind: model.ToolFunction, Input: `{"cmd":"rm -rf /"}`}
	rs := &harness.RunState{Version: harness.RunStateVersion, Agent: "worker", Turn: 1,
		Items:   []model.Item{model.UserMessage("Write a file."), {Kind: model.ItemFunctionCall, CallID: "c1", Name: "exec_command", Arguments: call.Input}},
		Pending: []*harness.PendingCall{{Call: call, Agent: "worker"}},
		// A client's state cannot point the service at a sandbox.
		Sessions: map[string]*compute.State{"worker": {Version: compute.StateVersion, Provider: "local", SessionID: "someone-elses"}}}
	if err := rs.Reject("c1", "no"); err != nil {
		t.Fatal(err)
	}
	stateJSON, err := rs.Encode()
	if err != nil {
		t.Fatal(err)
	}
	state := string(stateJSON)
	if _, err := acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunState: []byte(state), Agent: &harnessv1.AgentSpec{Name: "other"}})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a state for another agent: %v", err)
	}
	res, err = acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunState: []byte(state), Agent: &harnessv1.AgentSpec{Name: "worker"}}))
	if err != nil {
		t.Fatalf("resume from a run state: %v", err)
	}
	fresh := waitStatus(t, ctx, acme, res.Msg.GetRun().GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if fresh.GetFinalOutput() != "Done." || fresh.GetRunId() == run.GetRunId() {
		t.Errorf("run from a state: %v", fresh)
	}
}
