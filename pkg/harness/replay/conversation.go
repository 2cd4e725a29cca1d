package replay

import (
	"fmt"
	"net/http"
)

// FromStart is a Responder that replays turns from the start for every
// conversation: it answers a request with the turn after those the
// conversation already holds, counting the model's turns in the request's
// input (each run of consecutive model output items, between the user's
// messages and the tool outputs, is one turn). Any number of conversations
// share one server this way, each at its own place in the script, and a
// conversation resumed from its history (after a restart, or an approval)
// goes on where it stopped. `harness serve --replay` answers every run so.
//
// A conversation past the script's end is answered 400 saying so. A
// conversation compacted on the provider's side (ItemCompaction) has lost
// the turns before the compaction, so its count is not the script's.
func FromStart(turns ...Turn) Responder {
	turns = append([]Turn(nil), turns...)
	return func(req *Request) Turn {
		n := ModelTurns(req)
		if n < len(turns) {
			return turns[n]
		}
		return Turn{Fault: &Fault{Status: http.StatusBadRequest,
			Message: fmt.Sprintf("replay: the script has %d turns, and this conversation made them all", len(turns))}}
	}
}

// ModelTurns counts the model's turns in a request's input: the runs of
// consecutive model output items (assistant messages, tool calls,
// reasoning, compaction).
func ModelTurns(req *Request) int {
	n, inTurn := 0, false
	for _, it := range req.Input() {
		t, _ := it["type"].(string)
		role, _ := it["role"].(string)
		model := false
		switch ItemType(t) {
		case ItemFunctionCall, ItemCustomToolCall, ItemReasoning, ItemCompaction:
			model = true
		case ItemMessage, "":
			model = role == "assistant"
		}
		if model && !inTurn {
			n++
		}
		inTurn = model
	}
	return n
}
