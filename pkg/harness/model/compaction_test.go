package model_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

func TestContextManagementOnTheWire(t *testing.T) {
	srv := newServer(t,
		replay.Turn{Items: []replay.Item{replay.Message("a")}},
		replay.Turn{Items: []replay.Item{replay.Message("b")}},
		replay.Turn{Items: []replay.Item{replay.Message("c")}},
	)
	m, _ := newModel(t, srv)
	in := []model.Item{model.UserMessage("hi")}
	run(t, m, &model.Request{Input: in, ContextManagement: []model.ContextManagement{model.Compaction(360_000)}})
	run(t, m, &model.Request{Input: in, ContextManagement: []model.ContextManagement{{Type: model.ContextCompaction}}})
	run(t, m, &model.Request{Input: in})

	reqs := srv.Requests()
	want := []any{map[string]any{"type": "compaction", "compact_threshold": json.Number("360000")}}
	if got := reqs[0].Body["context_management"]; !reflect.DeepEqual(got, want) {
		t.Errorf("context_management = %#v, want %#v", got, want)
	}
	if n, ok := reqs[0].CompactThreshold(); !ok || n != 360_000 {
		t.Errorf("recorded threshold = %d, %v", n, ok)
	}
	// No threshold: the entry alone, the provider chooses.
	want = []any{map[string]any{"type": "compaction"}}
	if got := reqs[1].Body["context_management"]; !reflect.DeepEqual(got, want) {
		t.Errorf("context_management without threshold = %#v, want %#v", got, want)
	}
	if _, present := reqs[2].Body["context_management"]; present {
		t.Errorf("context_management sent without being asked for: %s", reqs[2].Raw)
	}
	if _, ok := reqs[2].CompactThreshold(); ok {
		t.Error("recorded a compaction entry that was not sent")
	}
}

func TestCompactionItemPassedBackVerbatim(t *testing.T) {
	const enc = "gAAAAB-compacted+/=state"
	srv := newServer(t,
		replay.Turn{Items: []replay.Item{
			replay.Compaction("cmp_abc", enc),
			replay.FunctionCall("call_1", "exec_command", `{"cmd":"ls"}`),
		}},
		replay.Turn{Items: []replay.Item{replay.Message("done")}},
	)
	m, _ := newModel(t, srv)
	req := &model.Request{
		Input:             []model.Item{model.UserMessage("list files")},
		ContextManagement: []model.ContextManagement{model.Compaction(1000)},
	}
	evs, res := run(t, m, req)

	want := model.Item{Kind: model.ItemCompaction, ID: "cmp_abc", EncryptedContent: enc}
	if len(res.Output) != 2 || !reflect.DeepEqual(res.Output[0], want) {
		t.Fatalf("output = %+v, want a compaction item first", res.Output)
	}
	var done []model.ItemKind
	for _, ev := range evs {
		if ev.Kind == model.EventItemDone {
			done = append(done, ev.Item.Kind)
		}
	}
	if !reflect.DeepEqual(done, []model.ItemKind{model.ItemCompaction, model.ItemFunctionCall}) {
		t.Errorf("items done = %v", done)
	}
	if calls := res.ToolCalls(); len(calls) != 1 || calls[0].CallID != "call_1" {
		t.Errorf("tool calls = %+v", calls)
	}
	if res.Text() != "" {
		t.Errorf("text = %q", res.Text())
	}

	req.Input = append(req.Input, res.Output...)
	req.Input = append(req.Input, model.FunctionCallOutput("call_1", "a b"))
	run(t, m, req)

	got := srv.Requests()[1].InputOfType("compaction")
	wantWire := []map[string]any{{"type": "compaction", "id": "cmp_abc", "encrypted_content": enc}}
	if !reflect.DeepEqual(got, wantWire) {
		t.Errorf("compaction passed back = %#v\nwant %#v", got, wantWire)
	}
	var types []string
	for _, it := range srv.Requests()[1].Input() {
		s, _ := it["type"].(string)
		if s == "" {
			s = "short-form message"
		}
		types = append(types, s)
	}
	if strings.Join(types, ",") != "short-form message,compaction,function_call,function_call_output" {
		t.Errorf("second input = %v", types)
	}
}

func TestCompactionItemWithoutID(t *testing.T) {
	srv := newServer(t, replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	m, _ := newModel(t, srv)
	run(t, m, &model.Request{Input: []model.Item{
		{Kind: model.ItemCompaction, EncryptedContent: "blob"},
		model.UserMessage("go on"),
	}})
	got := srv.Requests()[0].InputOfType("compaction")
	if want := []map[string]any{{"type": "compaction", "encrypted_content": "blob"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("compaction = %#v, want %#v", got, want)
	}
}

func TestInvalidCompactionRequests(t *testing.T) {
	srv := newServer(t)
	m, _ := newModel(t, srv)
	for name, req := range map[string]*model.Request{
		"compaction without content": {Input: []model.Item{{Kind: model.ItemCompaction, ID: "cmp_1"}}},
		"entry without type":         {ContextManagement: []model.ContextManagement{{CompactThreshold: 10}}},
		"negative threshold":         {ContextManagement: []model.ContextManagement{model.Compaction(-1)}},
	} {
		if err := streamErr(m, req); err == nil || !strings.Contains(err.Error(), "invalid request") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("%d requests sent for invalid input", n)
	}
}

// A compaction item survives the JSON a RunState is saved as.
func TestCompactionItemJSON(t *testing.T) {
	it := model.Item{Kind: model.ItemCompaction, ID: "cmp_1", EncryptedContent: "blob"}
	b, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	var back model.Item
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, it) {
		t.Errorf("round trip = %+v, want %+v", back, it)
	}
}
