package replay

// ItemType names the kind of an output item, as the wire's "type" field does.
type ItemType string

// The output item types the server can emit.
const (
	ItemMessage        ItemType = "message"
	ItemFunctionCall   ItemType = "function_call"
	ItemCustomToolCall ItemType = "custom_tool_call"
	ItemReasoning      ItemType = "reasoning"
	// ItemCompaction is the opaque item server-side compaction produces
	// (when the request's context_management has a compaction entry).
	ItemCompaction ItemType = "compaction"
)

// Item is one output item of a scripted turn. Which fields matter depends on
// Type; the constructors [Message], [FunctionCall], [CustomToolCall],
// [Reasoning] and [Compaction] fill the right ones. An empty ID is replaced by
// a generated one ("msg_…", "fc_…", "ctc_…", "rs_…", "cmp_…").
type Item struct {
	Type ItemType
	ID   string

	// Text is the assistant message text (ItemMessage).
	Text string

	// CallID and Name identify a tool call (ItemFunctionCall, ItemCustomToolCall).
	CallID string
	Name   string
	// Arguments is the JSON argument string of a function call.
	Arguments string
	// Input is the raw input of a custom (freeform) tool call.
	Input string

	// Summary holds the reasoning summary parts, EncryptedContent the opaque
	// reasoning state returned when reasoning.encrypted_content is included,
	// or the opaque state of a compaction item.
	Summary          []string
	EncryptedContent string
}

// Message returns an assistant message item carrying text.
func Message(text string) Item { return Item{Type: ItemMessage, Text: text} }

// FunctionCall returns a function tool call item.
func FunctionCall(callID, name, arguments string) Item {
	return Item{Type: ItemFunctionCall, CallID: callID, Name: name, Arguments: arguments}
}

// CustomToolCall returns a custom (freeform) tool call item.
func CustomToolCall(callID, name, input string) Item {
	return Item{Type: ItemCustomToolCall, CallID: callID, Name: name, Input: input}
}

// Reasoning returns a reasoning item with an explicit id, opaque encrypted
// content and summary parts.
func Reasoning(id, encryptedContent string, summary ...string) Item {
	return Item{Type: ItemReasoning, ID: id, EncryptedContent: encryptedContent, Summary: summary}
}

// Compaction returns a compaction item, as server-side compaction emits it:
// {"type": "compaction", "id": id, "encrypted_content": encryptedContent}.
// An empty id is generated.
func Compaction(id, encryptedContent string) Item {
	return Item{Type: ItemCompaction, ID: id, EncryptedContent: encryptedContent}
}

// Usage is the token accounting reported with a completed turn.
type Usage struct {
	InputTokens     int64
	CachedTokens    int64
	OutputTokens    int64
	ReasoningTokens int64
}

// Fault makes a turn fail instead of (or part-way through) answering.
type Fault struct {
	// Status, when non-zero, answers the request with this HTTP status and an
	// OpenAI-style error body instead of the turn's output.
	Status int
	// Message is the error message in the body; a default names the status.
	Message string
	// RetryAfter is sent as the Retry-After header when non-empty ("2", or an
	// HTTP date); RetryAfterMS as retry-after-ms when non-empty.
	RetryAfter   string
	RetryAfterMS string

	// DropAfterEvents, when positive, cuts the connection (without a clean end
	// of body) after this many server-sent events. For a non-streaming request
	// the connection is cut after the headers and half of the body.
	DropAfterEvents int

	// FailCode, when non-empty, ends the stream (or the JSON answer) with a
	// response.failed event whose error has this code ("server_error",
	// "rate_limit_exceeded", "invalid_prompt", ...) and Message, instead of
	// response.completed.
	FailCode string

	// StallAfterEvents, when positive, stops sending after this many events and
	// holds the connection open until the client goes away or the server is
	// closed.
	StallAfterEvents int
}

// Turn is the scripted answer to one request: the output items of one model
// response, its usage, and optionally a fault.
type Turn struct {
	// ResponseID is the response's id; empty means "resp_<n>".
	ResponseID string
	Items      []Item
	Usage      Usage
	// Incomplete, when non-empty, ends the response with status "incomplete"
	// and this reason (e.g. "max_output_tokens") instead of "completed".
	Incomplete string
	// ChunkSize is the number of bytes per delta event; 0 means 4.
	ChunkSize int
	// Fault, when set, injects an error.
	Fault *Fault
}

// Fail returns a turn that answers with an HTTP error status.
func Fail(status int) Turn { return Turn{Fault: &Fault{Status: status}} }

// RateLimited returns a turn that answers 429 with the given Retry-After header
// value (seconds) and retry-after-ms value; either may be empty.
func RateLimited(retryAfter, retryAfterMS string) Turn {
	return Turn{Fault: &Fault{Status: 429, RetryAfter: retryAfter, RetryAfterMS: retryAfterMS}}
}

// Dropped returns a copy of t whose stream is cut after n events.
func (t Turn) Dropped(n int) Turn {
	t.Fault = &Fault{DropAfterEvents: n}
	return t
}

// FailedWith returns a copy of t that ends in response.failed with an error of
// the given code and message.
func (t Turn) FailedWith(code, message string) Turn {
	t.Fault = &Fault{FailCode: code, Message: message}
	return t
}

// Stalled returns a copy of t whose stream stops after n events and hangs
// until the client goes away.
func (t Turn) Stalled(n int) Turn {
	t.Fault = &Fault{StallAfterEvents: n}
	return t
}

// Responder chooses the turn that answers a request; it lets a script match on
// what the model was sent (the tools offered, the last tool output, ...).
type Responder func(req *Request) Turn
