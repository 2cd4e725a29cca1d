package service_test

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// serviceGoroutines returns the stacks of the goroutines running (or
// started by) code of package service or its manager, by goroutine id,
// but the HTTP server's (Serve's, which its context stops).
func serviceGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		id, _, _ := strings.Cut(strings.TrimPrefix(header, "goroutine "), " ")
		if strings.Contains(g, "harness/service.Serve(") || strings.Contains(g, "harness/service.serve.func") {
			continue
		}
		for _, pkg := range []string{"bulkhead/pkg/harness/service.", "bulkhead/pkg/harness/service/manager."} {
			if strings.Contains(g, pkg) {
				out[id] = g
			}
		}
	}
	return out
}

// checkNoGoroutines fails when a goroutine of the service, other than
// those of before, is still there. A goroutine that has just done its work
// is given a moment to return, as goleak does.
func checkNoGoroutines(t *testing.T, before map[string]string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var left []string
		for id, stack := range serviceGoroutines() {
			if _, old := before[id]; !old {
				left = append(left, stack)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the service outlive its Shutdown:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sandboxExists reports whether the env's provider still has the sandbox
// of session id.
func (e *env) sandboxExists(t *testing.T, id string) bool {
	t.Helper()
	infos, err := e.prov.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		if i.SessionID == id {
			return true
		}
	}
	return false
}

// waitSandboxGone waits until the sandbox of a run is deleted: gone from
// the provider and recorded gone in the store.
func (e *env) waitSandboxGone(t *testing.T, ctx context.Context, runID, sandboxID string) {
	t.Helper()
	for {
		rec, err := e.store.GetRun(ctx, "token:acme", runID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.SandboxGone && !e.sandboxExists(t, sandboxID) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the sandbox %s of run %s was never deleted (record gone: %v)", sandboxID, runID, rec.SandboxGone)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// setDeadline moves the deadline of a finished run's kept sandbox.
func (e *env) setDeadline(t *testing.T, ctx context.Context, runID string, at time.Time) {
	t.Helper()
	rec, err := e.store.GetRun(ctx, "token:acme", runID)
	if err != nil {
		t.Fatal(err)
	}
	rec.SandboxExpires = at.UTC().Truncate(time.Microsecond)
	if err := e.store.UpdateRun(ctx, rec); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownLeavesNoGoroutine: once Shutdown returns, no goroutine of
// the service (or its manager) is left, with a finished run's sandbox
// kept (its deletion pending), event streams open over SSE and gRPC, and
// terminals open over gRPC and a WebSocket: the streams and terminals
// ended, and the kept sandbox waits for the next service with its
// deadline in the store.
func TestShutdownLeavesNoGoroutine(t *testing.T) {
	before := serviceGoroutines()
	e := newEnv(t, nil, func(c *service.Config) { c.SandboxRetention = time.Hour })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	finished := waitStatus(t, ctx, acme, startRun(t, ctx, acme).GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	run := startRun(t, ctx, acme, "exec_command")
	run = waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)

	sse, _ := e.readSSE(t, ctx, acmeToken, run.GetRunId(), "")
	var seen []sseEvent
	until(t, sse, "approval_requested", &seen)
	grpcEvents, err := acme.grpc.StreamRunEvents(ctx, connect.NewRequest(&harnessv1.StreamRunEventsRequest{RunId: run.GetRunId()}))
	if err != nil || !grpcEvents.Receive() {
		t.Fatalf("gRPC event stream: %v %v", err, grpcEvents.Err())
	}
	term := acme.sandbox.OpenTerminal(ctx)
	if err := term.Send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Start{Start: &harnessv1.TerminalStart{
		SandboxId: run.GetSandboxId(), Command: []string{"/bin/sh"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := term.Send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Stdin{Stdin: []byte("echo grpc-ready\n")}}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for !strings.Contains(out.String(), "grpc-ready\r\n") || strings.Count(out.String(), "grpc-ready") < 2 {
		m, err := term.Receive()
		if err != nil {
			t.Fatalf("terminal: %v (%q)", err, out.String())
		}
		out.Write(m.GetOutput())
	}
	url := strings.Replace(e.url, "http://", "ws://", 1) + "/v1/sandboxes/" + run.GetSandboxId() + "/terminal?command=/bin/sh"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"bulkhead.terminal.v1", "bearer." + acmeToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("echo ws-ready\n")); err != nil {
		t.Fatal(err)
	}
	wsEnded := make(chan error, 1)
	wsReady := make(chan struct{})
	go func() { // a client reads until the server closes
		var got strings.Builder
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				wsEnded <- err
				return
			}
			got.Write(data)
			if strings.Count(got.String(), "ws-ready") == 2 {
				close(wsReady)
			}
		}
	}()
	select {
	case <-wsReady:
	case err := <-wsEnded:
		t.Fatalf("websocket terminal: %v", err)
	}

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.svc.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	checkNoGoroutines(t, before)
	e.stop() // the HTTP server

	// Every stream and terminal ended.
	for range sse {
	}
	for grpcEvents.Receive() {
	}
	if connect.CodeOf(grpcEvents.Err()) != connect.CodeUnavailable {
		t.Errorf("the gRPC event stream ended with %v, want Unavailable", grpcEvents.Err())
	}
	for {
		if _, err := term.Receive(); err != nil {
			break
		}
	}
	if err := <-wsEnded; err == nil {
		t.Error("the WebSocket terminal did not end")
	}
	// The kept sandbox waits for the next service.
	rec, err := e.store.GetRun(ctx, "token:acme", finished.GetRunId())
	if err != nil {
		t.Fatal(err)
	}
	if rec.SandboxGone || !rec.SandboxExpires.After(time.Now()) || !e.sandboxExists(t, finished.GetSandboxId()) {
		t.Errorf("the kept sandbox after Shutdown: gone %v, deadline %v, exists %v", rec.SandboxGone, rec.SandboxExpires, e.sandboxExists(t, finished.GetSandboxId()))
	}
}

// TestKeptSandboxesAfterACrash: the sandboxes a crashed service kept for
// finished runs are found by the next one from its store: those whose
// deadline passed are deleted at once, the others kept (listed, their
// files readable) until their deadline.
func TestKeptSandboxesAfterACrash(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.SandboxRetention = time.Hour })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	expired := waitStatus(t, ctx, acme, startRun(t, ctx, acme).GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	kept := waitStatus(t, ctx, acme, startRun(t, ctx, acme).GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	for _, r := range []*harnessv1.Run{expired, kept} {
		if r.GetSandboxId() == "" || !e.sandboxExists(t, r.GetSandboxId()) {
			t.Fatalf("run %s keeps no sandbox", r.GetRunId())
		}
	}
	// The service dies (no Shutdown: its timers die with it); the first
	// deadline passes while it is down.
	e.crash()
	e.setDeadline(t, ctx, expired.GetRunId(), time.Now().Add(-time.Minute))

	e.start()
	acme = e.clients(acmeToken)
	e.waitSandboxGone(t, ctx, expired.GetRunId(), expired.GetSandboxId())
	sbs, err := acme.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{}))
	if err != nil || len(sbs.Msg.GetSandboxes()) != 1 || sbs.Msg.GetSandboxes()[0].GetSandboxId() != kept.GetSandboxId() ||
		sbs.Msg.GetSandboxes()[0].GetExpireTime() == nil {
		t.Fatalf("sandboxes after the crash: %v %v", sbs, err)
	}
	rf, err := acme.sandbox.ReadSandboxFile(ctx, connect.NewRequest(&harnessv1.ReadSandboxFileRequest{SandboxId: kept.GetSandboxId(), Path: "out.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	var content []byte
	for rf.Receive() {
		content = append(content, rf.Msg().GetData()...)
	}
	if rf.Err() != nil || string(content) != "hi\n" {
		t.Fatalf("a kept sandbox's file after the crash: %q %v", content, rf.Err())
	}
	// Its deadline is honoured too (brought forward here).
	e.crash()
	e.setDeadline(t, ctx, kept.GetRunId(), time.Now().Add(time.Second))
	e.start()
	e.waitSandboxGone(t, ctx, kept.GetRunId(), kept.GetSandboxId())
}

// TestKeptSandboxDeletedAtItsDeadlineAfterShutdown: a sandbox kept for a
// finished run outlives a graceful restart, holds its tenant's sandbox
// slot in the next service, and is deleted at its deadline by it.
func TestKeptSandboxDeletedAtItsDeadlineAfterShutdown(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) {
		c.SandboxRetention = time.Hour
		c.Quotas = service.Quotas{Sandboxes: 1}
	})
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := waitStatus(t, ctx, acme, startRun(t, ctx, acme).GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	e.stop()
	if !e.sandboxExists(t, run.GetSandboxId()) {
		t.Fatal("Shutdown deleted a sandbox whose retention had not ended")
	}
	e.setDeadline(t, ctx, run.GetRunId(), time.Now().Add(3*time.Second))
	e.start()
	acme = e.clients(acmeToken)
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "another"}))
	refusedWith(t, "a run while the kept sandbox lives", err, connect.CodeResourceExhausted, "sandboxes per tenant")
	e.waitSandboxGone(t, ctx, run.GetRunId(), run.GetSandboxId())
	waitStatus(t, ctx, acme, startRun(t, ctx, acme).GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
}

// TestErrorsByClass: an error reaches a client with the code of its
// errkind class, over gRPC, Connect's JSON and the hand-written routes
// (classes the service used to answer Internal included).
func TestErrorsByClass(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := waitStatus(t, ctx, acme, startRun(t, ctx, acme, "exec_command").GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	sbx := run.GetSandboxId()

	// not_directory: FailedPrecondition (gRPC), 400 (Connect JSON).
	_, err := acme.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: sbx, Path: "notes.md"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("listing a file: %v, want FailedPrecondition", err)
	}
	code, body := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.SandboxService/ListSandboxDir", acmeToken,
		`{"sandboxId": "`+sbx+`", "path": "notes.md"}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `"failed_precondition"`) {
		t.Errorf("listing a file over JSON: %d %s", code, body)
	}
	// is_directory: FailedPrecondition.
	rf, err := acme.sandbox.ReadSandboxFile(ctx, connect.NewRequest(&harnessv1.ReadSandboxFileRequest{SandboxId: sbx, Path: "."}))
	if err == nil {
		for rf.Receive() {
		}
		err = rf.Err()
	}
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("reading a directory: %v, want FailedPrecondition", err)
	}
	// Hand-written routes: not_found 404, invalid_argument 400, with
	// Connect's JSON shape.
	for path, want := range map[string]int{
		"/v1/sandboxes/" + sbx + "/files/missing.txt":    http.StatusNotFound,
		"/v1/sandboxes/" + sbx + "/files/a%00b":          http.StatusBadRequest,
		"/v1/runs/run-000000000000000000000000/events":   http.StatusNotFound,
		"/v1/runs/" + run.GetRunId() + "/events?after=x": http.StatusBadRequest,
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+acmeToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("GET %s: %d %s, want %d", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
	}
	// unavailable: a draining service starts nothing (503 over JSON).
	e.svc.Drain()
	code, body = rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/StartRun", acmeToken, `{"input": "late"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"unavailable"`) {
		t.Errorf("StartRun while draining: %d %s", code, body)
	}
}
