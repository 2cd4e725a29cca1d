package service_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// TestStrictJSONRefusesUnknownFields: a JSON request with a field the
// contract does not have is refused with InvalidArgument naming the field,
// and does nothing: {"approve": true} (for "approved") used to be read as
// a rejection, and the run went on as if a human had said no.
func TestStrictJSONRefusesUnknownFields(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)

	for _, c := range []struct{ method, body, field string }{
		{"ApproveToolCall", `{"runId": "` + run.GetRunId() + `", "callId": "c1", "approve": true}`, "approve"},
		{"StartRun", `{"input": "x", "approvals": {"requireApprovals": ["exec_command"]}}`, "requireApprovals"},
		{"CancelRun", `{"runId": "` + run.GetRunId() + `", "reasons": "typo"}`, "reasons"},
	} {
		code, body := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/"+c.method, acmeToken, c.body)
		var got struct{ Code, Message string }
		_ = json.Unmarshal([]byte(body), &got)
		if code != http.StatusBadRequest || got.Code != "invalid_argument" || !strings.Contains(got.Message, `"`+c.field+`"`) {
			t.Errorf("%s with %q: %d %s; want 400 invalid_argument naming %q", c.method, c.field, code, body, c.field)
		}
	}
	// Nothing changed: the run still waits for the decision on c1, and
	// no other run was started.
	waiting := waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if p := waiting.GetPendingApprovals(); len(p) != 1 || p[0].GetCallId() != "c1" {
		t.Errorf("pending approvals after the refused calls: %v", p)
	}
	code, body := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/ListRuns", acmeToken, `{}`)
	if code != http.StatusOK || strings.Count(body, `"runId"`) != 1 {
		t.Errorf("ListRuns: %d %s", code, body)
	}
	// The field spelt right is taken.
	code, body = rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/ApproveToolCall", acmeToken,
		`{"runId": "`+run.GetRunId()+`", "callId": "c1", "approved": true}`)
	if code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, body)
	}
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
}
