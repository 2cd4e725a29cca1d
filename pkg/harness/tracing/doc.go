// Package tracing gives the harness OpenTelemetry spans for runs, turns,
// model calls, tool calls, handoffs and approvals. It uses the
// OpenTelemetry API only: the trace providers that export spans (OTLP over
// HTTP, or stdout for local debugging) are built by package traceexport,
// apart so that a program embedding the harness links no exporter unless
// it asks for one.
//
// A Tracer is made from a trace.TracerProvider; nil (or a nil *Tracer)
// means the global OpenTelemetry provider, which records nothing unless the
// application installed one with otel.SetTracerProvider. The package keeps
// no state of its own.
//
// The runner calls the helpers like this (tr may be nil):
//
//	tr := tracing.New(cfg.TracerProvider)
//	ctx, run := tr.StartRun(ctx, agent.Name, tracing.WithMaxTurns(max), tracing.WithResumed(resumed))
//	defer func() { tracing.EndRun(run, tracing.RunResult{Turns: n, Usage: u, PendingApprovals: p}, err) }()
//	tracing.SetSession(run, sess.ID(), sess.Provider())
//
//	tctx, turn := tr.StartTurn(ctx, n, agent.Name, modelName)
//	mctx, mc := tr.StartModelCall(tctx, modelName)
//	resp, err := callModel(mctx) // the model's HTTP calls are children
//	tracing.EndModelCall(mc, resp, err)
//	cctx, tc := tr.StartToolCall(tctx, call.Name, call.CallID)
//	res, err := t.Call(cctx, tcx, input) // sandbox gRPC spans are children
//	tracing.EndToolCall(tc, res.IsError, err)
//	tracing.RecordApproval(tctx, call.Name, call.CallID, tracing.ApprovalPending)
//	_, h := tr.StartHandoff(tctx, from, to)
//	tracing.EndHandoff(h, nil)
//	tracing.EndTurn(turn, err)
//
// # What spans carry, and what they never carry
//
// Spans carry names and numbers only: agent, tool and model names, call
// and response ids, turn numbers, token counts, session, provider and
// snapshot ids. The helpers take no tool inputs or outputs, prompts,
// instructions, model output, file contents or environment, so none can
// reach an exporter. Errors are recorded as the span's status with an
// error.type (a compute error class such as "not_found", a context error,
// or the Go type of the innermost error), never with the error's message:
// messages may quote a file (a rejected patch quotes the lines it looked
// for) or echo the model's input.
//
// Span names, kinds and gen_ai.* attributes follow OpenTelemetry's GenAI
// semantic conventions (agent spans, inference spans, execute_tool
// spans); bulkhead.* attributes add what the conventions do not cover.
//
// Attribute names (stable):
//
//	span "invoke_agent <agent>" (StartRun / EndRun)
//	  gen_ai.operation.name        "invoke_agent"
//	  bulkhead.agent, gen_ai.agent.name
//	  gen_ai.provider.name         (WithProvider: the start agent's model's, "openai")
//	  gen_ai.conversation.id       (WithConversation: RunConfig.ConversationID)
//	  bulkhead.run.max_turns, bulkhead.run.resumed, bulkhead.run.streamed
//	  bulkhead.session.id, bulkhead.provider   (WithSession / SetSession)
//	  at the end: bulkhead.run.turns, bulkhead.run.final_agent,
//	  bulkhead.run.interrupted, bulkhead.run.pending_approvals, usage (below)
//	span "turn" (StartTurn / EndTurn)
//	  bulkhead.turn, bulkhead.agent, gen_ai.request.model
//	span "chat <model>", kind client (StartModelCall / EndModelCall)
//	  gen_ai.operation.name "chat", gen_ai.provider.name, gen_ai.conversation.id,
//	  gen_ai.request.model,
//	  gen_ai.response.model, gen_ai.response.id, bulkhead.model.status,
//	  bulkhead.model.incomplete_reason, bulkhead.model.attempts,
//	  gen_ai.usage.input_tokens, gen_ai.usage.output_tokens,
//	  bulkhead.usage.cached_input_tokens, bulkhead.usage.reasoning_tokens,
//	  bulkhead.usage.total_tokens, bulkhead.usage.requests
//	span "execute_tool <tool>" (StartToolCall / EndToolCall)
//	  gen_ai.operation.name "execute_tool", bulkhead.tool.name,
//	  gen_ai.tool.name, gen_ai.tool.type "function", bulkhead.tool.call_id,
//	  gen_ai.tool.call.id, bulkhead.tool.is_error
//	span "handoff" (StartHandoff / EndHandoff)
//	  bulkhead.handoff.from, bulkhead.handoff.to
//	event "approval" on the current span (RecordApproval)
//	  bulkhead.tool.name, bulkhead.tool.call_id, bulkhead.approval.decision
//	any span that failed
//	  error.type, status Error (description: the error.type)
//
// The compute plane (package compute, with ClientOptions.TracerProvider)
// adds spans for sandbox operations with bulkhead.session.id,
// bulkhead.provider and bulkhead.snapshot.id, and agentclient (with
// Options.TracerProvider) a client span per gRPC call to the daemon.
package tracing
