package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// ScopeName is the instrumentation scope of the harness's spans.
const ScopeName = "github.com/bulkhead-dev/bulkhead/pkg/harness"

// Attribute names. They are part of the package's contract: dashboards and
// tests rely on them.
const (
	AttrOperation      = "gen_ai.operation.name"
	AttrProviderName   = "gen_ai.provider.name"
	AttrConversationID = "gen_ai.conversation.id"
	AttrErrorType      = "error.type"

	AttrAgent       = "bulkhead.agent"
	AttrGenAIAgent  = "gen_ai.agent.name"
	AttrMaxTurns    = "bulkhead.run.max_turns"
	AttrResumed     = "bulkhead.run.resumed"
	AttrStreamed    = "bulkhead.run.streamed"
	AttrTurns       = "bulkhead.run.turns"
	AttrFinalAgent  = "bulkhead.run.final_agent"
	AttrInterrupted = "bulkhead.run.interrupted"
	AttrPending     = "bulkhead.run.pending_approvals"
	AttrSessionID   = "bulkhead.session.id"
	AttrProvider    = "bulkhead.provider"
	AttrSnapshotID  = "bulkhead.snapshot.id"

	AttrTurn = "bulkhead.turn"

	AttrRequestModel     = "gen_ai.request.model"
	AttrResponseModel    = "gen_ai.response.model"
	AttrResponseID       = "gen_ai.response.id"
	AttrModelStatus      = "bulkhead.model.status"
	AttrIncompleteReason = "bulkhead.model.incomplete_reason"
	AttrAttempts         = "bulkhead.model.attempts"
	AttrInputTokens      = "gen_ai.usage.input_tokens"
	AttrOutputTokens     = "gen_ai.usage.output_tokens"
	AttrCachedTokens     = "bulkhead.usage.cached_input_tokens"
	AttrReasoningTokens  = "bulkhead.usage.reasoning_tokens"
	AttrTotalTokens      = "bulkhead.usage.total_tokens"
	AttrRequests         = "bulkhead.usage.requests"

	AttrToolName      = "bulkhead.tool.name"
	AttrGenAIToolName = "gen_ai.tool.name"
	AttrToolCallID    = "bulkhead.tool.call_id"
	AttrGenAICallID   = "gen_ai.tool.call.id"
	AttrToolType      = "gen_ai.tool.type"
	AttrToolIsError   = "bulkhead.tool.is_error"

	AttrHandoffFrom = "bulkhead.handoff.from"
	AttrHandoffTo   = "bulkhead.handoff.to"

	AttrApproval = "bulkhead.approval.decision"
)

// Values of gen_ai.operation.name.
const (
	OpInvokeAgent = "invoke_agent"
	OpChat        = "chat"
	OpExecuteTool = "execute_tool"
)

// Tracer starts the harness's spans. The zero value and a nil *Tracer use
// the global provider. A Tracer is safe for concurrent use.
type Tracer struct {
	t trace.Tracer
}

// New returns a Tracer over tp; nil means the global OpenTelemetry
// provider (a no-op unless the application set one; setting it later is
// honoured).
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return &Tracer{}
	}
	return &Tracer{t: tracerOf(tp)}
}

func tracerOf(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(ScopeName, trace.WithInstrumentationVersion(buildinfo.Version()))
}

func (t *Tracer) tracer() trace.Tracer {
	if t == nil || t.t == nil {
		// The global provider delegates to whatever the application
		// installs, even after this call.
		return tracerOf(otel.GetTracerProvider())
	}
	return t.t
}

func (t *Tracer) start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return t.tracer().Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// RunOption adds facts about a run to its span (WithProvider and
// WithConversation also to a model call's).
type RunOption func(*[]attribute.KeyValue)

// WithProvider records the model's provider (gen_ai.provider.name, as
// model.ProviderName gives it: "openai"); "" records nothing.
func WithProvider(name string) RunOption {
	return func(a *[]attribute.KeyValue) {
		if name != "" {
			*a = append(*a, attribute.String(AttrProviderName, name))
		}
	}
}

// WithConversation records the conversation the run belongs to
// (gen_ai.conversation.id: the service's run id, say); "" records nothing.
func WithConversation(id string) RunOption {
	return func(a *[]attribute.KeyValue) {
		if id != "" {
			*a = append(*a, attribute.String(AttrConversationID, id))
		}
	}
}

// WithMaxTurns records the run's turn limit.
func WithMaxTurns(n int) RunOption {
	return func(a *[]attribute.KeyValue) { *a = append(*a, attribute.Int(AttrMaxTurns, n)) }
}

// WithResumed marks a run resumed from a RunState.
func WithResumed(resumed bool) RunOption {
	return func(a *[]attribute.KeyValue) { *a = append(*a, attribute.Bool(AttrResumed, resumed)) }
}

// WithStreamed marks a streamed run.
func WithStreamed(streamed bool) RunOption {
	return func(a *[]attribute.KeyValue) { *a = append(*a, attribute.Bool(AttrStreamed, streamed)) }
}

// WithSession records the run's sandbox session (see also SetSession, for
// a session resolved after the run started).
func WithSession(sessionID, provider string) RunOption {
	return func(a *[]attribute.KeyValue) { *a = append(*a, sessionAttrs(sessionID, provider)...) }
}

func sessionAttrs(sessionID, provider string) []attribute.KeyValue {
	var out []attribute.KeyValue
	if sessionID != "" {
		out = append(out, attribute.String(AttrSessionID, sessionID))
	}
	if provider != "" {
		out = append(out, attribute.String(AttrProvider, provider))
	}
	return out
}

// StartRun starts the span of one run of agent (a nested run, agent as a
// tool, becomes a child of the tool call's span through ctx). End it with
// EndRun.
func (t *Tracer) StartRun(ctx context.Context, agent string, opts ...RunOption) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attribute.String(AttrOperation, OpInvokeAgent),
		attribute.String(AttrAgent, agent),
		attribute.String(AttrGenAIAgent, agent),
	}
	for _, o := range opts {
		o(&attrs)
	}
	return t.start(ctx, OpInvokeAgent+" "+agent, trace.SpanKindInternal, attrs...)
}

// SetSession records the sandbox session on span (a run's, typically).
func SetSession(span trace.Span, sessionID, provider string) {
	span.SetAttributes(sessionAttrs(sessionID, provider)...)
}

// RunResult is how a run ended.
type RunResult struct {
	// Turns is the number of turns taken.
	Turns int
	// FinalAgent is the agent that had the conversation last ("" leaves
	// it out).
	FinalAgent string
	// Usage is the run's token accounting.
	Usage model.Usage
	// PendingApprovals is the number of tool calls waiting for a decision;
	// more than zero means the run was interrupted for approval.
	PendingApprovals int
}

// EndRun records res and err on a run's span and ends it.
func EndRun(span trace.Span, res RunResult, err error) {
	attrs := []attribute.KeyValue{
		attribute.Int(AttrTurns, res.Turns),
		attribute.Bool(AttrInterrupted, res.PendingApprovals > 0),
		attribute.Int(AttrPending, res.PendingApprovals),
	}
	if res.FinalAgent != "" {
		attrs = append(attrs, attribute.String(AttrFinalAgent, res.FinalAgent))
	}
	span.SetAttributes(append(attrs, usageAttrs(res.Usage)...)...)
	End(span, err)
}

// StartTurn starts the span of one turn (1-based) of agent with model.
// End it with EndTurn.
func (t *Tracer) StartTurn(ctx context.Context, turn int, agent, modelName string) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{attribute.Int(AttrTurn, turn)}
	if agent != "" {
		attrs = append(attrs, attribute.String(AttrAgent, agent))
	}
	if modelName != "" {
		attrs = append(attrs, attribute.String(AttrRequestModel, modelName))
	}
	return t.start(ctx, "turn", trace.SpanKindInternal, attrs...)
}

// EndTurn records err on a turn's span and ends it.
func EndTurn(span trace.Span, err error) { End(span, err) }

// StartModelCall starts the span of one model request (all its retries);
// opts may add WithProvider and WithConversation. End it with
// EndModelCall.
func (t *Tracer) StartModelCall(ctx context.Context, modelName string, opts ...RunOption) (context.Context, trace.Span) {
	name := OpChat
	if modelName != "" {
		name += " " + modelName
	}
	attrs := []attribute.KeyValue{attribute.String(AttrOperation, OpChat), attribute.String(AttrRequestModel, modelName)}
	for _, o := range opts {
		o(&attrs)
	}
	return t.start(ctx, name, trace.SpanKindClient, attrs...)
}

// EndModelCall records the response's id, model, status and token usage
// (never its output) and err on a model call's span, and ends it. resp may
// be nil.
func EndModelCall(span trace.Span, resp *model.Response, err error) {
	if resp != nil {
		var attrs []attribute.KeyValue
		if resp.ID != "" {
			attrs = append(attrs, attribute.String(AttrResponseID, resp.ID))
		}
		if resp.Model != "" {
			attrs = append(attrs, attribute.String(AttrResponseModel, resp.Model))
		}
		if resp.Status != "" {
			attrs = append(attrs, attribute.String(AttrModelStatus, resp.Status))
		}
		if resp.IncompleteReason != "" {
			attrs = append(attrs, attribute.String(AttrIncompleteReason, resp.IncompleteReason))
		}
		if resp.Attempts > 0 {
			attrs = append(attrs, attribute.Int(AttrAttempts, resp.Attempts))
		}
		span.SetAttributes(append(attrs, usageAttrs(resp.Usage)...)...)
	}
	End(span, err)
}

func usageAttrs(u model.Usage) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.Int64(AttrInputTokens, u.InputTokens),
		attribute.Int64(AttrOutputTokens, u.OutputTokens),
		attribute.Int64(AttrCachedTokens, u.CachedInputTokens),
		attribute.Int64(AttrReasoningTokens, u.ReasoningTokens),
		attribute.Int64(AttrTotalTokens, u.TotalTokens),
		attribute.Int(AttrRequests, u.Requests),
	}
}

// StartToolCall starts the span of one tool call; its input is not
// recorded. End it with EndToolCall.
func (t *Tracer) StartToolCall(ctx context.Context, tool, callID string) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attribute.String(AttrOperation, OpExecuteTool),
		attribute.String(AttrToolName, tool),
		attribute.String(AttrGenAIToolName, tool),
		// Every tool runs in the harness, on the model's function call.
		attribute.String(AttrToolType, "function"),
	}
	if callID != "" {
		attrs = append(attrs, attribute.String(AttrToolCallID, callID), attribute.String(AttrGenAICallID, callID))
	}
	return t.start(ctx, OpExecuteTool+" "+tool, trace.SpanKindInternal, attrs...)
}

// EndToolCall ends a tool call's span: isError is the result's IsError (a
// failure shown to the model, whose text is not recorded), err a failure
// of the harness. Either marks the span as failed.
func EndToolCall(span trace.Span, isError bool, err error) {
	span.SetAttributes(attribute.Bool(AttrToolIsError, isError))
	if err == nil && isError {
		span.SetAttributes(attribute.String(AttrErrorType, "tool_error"))
		span.SetStatus(codes.Error, "tool_error")
	}
	End(span, err)
}

// StartHandoff starts the span of a handoff from one agent to another.
// End it with EndHandoff.
func (t *Tracer) StartHandoff(ctx context.Context, from, to string) (context.Context, trace.Span) {
	return t.start(ctx, "handoff", trace.SpanKindInternal,
		attribute.String(AttrHandoffFrom, from), attribute.String(AttrHandoffTo, to))
}

// EndHandoff records err on a handoff's span and ends it.
func EndHandoff(span trace.Span, err error) { End(span, err) }

// Approval decisions recorded by RecordApproval.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
)

// RecordApproval adds an "approval" event to the span in ctx: the call is
// waiting for a decision (ApprovalPending) or was approved or rejected.
// The rejection's message is not recorded.
func RecordApproval(ctx context.Context, tool, callID, decision string) {
	trace.SpanFromContext(ctx).AddEvent("approval", trace.WithAttributes(
		attribute.String(AttrToolName, tool),
		attribute.String(AttrToolCallID, callID),
		attribute.String(AttrApproval, decision),
	))
}

// End records err (when not nil) as span's status, by its class only, and
// ends span. Use it for spans started by hand.
func End(span trace.Span, err error) {
	if err != nil {
		typ := ErrorType(err)
		span.SetAttributes(attribute.String(AttrErrorType, typ))
		span.SetStatus(codes.Error, typ)
	}
	span.End()
}
