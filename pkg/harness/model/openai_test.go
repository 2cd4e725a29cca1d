package model_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

const testKey = "sk-test-SECRET-0123456789"

// sleeps records the retry delays asked for, without waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

func newServer(t *testing.T, turns ...replay.Turn) *replay.Server {
	t.Helper()
	srv := replay.NewServer(turns...)
	t.Cleanup(func() {
		srv.Close()
		if err := srv.Err(); err != nil {
			t.Errorf("scripted server: %v", err)
		}
	})
	return srv
}

func newModel(t *testing.T, srv *replay.Server, edit ...func(*model.Config)) (*model.OpenAI, *sleeps) {
	t.Helper()
	sl := &sleeps{}
	cfg := model.Config{
		Model:   "gpt-test",
		APIKey:  testKey,
		BaseURL: srv.URL(),
		Retry:   model.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 8 * time.Millisecond, Sleep: sl.sleep},
	}
	for _, e := range edit {
		e(&cfg)
	}
	m, err := model.NewOpenAI(cfg)
	if err != nil {
		t.Fatalf("NewOpenAI: %v", err)
	}
	return m, sl
}

// run drains one call, returning the events and the final response.
func run(t *testing.T, m model.Model, req *model.Request) ([]model.Event, *model.Response) {
	t.Helper()
	var evs []model.Event
	for ev, err := range m.Stream(context.Background(), req) {
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		evs = append(evs, ev)
		if ev.Kind == model.EventCompleted {
			return evs, ev.Response
		}
	}
	t.Fatal("stream ended without a completed response")
	return nil, nil
}

func deltas(evs []model.Event, k model.EventKind) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == k {
			b.WriteString(ev.Delta)
		}
	}
	return b.String()
}

func count(evs []model.Event, k model.EventKind) int {
	n := 0
	for _, ev := range evs {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

// asJSON normalizes v through JSON for comparisons with decoded bodies.
func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTextStreaming(t *testing.T) {
	const text = "Hello, streaming wörld! Deltas arrive in pieces."
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message(text)},
		Usage: replay.Usage{InputTokens: 12, CachedTokens: 4, OutputTokens: 9}})
	m, _ := newModel(t, srv)

	evs, res := run(t, m, &model.Request{Instructions: "Be brief.", Input: []model.Item{model.UserMessage("hi")}})
	if got := deltas(evs, model.EventTextDelta); got != text {
		t.Errorf("deltas = %q, want %q", got, text)
	}
	if n := count(evs, model.EventTextDelta); n < 2 {
		t.Errorf("got %d text deltas, want several", n)
	}
	if res.Text() != text || res.Status != "completed" || res.Attempts != 1 {
		t.Errorf("response = %+v", res)
	}
	want := model.Usage{Requests: 1, InputTokens: 12, CachedInputTokens: 4, OutputTokens: 9, TotalTokens: 21}
	if res.Usage != want {
		t.Errorf("usage = %+v, want %+v", res.Usage, want)
	}
	req := srv.Requests()[0]
	if req.Path != "/v1/responses" || !req.Stream() || req.Model() != "gpt-test" || req.Instructions() != "Be brief." {
		t.Errorf("request: path %s stream %v model %q instructions %q", req.Path, req.Stream(), req.Model(), req.Instructions())
	}
	if req.Body["store"] != false {
		t.Errorf("store = %v, want false", req.Body["store"])
	}
	if _, ok := req.Body["include"]; ok {
		t.Errorf("include sent without reasoning: %v", req.Body["include"])
	}
	if got := req.Header.Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization = %q", got)
	}
	if got := req.Header.Get("X-Stainless-Retry-Count"); got != "" && got != "0" {
		t.Errorf("SDK retry count header = %q", got)
	}
}

func TestSettingsOnTheWire(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message(`{"ok":true}`)}})
	m, _ := newModel(t, srv)
	temp, topP, parallel := 0.2, 0.9, false
	schema := json.RawMessage(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`)
	run(t, m, &model.Request{
		Model: "gpt-other",
		Input: []model.Item{
			{Kind: model.ItemMessage, Role: model.RoleDeveloper, Content: []model.Content{model.TextContent("dev note")}},
			model.UserMessage("go"),
		},
		Tools:             []model.Tool{model.FunctionTool("lookup", "Looks up.", nil, false)},
		ToolChoice:        "lookup",
		ParallelToolCalls: &parallel,
		Output:            &model.OutputSchema{Name: "answer", Schema: schema, Strict: true},
		Reasoning:         &model.Reasoning{Effort: "high", Summary: "auto"},
		Settings: model.Settings{Temperature: &temp, TopP: &topP, MaxOutputTokens: 256,
			PromptCacheKey: "run-1", Metadata: map[string]string{"run": "r1"}},
	})
	b := srv.Requests()[0].Body
	want := map[string]any{
		"model":               "gpt-other",
		"temperature":         json.Number("0.2"),
		"top_p":               json.Number("0.9"),
		"max_output_tokens":   json.Number("256"),
		"parallel_tool_calls": false,
		"store":               false,
		"prompt_cache_key":    "run-1",
		"metadata":            map[string]any{"run": "r1"},
		"tool_choice":         map[string]any{"type": "function", "name": "lookup"},
		"include":             []any{"reasoning.encrypted_content"},
		"reasoning":           map[string]any{"effort": "high", "summary": "auto"},
		"text": map[string]any{"format": map[string]any{
			"type": "json_schema", "name": "answer", "strict": true, "schema": asJSON(t, schema),
		}},
		"input": []any{
			map[string]any{"role": "developer", "content": "dev note"},
			map[string]any{"role": "user", "content": "go"},
		},
	}
	for k, v := range want {
		if !reflect.DeepEqual(b[k], v) {
			t.Errorf("%s = %#v, want %#v", k, b[k], v)
		}
	}
}

func TestFunctionCallRoundTrip(t *testing.T) {
	srv := newServer(t,
		replay.Turn{Items: []replay.Item{replay.Message("Let me look."), replay.FunctionCall("call_1", "exec_command", `{"cmd":"ls -la"}`)},
			Usage: replay.Usage{InputTokens: 100, OutputTokens: 20}},
		replay.Turn{Items: []replay.Item{replay.Message("Two files.")}, Usage: replay.Usage{InputTokens: 150, CachedTokens: 100, OutputTokens: 5}},
	)
	m, _ := newModel(t, srv)
	params := json.RawMessage(`{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"],"additionalProperties":false}`)
	tools := []model.Tool{model.FunctionTool("exec_command", "Runs a command.", params, true)}
	input := []model.Item{model.UserMessage("list files")}

	evs, res := run(t, m, &model.Request{Input: input, Tools: tools})
	calls := res.ToolCalls()
	if len(calls) != 1 || calls[0].CallID != "call_1" || calls[0].Name != "exec_command" || calls[0].Arguments != `{"cmd":"ls -la"}` {
		t.Fatalf("tool calls = %+v", calls)
	}
	if got := deltas(evs, model.EventToolCallDelta); got != `{"cmd":"ls -la"}` {
		t.Errorf("argument deltas = %q", got)
	}
	if n := count(evs, model.EventItemDone); n != 2 {
		t.Errorf("item done events = %d, want 2", n)
	}
	usage := res.Usage

	input = append(input, res.Output...)
	input = append(input, model.FunctionCallOutput("call_1", "a.go\nb.go"))
	_, res2 := run(t, m, &model.Request{Input: input, Tools: tools})
	if res2.Text() != "Two files." {
		t.Errorf("second text = %q", res2.Text())
	}
	usage.Add(res2.Usage)
	want := model.Usage{Requests: 2, InputTokens: 250, CachedInputTokens: 100, OutputTokens: 25, TotalTokens: 275}
	if usage != want {
		t.Errorf("summed usage = %+v, want %+v", usage, want)
	}

	reqs := srv.Requests()
	tool := reqs[0].Tool("exec_command")
	wantTool := map[string]any{"type": "function", "name": "exec_command", "description": "Runs a command.",
		"strict": true, "parameters": asJSON(t, params)}
	if !reflect.DeepEqual(tool, wantTool) {
		t.Errorf("tool on the wire = %#v\nwant %#v", tool, wantTool)
	}
	fc := reqs[1].InputOfType("function_call")
	if len(fc) != 1 || fc[0]["call_id"] != "call_1" || fc[0]["name"] != "exec_command" || fc[0]["arguments"] != `{"cmd":"ls -la"}` {
		t.Errorf("function_call passed back = %v", fc)
	}
	out := reqs[1].InputOfType("function_call_output")
	if len(out) != 1 || out[0]["call_id"] != "call_1" || out[0]["output"] != "a.go\nb.go" {
		t.Errorf("function_call_output = %v", out)
	}
	msgs := reqs[1].InputOfType("message")
	if len(msgs) != 2 || msgs[1]["role"] != "assistant" || msgs[1]["id"] == nil {
		t.Errorf("assistant message not passed back with its id: %v", msgs)
	}
}

const larkGrammar = `start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: "*** Add File: " filename LF add_line+
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
%import common.LF
`

func TestCustomToolRoundTrip(t *testing.T) {
	patch := "*** Begin Patch\n*** Add File: hello.txt\n+héllo\n*** End Patch\n"
	srv := newServer(t,
		replay.Turn{Items: []replay.Item{replay.CustomToolCall("call_p", "apply_patch", patch)}},
		replay.Turn{Items: []replay.Item{replay.Message("Patched.")}},
	)
	m, _ := newModel(t, srv)
	tools := []model.Tool{model.CustomTool("apply_patch", "Edits files with a patch.", &model.Grammar{Syntax: "lark", Definition: larkGrammar})}
	input := []model.Item{model.UserMessage("create hello.txt")}

	evs, res := run(t, m, &model.Request{Input: input, Tools: tools, ToolChoice: "apply_patch"})
	calls := res.ToolCalls()
	if len(calls) != 1 || calls[0].Kind != model.ItemCustomToolCall || calls[0].Input != patch || calls[0].CallID != "call_p" {
		t.Fatalf("tool calls = %+v", calls)
	}
	if got := deltas(evs, model.EventToolCallDelta); got != patch {
		t.Errorf("input deltas = %q", got)
	}
	input = append(input, res.Output...)
	input = append(input, model.CustomToolCallOutput("call_p", "Done!"))
	run(t, m, &model.Request{Input: input, Tools: tools})

	reqs := srv.Requests()
	wantTool := map[string]any{"type": "custom", "name": "apply_patch", "description": "Edits files with a patch.",
		"format": map[string]any{"type": "grammar", "syntax": "lark", "definition": larkGrammar}}
	if got := reqs[0].Tool("apply_patch"); !reflect.DeepEqual(got, wantTool) {
		t.Errorf("custom tool on the wire = %#v\nwant %#v", got, wantTool)
	}
	if got := reqs[0].Body["tool_choice"]; !reflect.DeepEqual(got, map[string]any{"type": "custom", "name": "apply_patch"}) {
		t.Errorf("tool_choice = %#v", got)
	}
	call := reqs[1].InputOfType("custom_tool_call")
	if len(call) != 1 || call[0]["input"] != patch || call[0]["call_id"] != "call_p" || call[0]["name"] != "apply_patch" {
		t.Errorf("custom_tool_call passed back = %v", call)
	}
	out := reqs[1].InputOfType("custom_tool_call_output")
	if len(out) != 1 || out[0]["call_id"] != "call_p" || out[0]["output"] != "Done!" {
		t.Errorf("custom_tool_call_output = %v", out)
	}
}

func TestRegexGrammarAndFreeText(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	m, _ := newModel(t, srv)
	run(t, m, &model.Request{Input: []model.Item{model.UserMessage("x")}, Tools: []model.Tool{
		model.CustomTool("digits", "", &model.Grammar{Syntax: "regex", Definition: `\d+`}),
		model.CustomTool("note", "Free text.", nil),
	}})
	req := srv.Requests()[0]
	if got := req.Tool("digits")["format"]; !reflect.DeepEqual(got, map[string]any{"type": "grammar", "syntax": "regex", "definition": `\d+`}) {
		t.Errorf("regex format = %#v", got)
	}
	if got := req.Tool("note")["format"]; !reflect.DeepEqual(got, map[string]any{"type": "text"}) {
		t.Errorf("text format = %#v", got)
	}
}

func TestReasoningPassedBackVerbatim(t *testing.T) {
	srv := newServer(t,
		replay.Turn{Items: []replay.Item{
			replay.Reasoning("rs_abc", "gAAAAB-opaque+/=state", "Thinking about files.", "Then the answer."),
			replay.FunctionCall("call_r", "exec_command", `{"cmd":"pwd"}`),
		}, Usage: replay.Usage{InputTokens: 10, OutputTokens: 50, ReasoningTokens: 40}},
		replay.Turn{Items: []replay.Item{replay.Message("/work")}},
	)
	m, _ := newModel(t, srv)
	req := &model.Request{Input: []model.Item{model.UserMessage("where am I")}, Reasoning: &model.Reasoning{Effort: "medium"}}
	evs, res := run(t, m, req)
	if got := deltas(evs, model.EventReasoningDelta); got != "Thinking about files.Then the answer." {
		t.Errorf("reasoning deltas = %q", got)
	}
	if res.Usage.ReasoningTokens != 40 {
		t.Errorf("reasoning tokens = %d", res.Usage.ReasoningTokens)
	}
	rs := res.Output[0]
	if rs.Kind != model.ItemReasoning || rs.EncryptedContent != "gAAAAB-opaque+/=state" || len(rs.Summary) != 2 {
		t.Fatalf("reasoning item = %+v", rs)
	}
	req.Input = append(req.Input, res.Output...)
	req.Input = append(req.Input, model.FunctionCallOutput("call_r", "/work"))
	run(t, m, req)

	first := srv.Requests()[0]
	if !reflect.DeepEqual(first.Body["include"], []any{"reasoning.encrypted_content"}) {
		t.Errorf("include = %v", first.Body["include"])
	}
	got := srv.Requests()[1].InputOfType("reasoning")
	want := []map[string]any{{
		"type": "reasoning", "id": "rs_abc", "encrypted_content": "gAAAAB-opaque+/=state",
		"summary": []any{
			map[string]any{"type": "summary_text", "text": "Thinking about files."},
			map[string]any{"type": "summary_text", "text": "Then the answer."},
		},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reasoning passed back = %#v\nwant %#v", got, want)
	}
}

func TestImageToolOutput(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("A red dot.")}})
	m, _ := newModel(t, srv)
	png := []byte("\x89PNG\r\n\x1a\nfake")
	run(t, m, &model.Request{Input: []model.Item{
		model.UserMessage("look"),
		{Kind: model.ItemFunctionCall, CallID: "call_i", Name: "view_image", Arguments: `{"path":"dot.png"}`},
		{Kind: model.ItemFunctionCallOutput, CallID: "call_i", Content: []model.Content{model.ImageDataContent("image/png", png, "")}},
		{Kind: model.ItemMessage, Role: model.RoleUser, Content: []model.Content{
			model.TextContent("and this"), model.ImageContent("https://example.test/a.png", "low")}},
	}})
	req := srv.Requests()[0]
	out := req.InputOfType("function_call_output")
	want := []any{map[string]any{"type": "input_image", "detail": "auto", "image_url": "data:image/png;base64,iVBORw0KGgpmYWtl"}}
	if len(out) != 1 || !reflect.DeepEqual(out[0]["output"], want) {
		t.Errorf("image tool output = %#v", out)
	}
	msgs := req.InputOfType("message")
	wantContent := []any{
		map[string]any{"type": "input_text", "text": "and this"},
		map[string]any{"type": "input_image", "detail": "low", "image_url": "https://example.test/a.png"},
	}
	if len(msgs) != 2 || !reflect.DeepEqual(msgs[1]["content"], wantContent) {
		t.Errorf("user message with image = %#v", msgs)
	}
}

func TestIncomplete(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("cut")}, Incomplete: "max_output_tokens"})
	m, _ := newModel(t, srv)
	_, res := run(t, m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	if res.Status != "incomplete" || res.IncompleteReason != "max_output_tokens" || res.Text() != "cut" {
		t.Errorf("response = %+v", res)
	}
}

func TestRateLimitHonoursRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		turn       replay.Turn
		wantDelays []time.Duration
	}{
		{"seconds", replay.RateLimited("7", ""), []time.Duration{7 * time.Second}},
		{"milliseconds", replay.RateLimited("1", "20"), []time.Duration{20 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.turn, replay.Turn{Items: []replay.Item{replay.Message("finally")}})
			m, sl := newModel(t, srv)
			_, res := run(t, m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
			if res.Text() != "finally" || res.Attempts != 2 {
				t.Errorf("response = %+v", res)
			}
			if got := len(srv.Requests()); got != 2 {
				t.Errorf("requests = %d, want 2", got)
			}
			if got := sl.all(); !reflect.DeepEqual(got, tc.wantDelays) {
				t.Errorf("delays = %v, want %v", got, tc.wantDelays)
			}
		})
	}
}

func TestRetryAfterBeyondCapFails(t *testing.T) {
	srv := newServer(t, replay.RateLimited("600", ""))
	m, sl := newModel(t, srv, func(c *model.Config) { c.Retry.MaxRetryAfter = time.Minute })
	err := streamErr(m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	var ae *model.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 429 || ae.RetryAfter != 10*time.Minute {
		t.Fatalf("err = %v", err)
	}
	if len(sl.all()) != 0 || len(srv.Requests()) != 1 {
		t.Errorf("waited %v over %d requests", sl.all(), len(srv.Requests()))
	}
}

func streamErr(m model.Model, req *model.Request) error {
	_, err := model.Respond(context.Background(), m, req)
	return err
}

func TestServerErrorsExhaustRetries(t *testing.T) {
	srv := newServer(t, replay.Fail(500), replay.Fail(503), replay.Fail(500))
	m, sl := newModel(t, srv, func(c *model.Config) {
		c.Retry.MaxAttempts = 3
		c.Retry.InitialBackoff = 100 * time.Millisecond
		c.Retry.MaxBackoff = time.Second
	})
	err := streamErr(m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	var ae *model.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v (%T), want *APIError", err, err)
	}
	if ae.StatusCode != 500 || ae.Attempts != 3 || !ae.Retryable || ae.RequestID != "req_3" || !model.Retryable(err) {
		t.Errorf("APIError = %+v", ae)
	}
	for _, s := range []string{"HTTP 500", "req_3", "after 3 attempts", "scripted failure"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("requests = %d, want 3", n)
	}
	// Exponential backoff with up to 25% jitter off: 75-100ms, then 150-200ms.
	d := sl.all()
	if len(d) != 2 || d[0] < 75*time.Millisecond || d[0] > 100*time.Millisecond ||
		d[1] < 150*time.Millisecond || d[1] > 200*time.Millisecond {
		t.Errorf("delays = %v", d)
	}
}

func TestClientErrorNotRetried(t *testing.T) {
	srv := newServer(t, replay.Turn{Fault: &replay.Fault{Status: 400, Message: "Invalid value for 'input'."}})
	m, _ := newModel(t, srv)
	err := streamErr(m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	var ae *model.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Retryable || ae.Attempts != 1 {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(err.Error(), "Invalid value for 'input'.") {
		t.Errorf("error %q lacks the provider's message", err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("requests = %d", n)
	}
}

func TestDroppedBeforeOutputRetriedTransparently(t *testing.T) {
	turn := replay.Turn{Items: []replay.Item{replay.Message("steady")}}
	srv := newServer(t, turn.Dropped(2), turn)
	m, sl := newModel(t, srv)
	evs, res := run(t, m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	if count(evs, model.EventReset) != 0 {
		t.Errorf("unexpected reset: %v", evs)
	}
	if deltas(evs, model.EventTextDelta) != "steady" || res.Attempts != 2 || len(sl.all()) != 1 {
		t.Errorf("deltas %q attempts %d delays %v", deltas(evs, model.EventTextDelta), res.Attempts, sl.all())
	}
}

func TestDroppedAfterOutputResets(t *testing.T) {
	const text = "a fairly long answer that streams"
	turn := replay.Turn{Items: []replay.Item{replay.Message(text)}}
	srv := newServer(t, turn.Dropped(7), turn)
	m, _ := newModel(t, srv)
	evs, res := run(t, m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	var before, after []model.Event
	reset := -1
	for i, ev := range evs {
		if ev.Kind == model.EventReset {
			reset = i
			if ev.Reset.Attempt != 2 || !errors.Is(ev.Reset.Err, model.ErrStreamInterrupted) {
				t.Errorf("reset = %+v", ev.Reset)
			}
			continue
		}
		if reset < 0 {
			before = append(before, ev)
		} else {
			after = append(after, ev)
		}
	}
	if count(evs, model.EventReset) != 1 {
		t.Fatalf("resets = %d, want 1", count(evs, model.EventReset))
	}
	if d := deltas(before, model.EventTextDelta); d == "" || d == text {
		t.Errorf("deltas before reset = %q, want a strict prefix", d)
	}
	if d := deltas(after, model.EventTextDelta); d != text {
		t.Errorf("deltas after reset = %q", d)
	}
	if res.Text() != text || res.Attempts != 2 {
		t.Errorf("response = %+v", res)
	}
}

func TestDroppedEveryTimeFails(t *testing.T) {
	turn := replay.Turn{Items: []replay.Item{replay.Message("never")}}.Dropped(3)
	srv := newServer(t, turn, turn)
	m, _ := newModel(t, srv, func(c *model.Config) { c.Retry.MaxAttempts = 2 })
	err := streamErr(m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	if !errors.Is(err, model.ErrStreamInterrupted) || !model.Retryable(err) {
		t.Fatalf("err = %v", err)
	}
}

func TestCancelMidStream(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("this will stall half way")}}.Stalled(5))
	m, _ := newModel(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got error
	for ev, err := range m.Stream(ctx, &model.Request{Input: []model.Item{model.UserMessage("x")}}) {
		if err != nil {
			got = err
			break
		}
		if ev.Kind == model.EventTextDelta {
			cancel()
		}
	}
	if !errors.Is(got, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", got)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("requests = %d, want 1 (no retry after cancel)", n)
	}
}

func TestCancelDuringBackoff(t *testing.T) {
	srv := newServer(t, replay.RateLimited("30", ""))
	ctx, cancel := context.WithCancel(context.Background())
	m, _ := newModel(t, srv, func(c *model.Config) {
		c.Retry.Sleep = func(ctx context.Context, d time.Duration) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}
	})
	_, err := model.Respond(ctx, m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestBreakStopsTheCall(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("one two three four")}}.Stalled(6))
	m, _ := newModel(t, srv)
	for ev, err := range m.Stream(context.Background(), &model.Request{Input: []model.Item{model.UserMessage("x")}}) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == model.EventTextDelta {
			break // must release the stalled connection, not hang
		}
	}
}

func TestEnvironmentFallback(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("env")}}, replay.Turn{Items: []replay.Item{replay.Message("explicit")}})
	t.Setenv("OPENAI_BASE_URL", srv.URL())
	t.Setenv("OPENAI_API_KEY", "sk-from-env")
	t.Setenv("OPENAI_ORG_ID", "org-env")
	t.Setenv("OPENAI_PROJECT_ID", "proj-env")
	t.Setenv("OPENAI_CUSTOM_HEADERS", "X-Gateway: env\nX-Route:  r1 \nno colon here")
	m, err := model.NewOpenAI(model.Config{Model: "gpt-test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := model.Respond(context.Background(), m, &model.Request{Input: []model.Item{model.UserMessage("x")}}); err != nil {
		t.Fatal(err)
	}
	h := srv.Requests()[0].Header
	if h.Get("Authorization") != "Bearer sk-from-env" || h.Get("OpenAI-Organization") != "org-env" || h.Get("OpenAI-Project") != "proj-env" ||
		h.Get("X-Gateway") != "env" || h.Get("X-Route") != "r1" {
		t.Errorf("headers from env = %v", h)
	}

	// Explicit settings win over the environment.
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
	m, err = model.NewOpenAI(model.Config{Model: "gpt-test", BaseURL: srv.URL(), APIKey: "sk-explicit",
		Organization: "org-x", Project: "proj-x", Headers: map[string]string{"X-Gateway": "g1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := model.Respond(context.Background(), m, &model.Request{Input: []model.Item{model.UserMessage("x")}}); err != nil {
		t.Fatal(err)
	}
	h = srv.Requests()[1].Header
	if h.Get("Authorization") != "Bearer sk-explicit" || h.Get("OpenAI-Organization") != "org-x" ||
		h.Get("OpenAI-Project") != "proj-x" || len(h.Values("X-Gateway")) != 1 || h.Get("X-Gateway") != "g1" || h.Get("X-Route") != "r1" {
		t.Errorf("explicit headers = %v", h)
	}
}

func TestNoAPIKey(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	if _, err := model.NewOpenAI(model.Config{Model: "m"}); err == nil || !strings.Contains(err.Error(), "OPENAI_API_KEY") {
		t.Fatalf("err = %v", err)
	}
}

func TestAPIKeyNeverInErrors(t *testing.T) {
	srv := newServer(t)
	// A misbehaving gateway that echoes the credentials back in its error.
	srv.EnqueueFunc(func(r *replay.Request) replay.Turn {
		return replay.Turn{Fault: &replay.Fault{Status: http.StatusUnauthorized, Message: "bad credentials: " + r.Header.Get("Authorization")}}
	})
	m, _ := newModel(t, srv)
	err := streamErr(m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	var ae *model.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), testKey) || strings.Contains(ae.Message, testKey) {
		t.Errorf("API key leaked: %q", err)
	}
	if !strings.Contains(err.Error(), "[REDACTED]") {
		t.Errorf("error %q lost the redacted echo", err)
	}

	// A connection failure names the failure, not the key.
	dead := replay.NewServer()
	url := dead.URL()
	dead.Close()
	m2, _ := newModel(t, srv, func(c *model.Config) { c.BaseURL = url; c.Retry.MaxAttempts = 2 })
	err = streamErr(m2, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	if err == nil || !model.Retryable(err) || strings.Contains(err.Error(), testKey) {
		t.Errorf("connection failure err = %v", err)
	}
}

func TestInvalidRequests(t *testing.T) {
	srv := newServer(t)
	m, _ := newModel(t, srv)
	for name, req := range map[string]*model.Request{
		"unknown tool choice":  {ToolChoice: "nope"},
		"bad grammar syntax":   {Tools: []model.Tool{model.CustomTool("t", "", &model.Grammar{Syntax: "ebnf", Definition: "x"})}},
		"bad schema":           {Tools: []model.Tool{model.FunctionTool("f", "", json.RawMessage(`[1]`), false)}},
		"duplicate tool":       {Tools: []model.Tool{model.CustomTool("t", "", nil), model.CustomTool("t", "", nil)}},
		"output without call":  {Input: []model.Item{{Kind: model.ItemFunctionCallOutput, Output: "x"}}},
		"reasoning without id": {Input: []model.Item{{Kind: model.ItemReasoning, EncryptedContent: "x"}}},
	} {
		if err := streamErr(m, req); err == nil || !strings.Contains(err.Error(), "invalid request") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("%d requests sent for invalid input", n)
	}
}

func TestResponseFailedEvent(t *testing.T) {
	srv := newServer(t,
		replay.Turn{}.FailedWith("server_error", "The server had an error."),
		replay.Turn{Items: []replay.Item{replay.Message("recovered")}},
		replay.Turn{Items: []replay.Item{replay.Message("partial")}}.FailedWith("invalid_prompt", "Prompt flagged."),
	)
	m, _ := newModel(t, srv)
	evs, res := run(t, m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	if res.Text() != "recovered" || res.Attempts != 2 || count(evs, model.EventReset) != 0 {
		t.Errorf("response = %+v, events %v", res, evs)
	}
	err := streamErr(m, &model.Request{Input: []model.Item{model.UserMessage("x")}})
	var ae *model.APIError
	if !errors.As(err, &ae) || ae.Retryable || ae.Code != "invalid_prompt" || !strings.Contains(err.Error(), "Prompt flagged.") {
		t.Fatalf("err = %v", err)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("requests = %d, want 3", n)
	}
}
