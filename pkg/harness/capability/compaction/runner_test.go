package compaction_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/compaction"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// wireTypes lists the "type" of each input item of a recorded request
// (short-form messages have none: "message").
func wireTypes(r *replay.Request) []string {
	var out []string
	for _, it := range r.Input() {
		s, _ := it["type"].(string)
		if s == "" {
			s = "message"
		}
		out = append(out, s)
	}
	return out
}

// A run through the Runner (with a sandbox session: the runner applies
// capabilities to sandbox agents): turn 2 returns a compaction item, and
// turn 3's request starts at it, while the run keeps the whole conversation.
func TestRunDropsItemsBeforeCompaction(t *testing.T) {
	srv := replay.NewServer(
		replay.Turn{Items: []replay.Item{replay.FunctionCall("call_1", "lookup", `{"q":"a"}`)}},
		replay.Turn{Items: []replay.Item{
			replay.Compaction("cmp_1", "ENCRYPTED-SUMMARY"),
			replay.FunctionCall("call_2", "lookup", `{"q":"b"}`),
		}},
		replay.Turn{Items: []replay.Item{replay.Message("all done")}},
	)
	t.Cleanup(func() {
		srv.Close()
		if err := srv.Err(); err != nil {
			t.Errorf("scripted server: %v", err)
		}
	})
	m, err := model.NewOpenAI(model.Config{APIKey: "x", BaseURL: srv.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	lookup := tool.Func{
		Def: model.FunctionTool("lookup", "Looks up.", []byte(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"],"additionalProperties":false}`), true),
		Fn: func(_ context.Context, _ tool.Context, input string) (tool.Result, error) {
			return tool.Result{Output: "found " + input}, nil
		},
	}
	a := &harness.Agent{
		Name:         "long-runner",
		Instructions: "Look things up.",
		ModelName:    "gpt-5.4-mini",
		Tools:        []tool.Tool{lookup},
		Capabilities: []capability.Capability{compaction.New(compaction.Options{})},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := compute.NewClient(agentdtest.NewProvider(t, nil), compute.ClientOptions{Log: zaptest.NewLogger(t)})
	res, err := (&harness.Runner{Model: m, Log: zaptest.NewLogger(t)}).Run(ctx, a, "research this",
		harness.RunConfig{Sandbox: &harness.SandboxConfig{Client: client}})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalOutput != "all done" || res.Turns != 3 {
		t.Fatalf("result %q after %d turns", res.FinalOutput, res.Turns)
	}

	reqs := srv.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests", len(reqs))
	}
	// Every request asks for compaction at 90% of gpt-5.4-mini's 400k window.
	wantCM := []any{map[string]any{"type": "compaction", "compact_threshold": json.Number("360000")}}
	for _, r := range reqs {
		if got := r.Body["context_management"]; !reflect.DeepEqual(got, wantCM) {
			t.Errorf("request %d: context_management %#v, want %#v", r.N, got, wantCM)
		}
	}

	// Before the compaction: the whole conversation.
	if got, want := wireTypes(reqs[1]), []string{"message", "function_call", "function_call_output"}; !reflect.DeepEqual(got, want) {
		t.Errorf("request 2 input %v, want %v", got, want)
	}
	// After it: the compaction item (verbatim) and what followed, nothing
	// from before.
	if got, want := wireTypes(reqs[2]), []string{"compaction", "function_call", "function_call_output"}; !reflect.DeepEqual(got, want) {
		t.Errorf("request 3 input %v, want %v", got, want)
	}
	in := reqs[2].Input()
	if want := map[string]any{"type": "compaction", "id": "cmp_1", "encrypted_content": "ENCRYPTED-SUMMARY"}; !reflect.DeepEqual(in[0], want) {
		t.Errorf("compaction item sent as %#v, want %#v", in[0], want)
	}
	if in[1]["call_id"] != "call_2" || in[2]["call_id"] != "call_2" || in[2]["output"] != `found {"q":"b"}` {
		t.Errorf("items after the compaction: %v", in[1:])
	}
	for _, it := range in {
		if it["call_id"] == "call_1" || it["content"] == "research this" {
			t.Errorf("item from before the compaction sent: %v", it)
		}
	}
	if reqs[2].Instructions() == "" {
		t.Error("instructions dropped")
	}

	// The run itself keeps every item, the compaction item included.
	var kinds []model.ItemKind
	for _, it := range res.Items {
		kinds = append(kinds, it.Kind)
	}
	wantKinds := []model.ItemKind{model.ItemMessage, model.ItemFunctionCall, model.ItemFunctionCallOutput,
		model.ItemCompaction, model.ItemFunctionCall, model.ItemFunctionCallOutput, model.ItemMessage}
	if !reflect.DeepEqual(kinds, wantKinds) {
		t.Errorf("run items %v, want %v", kinds, wantKinds)
	}
	if c := res.Items[3]; c.ID != "cmp_1" || c.EncryptedContent != "ENCRYPTED-SUMMARY" {
		t.Errorf("compaction item kept as %+v", c)
	}
}
