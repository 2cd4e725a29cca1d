package harness

import (
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// EventKind is the kind of a run event.
type EventKind string

// Run event kinds.
const (
	// EventTurnStarted: a model call begins (Turn is set).
	EventTurnStarted EventKind = "turn_started"
	// EventTextDelta: model text (Text is set).
	EventTextDelta EventKind = "text_delta"
	// EventModelReset: the model call was retried after text was
	// delivered; discard the deltas of this turn.
	EventModelReset EventKind = "model_reset"
	// EventToolCall: the model called a tool (Call is set).
	EventToolCall EventKind = "tool_call"
	// EventToolOutput: output of a running tool call (Call.ID, Output).
	EventToolOutput EventKind = "tool_output"
	// EventToolResult: a tool call finished (Call, Result).
	EventToolResult EventKind = "tool_result"
	// EventFinalOutput: the run's final output (Text).
	EventFinalOutput EventKind = "final_output"
)

// Event is one thing that happened in a streamed run.
type Event struct {
	Kind   EventKind `json:"kind"`
	Agent  string    `json:"agent,omitempty"`
	Turn   int       `json:"turn,omitempty"`
	Text   string    `json:"text,omitempty"`
	Call   *ToolCall `json:"call,omitempty"`
	Output []byte    `json:"output,omitempty"`
	Result *ToolOut  `json:"result,omitempty"`
}

// ToolCall is one call the model made.
type ToolCall struct {
	ID   string         `json:"id"`
	Name string         `json:"name"`
	Kind model.ToolKind `json:"kind"`
	// Input is the JSON arguments or the custom tool's text.
	Input string `json:"input"`
}

// ToolOut is what a tool call returned, as shown in events.
type ToolOut struct {
	Output  string `json:"output"`
	IsError bool   `json:"is_error,omitempty"`
	Images  int    `json:"images,omitempty"`
}

func toolOut(r tool.Result) *ToolOut {
	return &ToolOut{Output: r.Output, IsError: r.IsError, Images: len(r.Images)}
}
