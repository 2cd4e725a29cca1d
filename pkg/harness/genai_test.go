package harness

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// TestGenAISpans checks the run's spans against OpenTelemetry's GenAI
// semantic conventions: names, kinds and gen_ai.* attributes of the agent
// span, the inference (chat) spans and the execute_tool span, recorded by
// an in-memory exporter.
func TestGenAISpans(t *testing.T) {
	_, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("call_7", "echo", `{}`)}, Usage: replay.Usage{InputTokens: 11, OutputTokens: 3}},
		replay.Turn{Items: []replay.Item{replay.Message("done")}, Usage: replay.Usage{InputTokens: 17, OutputTokens: 2}})
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	echo := tool.Func{Def: model.FunctionTool("echo", "echo", []byte(`{"type":"object"}`), false),
		Fn: func(_ context.Context, _ tool.Context, in string) (tool.Result, error) {
			return tool.Result{Output: in}, nil
		}}
	r := &Runner{Model: m, ModelName: "test-model", TracerProvider: tp}
	if _, err := r.Run(ctxT(t), &Agent{Name: "genai", Tools: []tool.Tool{echo}}, "go", RunConfig{ConversationID: "run-42"}); err != nil {
		t.Fatal(err)
	}
	byName := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		byName[s.Name] = append(byName[s.Name], s)
	}
	type want struct {
		name  string
		n     int
		kind  trace.SpanKind
		attrs map[attribute.Key]attribute.Value
	}
	for _, w := range []want{
		{"invoke_agent genai", 1, trace.SpanKindInternal, map[attribute.Key]attribute.Value{
			"gen_ai.operation.name":      attribute.StringValue("invoke_agent"),
			"gen_ai.agent.name":          attribute.StringValue("genai"),
			"gen_ai.provider.name":       attribute.StringValue("openai"),
			"gen_ai.conversation.id":     attribute.StringValue("run-42"),
			"gen_ai.usage.input_tokens":  attribute.Int64Value(28),
			"gen_ai.usage.output_tokens": attribute.Int64Value(5),
		}},
		{"chat test-model", 2, trace.SpanKindClient, map[attribute.Key]attribute.Value{
			"gen_ai.operation.name":  attribute.StringValue("chat"),
			"gen_ai.provider.name":   attribute.StringValue("openai"),
			"gen_ai.request.model":   attribute.StringValue("test-model"),
			"gen_ai.conversation.id": attribute.StringValue("run-42"),
		}},
		{"execute_tool echo", 1, trace.SpanKindInternal, map[attribute.Key]attribute.Value{
			"gen_ai.operation.name": attribute.StringValue("execute_tool"),
			"gen_ai.tool.name":      attribute.StringValue("echo"),
			"gen_ai.tool.call.id":   attribute.StringValue("call_7"),
			"gen_ai.tool.type":      attribute.StringValue("function"),
		}},
	} {
		spans := byName[w.name]
		if len(spans) != w.n {
			t.Errorf("%d spans named %q, want %d (all: %v)", len(spans), w.name, w.n, keys(byName))
			continue
		}
		for _, s := range spans {
			if s.SpanKind != w.kind {
				t.Errorf("%s: kind %v, want %v", w.name, s.SpanKind, w.kind)
			}
			got := map[attribute.Key]attribute.Value{}
			for _, a := range s.Attributes {
				got[a.Key] = a.Value
			}
			for k, v := range w.attrs {
				if got[k] != v {
					t.Errorf("%s: %s = %v, want %v", w.name, k, got[k].String(), v.String())
				}
			}
		}
	}
	// Each chat span carries its own response's model and token usage.
	chats := byName["chat test-model"]
	if len(chats) == 2 {
		var in, out int64
		for _, s := range chats {
			for _, a := range s.Attributes {
				switch a.Key {
				case "gen_ai.usage.input_tokens":
					in += a.Value.AsInt64()
				case "gen_ai.usage.output_tokens":
					out += a.Value.AsInt64()
				case "gen_ai.response.model":
					if a.Value.AsString() == "" {
						t.Error("empty gen_ai.response.model")
					}
				}
			}
		}
		if in != 28 || out != 5 {
			t.Errorf("chat spans' usage: %d in, %d out; want 28, 5", in, out)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
