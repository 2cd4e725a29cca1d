package harness

import (
	"context"
	"errors"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// RunObserver is told how runs go, for metrics (pkg/harness/metrics
// implements it); set it as RunConfig.Observer. Its methods are called
// synchronously from the run's goroutine, so they must be quick; one
// observer may watch many runs at once, so they must be safe for
// concurrent use. What it is given is names, numbers and outcomes: never
// prompts, tool inputs or outputs.
type RunObserver interface {
	// RunStarted is called when a run (Run, Resume or a streamed one)
	// begins.
	RunStarted(ctx context.Context, run RunInfo)
	// RunEnded is called once for every RunStarted, when the run ended.
	RunEnded(ctx context.Context, run RunInfo, outcome RunOutcome, d time.Duration)
	// ModelCalled is called after every model request (with its retries).
	ModelCalled(ctx context.Context, call ModelCallInfo)
	// ToolCalled is called after every tool call the model made that the
	// runner answered (handoffs excepted), including unknown tools and
	// calls rejected by approval.
	ToolCalled(ctx context.Context, call ToolCallInfo)
}

// RunInfo describes a run to a RunObserver.
type RunInfo struct {
	// Agent is the name of the agent the run was started with.
	Agent string
	// Resumed is true for a run continued from a RunState.
	Resumed bool
	// Streamed is true for RunStreamed and ResumeStreamed.
	Streamed bool
}

// RunOutcome is how a run ended.
type RunOutcome string

// Run outcomes.
const (
	// OutcomeCompleted: the run gave its final output.
	OutcomeCompleted RunOutcome = "completed"
	// OutcomeInterrupted: the run stopped for approvals (resume it).
	OutcomeInterrupted RunOutcome = "interrupted"
	// OutcomeMaxTurns: the run used its turns (ErrMaxTurns).
	OutcomeMaxTurns RunOutcome = "max_turns"
	// OutcomeCancelled: the run's context was cancelled.
	OutcomeCancelled RunOutcome = "cancelled"
	// OutcomeTimedOut: the run's context deadline passed.
	OutcomeTimedOut RunOutcome = "timed_out"
	// OutcomeFailed: any other error.
	OutcomeFailed RunOutcome = "failed"
)

// outcomeOf classifies how a run ended.
func outcomeOf(res *Result, err error) RunOutcome {
	switch {
	case err == nil && res != nil && len(res.Interruptions) > 0:
		return OutcomeInterrupted
	case err == nil:
		return OutcomeCompleted
	case errors.Is(err, ErrMaxTurns):
		return OutcomeMaxTurns
	case errors.Is(err, context.Canceled):
		return OutcomeCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimedOut
	}
	return OutcomeFailed
}

// ModelCallInfo describes one model request to a RunObserver.
type ModelCallInfo struct {
	// Agent is the key of the agent whose turn it was.
	Agent string
	// Model is the model name requested.
	Model string
	// ResponseModel is the model name the response reports ("" on error).
	ResponseModel string
	// Duration covers the whole request, retries included.
	Duration time.Duration
	// Usage is the response's token usage (zero on error).
	Usage model.Usage
	// Err is the request's error; nil when it succeeded.
	Err error
}

// ToolOutcome is how a tool call ended.
type ToolOutcome string

// Tool call outcomes.
const (
	// ToolOK: the tool returned a result.
	ToolOK ToolOutcome = "ok"
	// ToolError: the tool returned an error result, shown to the model.
	ToolError ToolOutcome = "error"
	// ToolFailed: the call failed in the harness (a lost sandbox,
	// cancellation) and ended the run.
	ToolFailed ToolOutcome = "failed"
	// ToolRejected: a human rejected the call.
	ToolRejected ToolOutcome = "rejected"
	// ToolUnknown: the model called a tool the agent does not have.
	ToolUnknown ToolOutcome = "unknown_tool"
)

// ToolCallInfo describes one tool call to a RunObserver.
type ToolCallInfo struct {
	// Agent is the key of the agent that called it.
	Agent string
	// Tool is the tool's name. For ToolUnknown it is the name the model
	// made up: do not use it as a metric label.
	Tool string
	// CallID is the model's id of the call.
	CallID  string
	Outcome ToolOutcome
	// Duration is how long the tool ran (zero unless it ran).
	Duration time.Duration
}
