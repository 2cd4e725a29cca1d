package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// Runs started in an existing sandbox (StartRunRequest.sandbox_id): the
// run uses the caller's sandbox and never deletes it.

// echoScript runs cmd, then answers with the command's output as its
// final message, so the run's final output shows what it saw.
func echoScript(cmd string) replay.Responder {
	return func(req *replay.Request) replay.Turn {
		outs := req.InputOfType("function_call_output")
		if len(outs) == 0 {
			args, _ := json.Marshal(map[string]string{"cmd": cmd})
			return replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", string(args))}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message(fmt.Sprint(outs[len(outs)-1]["output"]))}}
	}
}

// runCall POSTs a JSON request to a RunService method and decodes the
// answer.
func runCall(t *testing.T, ctx context.Context, e *env, token, method string, req any) (int, obj) {
	t.Helper()
	return jsonCall(t, ctx, e, token, "RunService/"+method, req)
}

// approveAndFinish approves call c1 of a run waiting in a caller's
// sandbox and checks that the run succeeds having seen the caller's file.
func approveAndFinish(t *testing.T, ctx context.Context, e *env, runID string) {
	t.Helper()
	if code, out := runCall(t, ctx, e, acmeToken, "ApproveToolCall", obj{"runId": runID, "callId": "c1", "approved": true}); code != http.StatusOK {
		t.Fatalf("approve: %d %v", code, out)
	}
	done := waitStatus(t, ctx, e.clients(acmeToken), runID, harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if !strings.Contains(done.GetFinalOutput(), "from the caller") {
		t.Fatalf("run: %v", done)
	}
}

// startInSandbox starts a run in sandbox id over JSON and returns its id
// (approvals: tools that wait for a decision).
func startInSandbox(t *testing.T, ctx context.Context, e *env, id string, approvals ...string) string {
	t.Helper()
	req := obj{"agent": obj{"name": "worker"}, "input": "Read the file.", "sandboxId": id}
	if len(approvals) > 0 {
		req["approvals"] = obj{"requireApproval": approvals}
	}
	code, out := runCall(t, ctx, e, acmeToken, "StartRun", req)
	if code != http.StatusOK || fieldStr(out, "run", "sandboxId") != id {
		t.Fatalf("StartRun in %s: %d %v", id, code, out)
	}
	return fieldStr(out, "run", "runId")
}

// startRefused is a StartRun in a sandbox that must fail with code, its
// message holding words.
func startRefused(t *testing.T, ctx context.Context, e *env, token string, req obj, status int, code string, words ...string) {
	t.Helper()
	req["input"] = "Read the file."
	got, out := runCall(t, ctx, e, token, "StartRun", req)
	msg, _ := out["message"].(string)
	if got != status || out["code"] != code {
		t.Fatalf("StartRun %v: %d %v, want %d %s", req, got, out, status, code)
	}
	for _, w := range words {
		if !strings.Contains(msg, w) {
			t.Fatalf("StartRun %v: message %q does not say %q", req, msg, w)
		}
	}
}

// stillThere checks that sandbox id exists and runs commands, its file
// state.txt intact.
func stillThere(t *testing.T, ctx context.Context, e *env, id, when string) {
	t.Helper()
	sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id})
	if out := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "cat state.txt"}); fieldStr(out, "stdout") != "from the caller" {
		t.Fatalf("%s: RunCommand: %v", when, out)
	}
}

// newCallerSandbox makes an API sandbox holding state.txt.
func newCallerSandbox(t *testing.T, ctx context.Context, e *env, req obj) string {
	t.Helper()
	id := createSandbox(t, ctx, e, acmeToken, req)
	if code, body := httpDo(t, ctx, http.MethodPut, e.url+"/v1/sandboxes/"+id+"/files/state.txt", acmeToken, strings.NewReader("from the caller")); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}
	return id
}

func TestRunInSandboxSucceedsAndKeepsIt(t *testing.T) {
	// One sandbox slot: the run takes none of its own.
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Sandboxes: 1} })
	e.script.SetFallback(echoScript("cat state.txt"))
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	id := newCallerSandbox(t, ctx, e, obj{})

	runID := startInSandbox(t, ctx, e, id)
	done := waitStatus(t, ctx, acme, runID, harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if !strings.Contains(done.GetFinalOutput(), "from the caller") || done.GetSandboxId() != id {
		t.Fatalf("the run did not see the caller's file: %v", done)
	}
	stillThere(t, ctx, e, id, "after the run")
	// The sandbox is free again: a second run works in it.
	again := startInSandbox(t, ctx, e, id)
	waitStatus(t, ctx, acme, again, harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	// Listed once, as the caller's (not as a run's).
	list := sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{})
	if sbs, _ := list["sandboxes"].([]any); len(sbs) != 1 || fieldStr(sbs[0].(obj), "runId") != "" {
		t.Fatalf("ListSandboxes: %v", list)
	}
	// Nor does a restart reap it with its finished runs.
	e.restart()
	stillThere(t, ctx, e, id, "after a restart")
}

func TestRunInSandboxRefusals(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.script.SetFallback(echoScript("cat state.txt"))
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	id := newCallerSandbox(t, ctx, e, obj{})

	// Another tenant's sandbox, and none, are not found alike.
	startRefused(t, ctx, e, evilToken, obj{"sandboxId": id}, http.StatusNotFound, "not_found", "sandbox not found")
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": "sbx-000000000000000000000000"}, http.StatusNotFound, "not_found", "sandbox not found")
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": "box-1"}, http.StatusBadRequest, "invalid_argument", "sandbox_id")
	// The sandbox has its workspace: no manifest, no account.
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": id, "manifest": sbxManifest}, http.StatusBadRequest, "invalid_argument", "manifest")
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": id, "agent": obj{"runAs": "dev"}}, http.StatusBadRequest, "invalid_argument", "run_as")

	// A paused sandbox is refused until it is resumed.
	sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": id}, http.StatusBadRequest, "failed_precondition", "paused")
	sbxOK(t, ctx, e, acmeToken, "ResumeSandbox", obj{"sandboxId": id})

	// One run at a time; while it is active, the sandbox cannot be
	// deleted or paused.
	first := startInSandbox(t, ctx, e, id, "exec_command")
	waitStatus(t, ctx, acme, first, harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": id}, http.StatusBadRequest, "failed_precondition", first)
	sbxRefused(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": id}, 400, "failed_precondition", first, "cancel the run")
	sbxRefused(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id}, 400, "failed_precondition", first)

	// Canceled, the run leaves the sandbox as it was.
	if code, out := runCall(t, ctx, e, acmeToken, "CancelRun", obj{"runId": first}); code != http.StatusOK || fieldStr(out, "run", "status") != "RUN_STATUS_CANCELED" {
		t.Fatalf("CancelRun: %d %v", code, out)
	}
	stillThere(t, ctx, e, id, "after a cancel")
	// Deleted after its run ended, it is gone for good.
	sbxOK(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": id})
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", id)
	// Its run, resumed, finds it gone.
	code, out := runCall(t, ctx, e, acmeToken, "ResumeRun", obj{"runId": first})
	if code != http.StatusNotFound {
		t.Fatalf("ResumeRun without its sandbox: %d %v", code, out)
	}
}

func TestRunInSandboxIsBusy(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.script.SetFallback(echoScript("cat state.txt"))
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	id := newCallerSandbox(t, ctx, e, obj{"idleTimeout": "1s"})
	runID := startInSandbox(t, ctx, e, id, "exec_command")
	waitStatus(t, ctx, acme, runID, harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	// Idle for three idle timeouts by the API's clock, but its run uses it.
	time.Sleep(3 * time.Second)
	sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id})
	approveAndFinish(t, ctx, e, runID)
	// Free again, it is reaped once idle, as any API sandbox.
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", id)
}

func TestRunInSandboxRestart(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.script.SetFallback(echoScript("cat state.txt"))
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	id := newCallerSandbox(t, ctx, e, obj{})
	runID := startInSandbox(t, ctx, e, id, "exec_command")
	waitStatus(t, ctx, acme, runID, harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)

	// After a restart the run waits again, in the same sandbox, which it
	// still holds.
	e.restart()
	acme = e.clients(acmeToken)
	if r := waitStatus(t, ctx, acme, runID, harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL); r.GetSandboxId() != id {
		t.Fatalf("recovered run: %v", r)
	}
	startRefused(t, ctx, e, acmeToken, obj{"sandboxId": id}, http.StatusBadRequest, "failed_precondition", runID)
	approveAndFinish(t, ctx, e, runID)
	stillThere(t, ctx, e, id, "after the recovered run")

	// A run whose sandbox is gone after a crash fails cleanly.
	other := startInSandbox(t, ctx, e, id, "exec_command")
	waitStatus(t, ctx, acme, other, harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	e.crash()
	rec, err := e.store.GetSandbox(ctx, "token:acme", id)
	if err != nil {
		t.Fatal(err)
	}
	rec.Gone = true
	if err := e.store.UpdateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	e.start()
	acme = e.clients(acmeToken)
	failed := waitStatus(t, ctx, acme, other, harnessv1.RunStatus_RUN_STATUS_FAILED)
	if !strings.Contains(failed.GetError(), id) {
		t.Fatalf("run without its sandbox: %v", failed)
	}
}

func TestRunInSandboxPausedByIdle(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.script.SetFallback(echoScript("cat state.txt"))
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	id := newCallerSandbox(t, ctx, e, obj{"idleTimeout": "1s", "onIdle": "ON_IDLE_PAUSE"})
	for fieldStr(sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id}), "sandbox", "status") != "SANDBOX_STATUS_PAUSED" {
		select {
		case <-ctx.Done():
			t.Fatal("the idle sandbox was never paused")
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Paused by its on_idle policy: the run's first use resumes it.
	runID := startInSandbox(t, ctx, e, id)
	done := waitStatus(t, ctx, acme, runID, harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if !strings.Contains(done.GetFinalOutput(), "from the caller") {
		t.Fatalf("run in a sandbox paused by idle: %v", done)
	}
}
