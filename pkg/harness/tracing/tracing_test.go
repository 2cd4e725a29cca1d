package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tracing"
)

// secrets the fake run below handles; none may reach a span.
var secrets = []string{
	"sk-TOPSECRET-openai-key",       // environment of the harness
	"ghp_TOPSECRETgittoken",         // a credential in a command
	"TOPSECRET file line",           // file contents
	"TOPSECRET prompt instructions", // the prompt
	"TOPSECRET model output",        // the model's answer
}

func recorder() (*tracetest.SpanRecorder, *tracing.Tracer) {
	rec := tracetest.NewSpanRecorder()
	return rec, tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
}

func attrs(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// apiError stands for a model API's error type.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.Status, e.Message) }

// fakeRun drives the helpers the way the runner does, through two turns
// with tool calls whose inputs, outputs and errors carry secrets.
func fakeRun(ctx context.Context, tr *tracing.Tracer) {
	prompt := "instructions: " + secrets[3] + " key " + secrets[0]
	ctx, run := tr.StartRun(ctx, "coder", tracing.WithMaxTurns(10), tracing.WithResumed(false), tracing.WithStreamed(true))
	tracing.SetSession(run, "s-1", "local")

	// Turn 1: the model calls a tool that fails for the model, and one
	// that fails for the harness with an error quoting a file.
	tctx, turn := tr.StartTurn(ctx, 1, "coder", "gpt-test")
	mctx, call := tr.StartModelCall(tctx, "gpt-test")
	_ = mctx
	_ = prompt // the helpers take no prompt
	resp := &model.Response{ID: "resp_1", Model: "gpt-test-2025", Status: "completed", Attempts: 2,
		Output: []model.Item{{Kind: model.ItemMessage}},
		Usage:  model.Usage{Requests: 1, InputTokens: 120, CachedInputTokens: 20, OutputTokens: 30, ReasoningTokens: 5, TotalTokens: 150}}
	tracing.EndModelCall(call, resp, nil)

	input := `{"cmd":"git clone https://x:` + secrets[1] + `@github.com/o/r"}`
	_, tc := tr.StartToolCall(tctx, "exec_command", "call_1")
	_ = input // the helpers take no input
	tracing.EndToolCall(tc, true, nil)

	fileErr := fmt.Errorf("apply_patch: %w", fmt.Errorf("%w: searched for %q", errkind.ErrPatchRejected, secrets[2]))
	_, tc = tr.StartToolCall(tctx, "apply_patch", "call_2")
	tracing.EndToolCall(tc, false, fileErr)
	tracing.RecordApproval(tctx, "exec_command", "call_3", tracing.ApprovalPending)
	tracing.EndTurn(turn, nil)

	// Turn 2: the model call fails with an error echoing the key; a handoff.
	tctx, turn = tr.StartTurn(ctx, 2, "coder", "gpt-test")
	_, call = tr.StartModelCall(tctx, "gpt-test")
	tracing.EndModelCall(call, nil, fmt.Errorf("responses: %w", &apiError{Status: 401, Message: "bad key " + secrets[0]}))
	_, h := tr.StartHandoff(tctx, "coder", "reviewer")
	tracing.EndHandoff(h, nil)
	tracing.EndTurn(turn, errors.New("model said: "+secrets[4]))
	tracing.EndRun(run, tracing.RunResult{Turns: 2, FinalAgent: "reviewer", PendingApprovals: 1,
		Usage: model.Usage{Requests: 2, InputTokens: 240}}, fmt.Errorf("run: %s", secrets[0]))
}

// No attribute, event, status or span name holds anything the helpers
// were not given as a name or a number.
func TestNoSecretsInSpans(t *testing.T) {
	rec, tr := recorder()
	fakeRun(context.Background(), tr)
	spans := rec.Ended()
	if len(spans) != 8 {
		t.Fatalf("%d spans, want 8", len(spans))
	}
	check := func(where, v string) {
		for _, s := range secrets {
			if strings.Contains(v, s) || strings.Contains(v, "TOPSECRET") {
				t.Errorf("%s holds a secret: %q", where, v)
			}
		}
	}
	for _, sp := range spans {
		check("span name", sp.Name())
		check(sp.Name()+" status", sp.Status().Description)
		for _, kv := range sp.Attributes() {
			check(sp.Name()+" "+string(kv.Key), kv.Value.String())
		}
		for _, ev := range sp.Events() {
			check(sp.Name()+" event", ev.Name)
			for _, kv := range ev.Attributes {
				check(sp.Name()+" event "+string(kv.Key), kv.Value.String())
			}
		}
		for _, l := range sp.Links() {
			for _, kv := range l.Attributes {
				check(sp.Name()+" link "+string(kv.Key), kv.Value.String())
			}
		}
	}
}

// The spans have the documented names, attributes, kinds and nesting.
func TestSpanShapes(t *testing.T) {
	rec, tr := recorder()
	fakeRun(context.Background(), tr)
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		byName[sp.Name()] = append(byName[sp.Name()], sp)
	}
	one := func(name string) (sdktrace.ReadOnlySpan, map[string]attribute.Value) {
		t.Helper()
		if len(byName[name]) == 0 {
			t.Fatalf("no span %q", name)
		}
		sp := byName[name][0]
		return sp, attrs(sp.Attributes())
	}

	run, ra := one("invoke_agent coder")
	if run.Parent().IsValid() {
		t.Error("the run span has a parent")
	}
	for k, want := range map[string]string{
		"gen_ai.operation.name": "invoke_agent", "bulkhead.agent": "coder", "gen_ai.agent.name": "coder",
		"bulkhead.session.id": "s-1", "bulkhead.provider": "local", "bulkhead.run.final_agent": "reviewer",
		"error.type": "_OTHER",
	} {
		if got := ra[k].String(); got != want {
			t.Errorf("run %s = %q, want %q", k, got, want)
		}
	}
	if ra["bulkhead.run.max_turns"].AsInt64() != 10 || ra["bulkhead.run.turns"].AsInt64() != 2 ||
		!ra["bulkhead.run.interrupted"].AsBool() || ra["bulkhead.run.pending_approvals"].AsInt64() != 1 ||
		!ra["bulkhead.run.streamed"].AsBool() || ra["bulkhead.run.resumed"].AsBool() ||
		ra["gen_ai.usage.input_tokens"].AsInt64() != 240 || ra["bulkhead.usage.requests"].AsInt64() != 2 {
		t.Errorf("run attributes: %v", ra)
	}
	if run.Status().Code != codes.Error || run.Status().Description != "_OTHER" {
		t.Errorf("run status = %v", run.Status())
	}

	turns := byName["turn"]
	if len(turns) != 2 {
		t.Fatalf("%d turns", len(turns))
	}
	for i, sp := range turns {
		a := attrs(sp.Attributes())
		if a["bulkhead.turn"].AsInt64() != int64(i+1) || a["gen_ai.request.model"].AsString() != "gpt-test" || a["bulkhead.agent"].AsString() != "coder" {
			t.Errorf("turn %d attributes: %v", i+1, a)
		}
		if sp.Parent().SpanID() != run.SpanContext().SpanID() {
			t.Errorf("turn %d is not under the run", i+1)
		}
	}
	if turns[0].Status().Code == codes.Error || turns[1].Status().Code != codes.Error {
		t.Errorf("turn statuses: %v, %v", turns[0].Status(), turns[1].Status())
	}
	if ev := turns[0].Events(); len(ev) != 1 || ev[0].Name != "approval" ||
		attrs(ev[0].Attributes)["bulkhead.approval.decision"].AsString() != "pending" ||
		attrs(ev[0].Attributes)["bulkhead.tool.call_id"].AsString() != "call_3" {
		t.Errorf("approval events: %v", ev)
	}

	calls := byName["chat gpt-test"]
	if len(calls) != 2 {
		t.Fatalf("%d model calls", len(calls))
	}
	ma := attrs(calls[0].Attributes())
	if calls[0].SpanKind().String() != "client" || ma["gen_ai.operation.name"].AsString() != "chat" ||
		ma["gen_ai.request.model"].AsString() != "gpt-test" || ma["gen_ai.response.model"].AsString() != "gpt-test-2025" ||
		ma["gen_ai.response.id"].AsString() != "resp_1" || ma["bulkhead.model.status"].AsString() != "completed" ||
		ma["bulkhead.model.attempts"].AsInt64() != 2 || ma["gen_ai.usage.input_tokens"].AsInt64() != 120 ||
		ma["gen_ai.usage.output_tokens"].AsInt64() != 30 || ma["bulkhead.usage.cached_input_tokens"].AsInt64() != 20 ||
		ma["bulkhead.usage.reasoning_tokens"].AsInt64() != 5 || ma["bulkhead.usage.total_tokens"].AsInt64() != 150 {
		t.Errorf("model call: kind %v, attributes %v", calls[0].SpanKind(), ma)
	}
	if calls[0].Parent().SpanID() != turns[0].SpanContext().SpanID() {
		t.Error("the model call is not under its turn")
	}
	if got := attrs(calls[1].Attributes())["error.type"].AsString(); got != "*tracing_test.apiError" || calls[1].Status().Code != codes.Error {
		t.Errorf("failed model call: error.type %q, status %v", got, calls[1].Status())
	}

	ex, ea := one("execute_tool exec_command")
	if ea["bulkhead.tool.name"].AsString() != "exec_command" || ea["gen_ai.tool.name"].AsString() != "exec_command" ||
		ea["bulkhead.tool.call_id"].AsString() != "call_1" || ea["gen_ai.tool.call.id"].AsString() != "call_1" ||
		!ea["bulkhead.tool.is_error"].AsBool() || ea["error.type"].AsString() != "tool_error" || ex.Status().Code != codes.Error {
		t.Errorf("tool call: %v, status %v", ea, ex.Status())
	}
	ap, aa := one("execute_tool apply_patch")
	if aa["bulkhead.tool.is_error"].AsBool() || aa["error.type"].AsString() != "patch_rejected" || ap.Status().Description != "patch_rejected" {
		t.Errorf("failed tool call: %v, status %v", aa, ap.Status())
	}
	_, ha := one("handoff")
	if ha["bulkhead.handoff.from"].AsString() != "coder" || ha["bulkhead.handoff.to"].AsString() != "reviewer" {
		t.Errorf("handoff: %v", ha)
	}
}

// A nil *Tracer and New(nil) use the global provider: a no-op unless the
// application set one.
func TestNilTracerIsGlobal(t *testing.T) {
	for _, tr := range []*tracing.Tracer{nil, tracing.New(nil), {}} {
		ctx, sp := tr.StartRun(context.Background(), "a")
		_, tsp := tr.StartToolCall(ctx, "t", "c")
		tracing.EndToolCall(tsp, false, nil)
		tracing.EndRun(sp, tracing.RunResult{}, nil)
		if sp.SpanContext().IsValid() {
			t.Error("the global no-op provider made a real span")
		}
	}
}

func TestErrorType(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", context.Canceled), "canceled"},
		{fmt.Errorf("x: %w", errkind.ErrCanceled), "canceled"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{&errkind.PathError{Op: "read", Path: "a", Err: errkind.ErrNotFound}, "not_found"},
		{errkind.Errorf(errkind.ErrPathEscape, "secret path"), "path_escape"},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", &fs.PathError{Op: "open", Path: "p", Err: errors.ErrUnsupported})), "*fs.PathError"},
		{errors.Join(fmt.Errorf("a: %w", &fs.PathError{Op: "open", Path: "p", Err: fs.ErrPermission})), "permission_denied"},
		{fmt.Errorf("a: %w", &apiError{Status: 500}), "*tracing_test.apiError"},
		{errors.New("plain"), "_OTHER"},
	} {
		if got := tracing.ErrorType(c.err); got != c.want {
			t.Errorf("ErrorType(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
