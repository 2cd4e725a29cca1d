package harness

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

func TestRunIsTraced(t *testing.T) {
	const secret = "sk-live-SECRET-in-arguments"
	_, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "echo", `{"token":"`+secret+`"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("final " + secret)}})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	echo := tool.Func{Def: model.FunctionTool("echo", "echo", []byte(`{"type":"object"}`), false),
		Fn: func(_ context.Context, _ tool.Context, in string) (tool.Result, error) {
			return tool.Result{Output: in}, nil
		}}
	r := &Runner{Model: m, ModelName: "test-model", TracerProvider: tp}
	if _, err := r.Run(ctxT(t), &Agent{Name: "tracer", Tools: []tool.Tool{echo}}, "go "+secret, RunConfig{}); err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	names := map[string]int{}
	byID := map[string]string{}
	for _, s := range spans {
		names[s.Name()]++
		byID[s.SpanContext().SpanID().String()] = s.Name()
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), secret) {
				t.Errorf("span %s attribute %s carries the secret", s.Name(), a.Key)
			}
		}
	}
	if names["invoke_agent tracer"] != 1 || names["turn"] != 2 || names["chat test-model"] != 2 || names["execute_tool echo"] != 1 {
		t.Fatalf("spans: %v", names)
	}
	for _, s := range spans {
		parent := byID[s.Parent().SpanID().String()]
		switch {
		case s.Name() == "turn" && parent != "invoke_agent tracer",
			strings.HasPrefix(s.Name(), "chat ") && parent != "turn",
			strings.HasPrefix(s.Name(), "execute_tool ") && parent != "turn":
			t.Errorf("span %s has parent %q", s.Name(), parent)
		}
	}
}
