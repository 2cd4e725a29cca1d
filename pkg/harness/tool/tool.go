// Package tool defines what a tool the model can call looks like to the
// runner: its model-facing definition and how a call runs. Capabilities
// (pkg/harness/capability) and applications implement Tool; the runner
// routes the model's calls to them.
package tool

import (
	"context"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// Tool is one tool the model may call.
type Tool interface {
	// Definition is the model-facing definition: a function tool (JSON
	// arguments against a schema) or a custom tool (free text, optionally
	// constrained by a grammar).
	Definition() model.Tool
	// Call runs one call. input is the function call's JSON arguments or
	// the custom tool call's raw text. An error is a failure of the
	// harness (the run stops); a failure the model should see and react to
	// (bad arguments, a command that failed, a rejected patch) is a Result
	// with IsError set.
	Call(ctx context.Context, call Context, input string) (Result, error)
}

// Context is what a call runs with.
type Context struct {
	// Session is the run's live sandbox; nil for runs without one.
	Session *compute.Session
	// Agent is the client of the sandbox's daemon (Session.Agent() in a
	// run; tests may set it alone); nil without a sandbox.
	Agent *agentclient.Client
	// RunAs is the sandbox account model-directed work runs as ("" for the
	// daemon's default).
	RunAs string
	// Workdir is the run's working directory inside the workspace
	// (workspace-relative; "" is the workspace root). Relative paths the
	// model gives are resolved against it.
	Workdir string
	// CallID identifies the call in events.
	CallID string
	// Emit, when set, receives progress of the call (command output as it
	// arrives) for streamed runs.
	Emit func(Progress)
	// Log is never nil.
	Log *zap.Logger
}

// Progress is incremental output of a running tool call.
type Progress struct {
	CallID string
	// Output is a chunk of command output.
	Output []byte
}

// Result is what the model sees of a call.
type Result struct {
	// Output is the text returned to the model.
	Output string
	// Images are returned as image inputs (view_image).
	Images []model.Content
	// IsError marks a failure the model should react to.
	IsError bool
}

// Func adapts a function to a Tool.
type Func struct {
	Def model.Tool
	Fn  func(ctx context.Context, call Context, input string) (Result, error)
}

// Definition returns f.Def.
func (f Func) Definition() model.Tool { return f.Def }

// Call runs f.Fn.
func (f Func) Call(ctx context.Context, call Context, input string) (Result, error) {
	return f.Fn(ctx, call, input)
}
