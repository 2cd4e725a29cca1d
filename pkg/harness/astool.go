package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// AsToolOptions configure an agent used as a tool by another agent.
type AsToolOptions struct {
	// Name and Description of the tool; Name defaults to the agent's name
	// made tool-safe, Description to its HandoffDescription.
	Name, Description string
	// Runner runs the nested run (its model is the default of the nested
	// agent); required.
	Runner *Runner
	// MaxTurns bounds the nested run (0: DefaultMaxTurns).
	MaxTurns int
	// ShareSession runs the nested agent in the calling agent's live
	// session (caller-owned from the nested run's point of view: never
	// stopped or deleted by it). RunAs then chooses the account it works
	// as there, e.g. a read-only explorer beside a writing coordinator.
	ShareSession bool
	RunAs        string
	// Sandbox, when ShareSession is false, gives the nested run a sandbox
	// of its own (for example a fresh session from a client); nil runs it
	// without one.
	Sandbox *SandboxConfig
}

// AsTool returns a tool that runs a as a nested run on the model's input
// and returns its final output. The nested run has its own turns and, unless
// ShareSession, its own sandbox. Tool calls needing approval inside it make
// the tool fail (approvals are decided in the top-level run only).
func (a *Agent) AsTool(opts AsToolOptions) tool.Tool {
	name := opts.Name
	if name == "" {
		name = toolName(a.Name)
	}
	desc := opts.Description
	if desc == "" {
		desc = a.HandoffDescription
	}
	if desc == "" {
		desc = "Ask the " + a.Name + " agent to do a task and return its answer."
	}
	def := model.FunctionTool(name, desc, json.RawMessage(`{"type":"object","properties":{"input":{"type":"string","description":"The task or question for the agent."}},"required":["input"],"additionalProperties":false}`), true)
	return tool.Func{Def: def, Fn: func(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
		var args struct {
			Input string `json:"input"`
		}
		if err := json.Unmarshal([]byte(input), &args); err != nil || args.Input == "" {
			return tool.Result{Output: `Call this tool with {"input": "<the task>"}.`, IsError: true}, nil
		}
		if opts.Runner == nil {
			return tool.Result{}, fmt.Errorf("agent tool %s: no runner configured", name)
		}
		cfg := RunConfig{MaxTurns: opts.MaxTurns}
		switch {
		case opts.ShareSession:
			if call.Session == nil {
				return tool.Result{}, fmt.Errorf("agent tool %s shares the caller's session, but the caller has none", name)
			}
			cfg.Sandbox = &SandboxConfig{Session: call.Session, Workdir: call.Workdir, RunAs: opts.RunAs}
		case opts.Sandbox != nil:
			sc := *opts.Sandbox
			cfg.Sandbox = &sc
		}
		res, err := opts.Runner.Run(ctx, a, args.Input, cfg)
		switch {
		case err == nil && len(res.Interruptions) > 0:
			return tool.Result{Output: fmt.Sprintf("The %s agent stopped because a tool call needs approval, which agent tools cannot ask for.", a.Name), IsError: true}, nil
		case errors.Is(err, ErrMaxTurns):
			return tool.Result{Output: fmt.Sprintf("The %s agent did not finish within its turn limit.", a.Name), IsError: true}, nil
		case err != nil:
			return tool.Result{}, fmt.Errorf("agent tool %s: %w", name, err)
		}
		return tool.Result{Output: res.FinalOutput}, nil
	}}
}
