package compaction_test

import (
	"reflect"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/compaction"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func TestThresholdTable(t *testing.T) {
	var o compaction.Options
	for name, want := range map[string]int64{
		// 0.9 x the context window, by the longest matching prefix.
		"gpt-5.4":                   942_818, // 0.9 x 1,047,576
		"gpt-5.4-pro":               942_818,
		"gpt-5.5":                   942_818,
		"gpt-4.1-mini":              942_818,
		"gpt-4.1-2025-04-14":        942_818,
		"gpt-5.4-mini":              360_000,
		"gpt-5.4-nano-2026-03-17":   360_000,
		"gpt-5":                     360_000,
		"gpt-5-mini":                360_000,
		"gpt-5.1-codex-max":         360_000,
		"gpt-5.2":                   360_000,
		"gpt-5-chat-latest":         115_200,
		"gpt-5.1-chat-latest":       115_200,
		"o3":                        180_000,
		"o3-mini":                   180_000,
		"o4-mini-deep-research":     180_000,
		"o1-mini":                   115_200,
		"codex-mini-latest":         180_000,
		"gpt-4o":                    115_200,
		"gpt-4o-mini-2024-07-18":    115_200,
		"chatgpt-4o-latest":         115_200,
		"openai/gpt-5.4":            942_818, // provider prefix
		"GPT-5.4":                   942_818, // case
		"ft:gpt-4o-2024-08-06:acme": 115_200, // fine-tuned
		// Unknown: the static default.
		"":                240_000,
		"gpt-50":          240_000, // "gpt-5" needs a separator after it
		"o10":             240_000,
		"gpt-4":           240_000,
		"llama-3-70b":     240_000,
		"other/gpt-5.4":   240_000, // only openai/ is stripped
		"test-model-gpt5": 240_000,
	} {
		got, ok := o.ThresholdFor(name)
		if !ok || got != want {
			t.Errorf("ThresholdFor(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
}

func TestThresholdOptions(t *testing.T) {
	type check struct {
		model string
		want  int64
		ok    bool
	}
	for _, tc := range []struct {
		name   string
		opts   compaction.Options
		checks []check
	}{
		{"fixed threshold for every model", compaction.Options{Threshold: 50_000, Fraction: 0.5, UnknownThreshold: -1},
			[]check{{"gpt-5.4", 50_000, true}, {"mystery", 50_000, true}}},
		{"fraction", compaction.Options{Fraction: 0.5},
			[]check{{"gpt-5", 200_000, true}, {"mystery", 240_000, true}}},
		{"fraction out of range means the default", compaction.Options{Fraction: 1.5},
			[]check{{"gpt-5", 360_000, true}}},
		{"unknown threshold", compaction.Options{UnknownThreshold: 100_000},
			[]check{{"mystery", 100_000, true}, {"gpt-4o", 115_200, true}}},
		{"nothing for unknown models", compaction.Options{UnknownThreshold: -1},
			[]check{{"mystery", 0, false}, {"", 0, false}, {"o3", 180_000, true}}},
		{"own table replaces the default", compaction.Options{ContextWindows: map[string]int64{"my-model": 100_000, "my-model-large": 1_000_000, "bad": 0}},
			[]check{{"my-model", 90_000, true}, {"my-model-v2", 90_000, true}, {"my-model-large-2", 900_000, true},
				{"gpt-5", 240_000, true}, {"bad", 240_000, true}}},
		{"prefix ending in a separator", compaction.Options{ContextWindows: map[string]int64{"acme-": 10_000}},
			[]check{{"acme-x", 9_000, true}, {"acme", 240_000, true}}},
	} {
		for _, c := range tc.checks {
			got, ok := tc.opts.ThresholdFor(c.model)
			if got != c.want || ok != c.ok {
				t.Errorf("%s: ThresholdFor(%q) = %d, %v; want %d, %v", tc.name, c.model, got, ok, c.want, c.ok)
			}
		}
	}
}

func TestDefaultTableIsACopy(t *testing.T) {
	m := compaction.DefaultContextWindows()
	m["gpt-5"] = 1
	if n, _ := (compaction.Options{}).ThresholdFor("gpt-5"); n != 360_000 {
		t.Errorf("changing the returned table changed the default: %d", n)
	}
	own := map[string]int64{"x": 1000}
	c := compaction.New(compaction.Options{ContextWindows: own})
	own["x"] = 5
	req := &model.Request{Model: "x"}
	c.Clone().(capability.RequestAdjuster).AdjustRequest(req)
	if want := []model.ContextManagement{model.Compaction(900)}; !reflect.DeepEqual(req.ContextManagement, want) {
		t.Errorf("after changing the caller's table: %+v, want %+v", req.ContextManagement, want)
	}
}

func TestCapabilityShape(t *testing.T) {
	c := compaction.New(compaction.Options{})
	if c.Name() != "compaction" || c.Name() != compaction.Name {
		t.Errorf("name %q", c.Name())
	}
	cl := c.Clone()
	env := capability.Env{HasSession: true, Model: "gpt-5"}
	if len(cl.Tools(env)) != 0 || cl.Instructions(env) != "" {
		t.Errorf("tools %v instructions %q", cl.Tools(env), cl.Instructions(env))
	}
	m := &manifest.Manifest{}
	if got, err := cl.ProcessManifest(m); err != nil || got != m {
		t.Errorf("ProcessManifest = %p, %v; want the same manifest", got, err)
	}
	if _, ok := cl.(capability.RequestAdjuster); !ok {
		t.Error("not a RequestAdjuster")
	}
	if _, ok := cl.(capability.InputFilter); !ok {
		t.Error("not an InputFilter")
	}
}

func TestAdjustRequest(t *testing.T) {
	adj := compaction.New(compaction.Options{}).Clone().(capability.RequestAdjuster)

	req := &model.Request{Model: "gpt-5.4-mini"}
	adj.AdjustRequest(req)
	if want := []model.ContextManagement{model.Compaction(360_000)}; !reflect.DeepEqual(req.ContextManagement, want) {
		t.Errorf("context management = %+v, want %+v", req.ContextManagement, want)
	}

	// Another kind of entry is kept, and the caller's slice is not written
	// into even when it has room.
	shared := make([]model.ContextManagement, 1, 4)
	shared[0] = model.ContextManagement{Type: "future_kind"}
	req = &model.Request{Model: "gpt-4o", ContextManagement: shared}
	adj.AdjustRequest(req)
	want := []model.ContextManagement{{Type: "future_kind"}, model.Compaction(115_200)}
	if !reflect.DeepEqual(req.ContextManagement, want) {
		t.Errorf("context management = %+v, want %+v", req.ContextManagement, want)
	}
	if extra := shared[:2][1]; extra != (model.ContextManagement{}) {
		t.Errorf("wrote into the caller's backing array: %+v", extra)
	}

	// A compaction entry already there wins.
	req = &model.Request{Model: "gpt-5", ContextManagement: []model.ContextManagement{model.Compaction(7)}}
	adj.AdjustRequest(req)
	if want := []model.ContextManagement{model.Compaction(7)}; !reflect.DeepEqual(req.ContextManagement, want) {
		t.Errorf("existing entry replaced: %+v", req.ContextManagement)
	}

	// An unknown model with UnknownThreshold < 0: nothing.
	req = &model.Request{Model: "local-llm"}
	compaction.New(compaction.Options{UnknownThreshold: -1}).(capability.RequestAdjuster).AdjustRequest(req)
	if req.ContextManagement != nil {
		t.Errorf("context management for an unknown model: %+v", req.ContextManagement)
	}
}

func cmp(id string) model.Item {
	return model.Item{Kind: model.ItemCompaction, ID: id, EncryptedContent: "enc-" + id}
}

func TestFilterInput(t *testing.T) {
	f := compaction.New(compaction.Options{}).Clone().(capability.InputFilter)
	user := model.UserMessage("task")
	call := model.Item{Kind: model.ItemFunctionCall, CallID: "c1", Name: "f", Arguments: "{}"}
	out := model.FunctionCallOutput("c1", "ok")
	reply := model.AssistantMessage("done")

	for _, tc := range []struct {
		name string
		in   []model.Item
		want []model.Item
	}{
		{"empty", nil, nil},
		{"no compaction", []model.Item{user, call, out}, []model.Item{user, call, out}},
		{"compaction first", []model.Item{cmp("a"), user}, []model.Item{cmp("a"), user}},
		{"drops what came before", []model.Item{user, call, out, cmp("a"), reply}, []model.Item{cmp("a"), reply}},
		{"only the last compaction counts", []model.Item{user, cmp("a"), call, out, cmp("b"), reply, model.UserMessage("more")},
			[]model.Item{cmp("b"), reply, model.UserMessage("more")}},
		{"compaction last", []model.Item{user, call, out, cmp("a")}, []model.Item{cmp("a")}},
	} {
		before := append([]model.Item(nil), tc.in...)
		got := f.FilterInput(tc.in)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %+v\nwant %+v", tc.name, got, tc.want)
		}
		if !reflect.DeepEqual(tc.in, before) {
			t.Errorf("%s: input modified", tc.name)
		}
	}

	// Appending to the result never writes into the conversation's backing
	// array.
	conv := make([]model.Item, 0, 10)
	conv = append(conv, user, cmp("a"), reply)
	got := f.FilterInput(conv)
	_ = append(got, model.UserMessage("appended"))
	if spare := conv[:4][3]; spare.Kind != "" {
		t.Errorf("append to the filtered input wrote into the conversation: %+v", spare)
	}
}
