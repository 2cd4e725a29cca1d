// Package harness is the trusted control plane: agents, the runner that
// drives a model through turns of tool calls, and the sandbox session each
// run works in. Model calls go through pkg/harness/model; sandbox work goes
// through pkg/compute, so nothing the model directs runs on the harness
// host.
package harness

import (
	"context"
	"sync/atomic"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Agent is a model with instructions, tools and, for sandbox agents, the
// workspace it works in and the capabilities it has there. An Agent value
// is configuration: a run clones its capabilities, and one Agent value
// cannot be used by two runs at once.
type Agent struct {
	// Name identifies the agent in events and errors.
	Name string
	// Instructions are the agent's own instructions; InstructionsFunc, when
	// set, computes them per run instead.
	Instructions     string
	InstructionsFunc func(ctx context.Context, rc *RunContext) (string, error)
	// Model overrides the runner's model for this agent.
	Model model.Model
	// ModelName is the model's name ("gpt-5.1", ...); "" means the
	// runner's.
	ModelName string
	// Settings and Reasoning are passed to every model call.
	Settings  model.Settings
	Reasoning *model.Reasoning
	// Tools are the agent's own tools, besides its capabilities' tools.
	Tools []tool.Tool
	// Output, when set, asks for structured output matching the schema:
	// the final output must be JSON that parses.
	Output *model.OutputSchema
	// Hooks observe the run.
	Hooks Hooks
	// Approvals say which tool calls need a human's approval, by tool name.
	// A run that reaches such a call stops with a RunState (see
	// Result.Interruptions) and continues with Runner.Resume.
	Approvals map[string]ApprovalPolicy
	// Handoffs are the agents this one may hand the conversation to: each
	// becomes a transfer_to_<name> tool, and the next turn is the target's.
	Handoffs []*Agent
	// HandoffDescription tells other agents when to hand off to this one.
	HandoffDescription string
	// NoSandbox runs the agent without a sandbox session even when the run
	// has one (a triage or planning agent).
	NoSandbox bool

	// DefaultManifest is the workspace of a fresh session when the run
	// config names none.
	DefaultManifest *manifest.Manifest
	// BaseInstructions, when non-nil, replace the built-in base prompt of
	// sandbox agents.
	BaseInstructions *string
	// Capabilities replace the defaults (Filesystem, Shell, Compaction)
	// when non-nil; an empty non-nil slice means none. Capabilities apply
	// to agents that run with a sandbox session.
	Capabilities []capability.Capability
	// RunAs is the sandbox account model-directed work runs as.
	RunAs string

	inUse atomic.Bool
}

// Hooks observe a run. Every field is optional.
type Hooks struct {
	// OnTurn is called before each model call (turn counts from 1).
	OnTurn func(ctx context.Context, rc *RunContext, turn int)
	// OnToolCall and OnToolResult surround every tool call.
	OnToolCall   func(ctx context.Context, rc *RunContext, call ToolCall)
	OnToolResult func(ctx context.Context, rc *RunContext, call ToolCall, res tool.Result)
}

// capabilities returns the agent's capability templates.
func (a *Agent) capabilities() []capability.Capability {
	if a.Capabilities != nil {
		return a.Capabilities
	}
	return DefaultCapabilities()
}
