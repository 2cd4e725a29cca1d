package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Recording is a recorded model session: the model's side of a run, turn
// by turn, replayed by a Server for offline demonstrations and tests. The
// file format is JSON:
//
//	{"description": "...", "turns": [
//	  {"items": [{"type": "message", "text": "..."},
//	             {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{...}"},
//	             {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch..."}],
//	   "usage": {"input_tokens": 100, "output_tokens": 20}}]}
type Recording struct {
	Description string         `json:"description,omitempty"`
	Turns       []RecordedTurn `json:"turns"`
}

// RecordedTurn is one response of a recording.
type RecordedTurn struct {
	Items []RecordedItem `json:"items"`
	Usage RecordedUsage  `json:"usage,omitempty"`
}

// RecordedItem is one output item of a recorded response.
type RecordedItem struct {
	Type      ItemType `json:"type"`
	Text      string   `json:"text,omitempty"`
	CallID    string   `json:"call_id,omitempty"`
	Name      string   `json:"name,omitempty"`
	Arguments string   `json:"arguments,omitempty"`
	Input     string   `json:"input,omitempty"`
}

// RecordedUsage is a recorded response's token accounting.
type RecordedUsage struct {
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
}

// LoadRecording reads a recording file.
func LoadRecording(path string) (*Recording, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	defer f.Close()
	return DecodeRecording(f)
}

// DecodeRecording parses a recording strictly (unknown fields are errors).
func DecodeRecording(r io.Reader) (*Recording, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var rec Recording
	if err := dec.Decode(&rec); err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	if len(rec.Turns) == 0 {
		return nil, fmt.Errorf("recording: no turns")
	}
	for i, t := range rec.Turns {
		for j, it := range t.Items {
			switch it.Type {
			case ItemMessage, ItemFunctionCall, ItemCustomToolCall:
			default:
				return nil, fmt.Errorf("recording: turn %d item %d: unknown type %q", i+1, j+1, it.Type)
			}
		}
	}
	return &rec, nil
}

// ScriptTurns converts the recording into the server's turns.
func (r *Recording) ScriptTurns() []Turn {
	out := make([]Turn, len(r.Turns))
	for i, t := range r.Turns {
		tt := Turn{Usage: Usage{InputTokens: t.Usage.InputTokens, OutputTokens: t.Usage.OutputTokens}}
		for _, it := range t.Items {
			tt.Items = append(tt.Items, Item{Type: it.Type, Text: it.Text, CallID: it.CallID, Name: it.Name, Arguments: it.Arguments, Input: it.Input})
		}
		out[i] = tt
	}
	return out
}
