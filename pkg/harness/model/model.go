// Package model is the harness's view of a language model: one call takes the
// conversation so far (instructions, input items, tools, settings) and streams
// back typed events ending in a complete [Response].
//
// [OpenAI] implements [Model] on the OpenAI Responses API through openai-go,
// with its own retries (the SDK's are disabled) and a stateless conversation:
// store=false, with reasoning and compaction items and their encrypted
// content passed back by the caller on the next call.
package model

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"iter"
	"strings"
)

// Model is a language model the runner calls once per turn.
type Model interface {
	// Stream sends req and yields the response as it arrives. The sequence ends
	// after one EventCompleted, or after a non-nil error (the last pair
	// yielded). Breaking out of the loop cancels the call.
	//
	// A call that is retried after output was already yielded first yields an
	// EventReset: the consumer must discard everything it received for this
	// call so far. Tool calls must therefore be acted on only from the
	// EventCompleted response, never from EventItemDone.
	Stream(ctx context.Context, req *Request) iter.Seq2[Event, error]
}

// ProviderNamer is implemented by models that know their provider's name,
// as OpenTelemetry's GenAI conventions spell it in gen_ai.provider.name
// ("openai", "anthropic", "gcp.vertex_ai", ...).
type ProviderNamer interface {
	ProviderName() string
}

// ProviderName returns m's provider name, or "" when m does not say (see
// ProviderNamer).
func ProviderName(m Model) string {
	if p, ok := m.(ProviderNamer); ok {
		return p.ProviderName()
	}
	return ""
}

// Respond runs one call on m and returns the completed response, ignoring
// intermediate events.
func Respond(ctx context.Context, m Model, req *Request) (*Response, error) {
	for ev, err := range m.Stream(ctx, req) {
		if err != nil {
			return nil, err
		}
		if ev.Kind == EventCompleted {
			return ev.Response, nil
		}
	}
	return nil, errors.New("model: stream ended without a completed response")
}

// Request is one model call.
type Request struct {
	// Model overrides the implementation's default model name.
	Model        string
	Instructions string
	Input        []Item
	Tools        []Tool
	// ToolChoice is "" (the API default), "auto", "none", "required", or the
	// name of one tool in Tools, which the model is then forced to call.
	ToolChoice string
	// ParallelToolCalls, when set, allows or forbids several tool calls in one
	// response.
	ParallelToolCalls *bool
	// Output, when set, asks for structured output matching a JSON schema.
	Output *OutputSchema
	// Reasoning configures a reasoning model. When set (even to the zero
	// value) and Settings.Store is false, the encrypted reasoning content is
	// requested so that reasoning items can be passed back on the next call.
	Reasoning *Reasoning
	// ContextManagement configures server-side context management (the
	// request's context_management). With a compaction entry the provider
	// compacts the conversation once its rendered size crosses the entry's
	// threshold and returns an ItemCompaction output item, which the caller
	// passes back like any other output item; the items before the last
	// compaction item may then be left out of later requests.
	ContextManagement []ContextManagement
	Settings          Settings
}

// ContextCompaction is the ContextManagement type of server-side compaction.
const ContextCompaction = "compaction"

// ContextManagement is one context management entry of a request. On the
// wire: {"type": "compaction", "compact_threshold": 240000}.
type ContextManagement struct {
	// Type is the entry's kind; ContextCompaction is the only one defined.
	Type string
	// CompactThreshold is the rendered token count at which the provider
	// compacts the context; 0 leaves it to the provider.
	CompactThreshold int64
}

// Compaction returns a server-side compaction entry triggered at threshold
// tokens (0: the provider's default).
func Compaction(threshold int64) ContextManagement {
	return ContextManagement{Type: ContextCompaction, CompactThreshold: threshold}
}

// Settings are sampling and bookkeeping options of a call.
type Settings struct {
	Temperature     *float64
	TopP            *float64
	MaxOutputTokens int64 // 0: the model's default
	// Store keeps the response on the provider's side. The default, false,
	// keeps runs stateless: nothing is stored and the caller passes the
	// whole conversation each time.
	Store          bool
	PromptCacheKey string
	Metadata       map[string]string
}

// Reasoning configures reasoning effort and summaries.
type Reasoning struct {
	Effort  string // "minimal", "low", "medium", "high", ...; "" for the default
	Summary string // "auto", "concise", "detailed"; "" for none
}

// OutputSchema describes a structured output (text.format json_schema).
type OutputSchema struct {
	Name        string
	Description string
	Schema      json.RawMessage
	Strict      bool
}

// ToolKind is the kind of a tool definition.
type ToolKind string

// Tool kinds.
const (
	// ToolFunction takes JSON arguments validated against a schema.
	ToolFunction ToolKind = "function"
	// ToolCustom takes free-form text input, optionally constrained by a grammar.
	ToolCustom ToolKind = "custom"
)

// Tool is a tool the model may call.
type Tool struct {
	Kind        ToolKind
	Name        string
	Description string
	// Parameters is the JSON schema of a function tool's arguments.
	Parameters json.RawMessage
	// Strict asks for strict schema adherence (function tools).
	Strict bool
	// Grammar constrains a custom tool's input; nil means free text.
	Grammar *Grammar
}

// Grammar is a custom tool's input grammar.
type Grammar struct {
	Syntax     string // "lark" or "regex"
	Definition string
}

// FunctionTool returns a function tool definition.
func FunctionTool(name, description string, parameters json.RawMessage, strict bool) Tool {
	return Tool{Kind: ToolFunction, Name: name, Description: description, Parameters: parameters, Strict: strict}
}

// CustomTool returns a custom (freeform) tool definition; g may be nil.
func CustomTool(name, description string, g *Grammar) Tool {
	return Tool{Kind: ToolCustom, Name: name, Description: description, Grammar: g}
}

// ItemKind is the kind of a conversation item, as the wire's "type" names it.
type ItemKind string

// Item kinds.
const (
	ItemMessage              ItemKind = "message"
	ItemFunctionCall         ItemKind = "function_call"
	ItemFunctionCallOutput   ItemKind = "function_call_output"
	ItemCustomToolCall       ItemKind = "custom_tool_call"
	ItemCustomToolCallOutput ItemKind = "custom_tool_call_output"
	ItemReasoning            ItemKind = "reasoning"
	// ItemCompaction is an opaque summary of the conversation before it,
	// produced by server-side compaction (see Request.ContextManagement).
	// It carries ID and EncryptedContent and is passed back verbatim.
	ItemCompaction ItemKind = "compaction"
)

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleSystem    = "system"
	RoleDeveloper = "developer"
)

// Item is one conversation item: input the caller sends, or output the model
// produced. Output items are meant to be sent back unchanged on the next call.
type Item struct {
	Kind ItemKind
	// ID is the provider's item id (output items); optional on input.
	ID string

	// Role and Content make a message. Content may also carry the text and
	// images of a tool output.
	Role    string
	Content []Content

	// CallID ties a tool call to its output; Name is the tool's name.
	CallID string
	Name   string
	// Arguments is a function call's JSON argument string.
	Arguments string
	// Input is a custom tool call's raw input.
	Input string
	// Output is a tool output as plain text, used when Content is empty.
	Output string

	// Summary, ReasoningText and EncryptedContent make a reasoning item.
	// EncryptedContent is also the opaque state of a compaction item.
	Summary          []string
	ReasoningText    []string
	EncryptedContent string
}

// Text returns the concatenated text content of a message item.
func (it Item) Text() string {
	var b strings.Builder
	for _, c := range it.Content {
		if c.Kind == ContentText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// UserMessage returns a user message item.
func UserMessage(text string) Item {
	return Item{Kind: ItemMessage, Role: RoleUser, Content: []Content{TextContent(text)}}
}

// AssistantMessage returns an assistant message item.
func AssistantMessage(text string) Item {
	return Item{Kind: ItemMessage, Role: RoleAssistant, Content: []Content{TextContent(text)}}
}

// FunctionCallOutput returns the text output of the function call callID.
func FunctionCallOutput(callID, output string) Item {
	return Item{Kind: ItemFunctionCallOutput, CallID: callID, Output: output}
}

// CustomToolCallOutput returns the text output of the custom tool call callID.
func CustomToolCallOutput(callID, output string) Item {
	return Item{Kind: ItemCustomToolCallOutput, CallID: callID, Output: output}
}

// ContentKind is the kind of a content part.
type ContentKind string

// Content kinds.
const (
	ContentText  ContentKind = "text"
	ContentImage ContentKind = "image"
)

// Content is one part of a message or tool output.
type Content struct {
	Kind ContentKind
	Text string
	// ImageURL is an https or data: URL; FileID an uploaded file's id.
	ImageURL string
	FileID   string
	// Detail is the image detail level: "low", "high", "auto" (default).
	Detail string
}

// TextContent returns a text part.
func TextContent(s string) Content { return Content{Kind: ContentText, Text: s} }

// ImageContent returns an image part from a URL.
func ImageContent(url, detail string) Content {
	return Content{Kind: ContentImage, ImageURL: url, Detail: detail}
}

// ImageDataContent returns an image part carrying data inline as a data: URL
// of the given media type (e.g. "image/png").
func ImageDataContent(mediaType string, data []byte, detail string) Content {
	return ImageContent("data:"+mediaType+";base64,"+base64.StdEncoding.EncodeToString(data), detail)
}

// Usage is token accounting.
type Usage struct {
	// Requests counts the completed model responses accounted for.
	Requests          int
	InputTokens       int64
	CachedInputTokens int64
	OutputTokens      int64
	ReasoningTokens   int64
	TotalTokens       int64
}

// Add adds o to u.
func (u *Usage) Add(o Usage) {
	u.Requests += o.Requests
	u.InputTokens += o.InputTokens
	u.CachedInputTokens += o.CachedInputTokens
	u.OutputTokens += o.OutputTokens
	u.ReasoningTokens += o.ReasoningTokens
	u.TotalTokens += o.TotalTokens
}

// Response is a completed model response.
type Response struct {
	ID    string
	Model string
	// Status is "completed" or "incomplete"; IncompleteReason says why
	// ("max_output_tokens", "content_filter").
	Status           string
	IncompleteReason string
	Output           []Item
	Usage            Usage
	// Attempts is the number of HTTP requests the call took (1 without retries).
	Attempts int
}

// Text returns the text of the response's assistant messages.
func (r *Response) Text() string {
	var b strings.Builder
	for _, it := range r.Output {
		if it.Kind == ItemMessage {
			b.WriteString(it.Text())
		}
	}
	return b.String()
}

// ToolCalls returns the function and custom tool calls in the response.
func (r *Response) ToolCalls() []Item {
	var out []Item
	for _, it := range r.Output {
		if it.Kind == ItemFunctionCall || it.Kind == ItemCustomToolCall {
			out = append(out, it)
		}
	}
	return out
}

// EventKind is the kind of a streamed event.
type EventKind int

// Event kinds.
const (
	// EventTextDelta carries a piece of assistant message text.
	EventTextDelta EventKind = iota + 1
	// EventReasoningDelta carries a piece of a reasoning summary.
	EventReasoningDelta
	// EventToolCallDelta carries a piece of a function call's arguments or a
	// custom tool call's input.
	EventToolCallDelta
	// EventItemDone carries a finished output item (informational; act on
	// the EventCompleted response).
	EventItemDone
	// EventReset says the call is being retried after output was delivered:
	// discard everything received for this call so far.
	EventReset
	// EventCompleted carries the completed response; it is the last event.
	EventCompleted
)

// String names the kind.
func (k EventKind) String() string {
	switch k {
	case EventTextDelta:
		return "text_delta"
	case EventReasoningDelta:
		return "reasoning_delta"
	case EventToolCallDelta:
		return "tool_call_delta"
	case EventItemDone:
		return "item_done"
	case EventReset:
		return "reset"
	case EventCompleted:
		return "completed"
	}
	return "unknown"
}

// Event is one streamed event.
type Event struct {
	Kind EventKind
	// ItemID and OutputIndex locate a delta or item in the response.
	ItemID      string
	OutputIndex int
	Delta       string
	Item        *Item     // EventItemDone
	Response    *Response // EventCompleted
	Reset       *Reset    // EventReset
}

// Reset describes a retry after delivered output.
type Reset struct {
	// Attempt is the attempt about to start (2 for the first retry).
	Attempt int
	// Err is why the previous attempt failed.
	Err error
}
