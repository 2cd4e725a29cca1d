package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Runner runs agents. It is safe for concurrent use (by different agents).
type Runner struct {
	// Model is the model of agents that name none.
	Model model.Model
	// ModelName is the model name of agents that name none.
	ModelName string
	// Log receives run events; nil means no logging.
	Log *zap.Logger
	// CleanupTimeout bounds the cleanup of a runner-owned session after the
	// run, which runs even when the run's context was cancelled (default
	// 2 minutes).
	CleanupTimeout time.Duration
}

// Result is a finished run.
type Result struct {
	// FinalOutput is the last assistant text (JSON for structured output).
	FinalOutput string
	// Items is the whole conversation, input included.
	Items []model.Item
	Usage model.Usage
	Turns int
	// SessionState is the sandbox session's state after the run, when the
	// run had a sandbox (persisted first when the runner owned it).
	SessionState *compute.State
}

// Run runs agent on input until it gives a final output, fails, or uses
// up its turns.
func (r *Runner) Run(ctx context.Context, a *Agent, input string, cfg RunConfig) (*Result, error) {
	return r.run(ctx, a, []model.Item{model.UserMessage(input)}, cfg, nil)
}

// Stream is a run in progress whose events are read with Events.
type Stream struct {
	events chan Event
	done   chan struct{}
	cancel context.CancelFunc
	res    *Result
	err    error
}

// RunStreamed starts a run and returns its event stream. Read the events
// with Events (stopping early cancels the run), then Wait for the result.
func (r *Runner) RunStreamed(ctx context.Context, a *Agent, input string, cfg RunConfig) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	s := &Stream{events: make(chan Event, 64), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.done)
		defer close(s.events)
		emit := func(ev Event) {
			select {
			case s.events <- ev:
			case <-ctx.Done():
			}
		}
		s.res, s.err = r.run(ctx, a, []model.Item{model.UserMessage(input)}, cfg, emit)
	}()
	return s
}

// Events yields the run's events in order; breaking out of the loop
// cancels the run.
func (s *Stream) Events() iter.Seq[Event] {
	return func(yield func(Event) bool) {
		for ev := range s.events {
			if !yield(ev) {
				s.cancel()
				for range s.events {
				}
				return
			}
		}
	}
}

// Wait waits for the run to end and returns its result.
func (s *Stream) Wait() (*Result, error) {
	<-s.done
	s.cancel()
	return s.res, s.err
}

// run is the agent loop shared by Run and RunStreamed.
func (r *Runner) run(ctx context.Context, a *Agent, items []model.Item, cfg RunConfig, emit func(Event)) (res *Result, err error) {
	if a == nil {
		return nil, errors.New("run: nil agent")
	}
	if !a.inUse.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("agent %q: %w", a.Name, ErrAgentInUse)
	}
	defer a.inUse.Store(false)
	log := r.Log
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("agent", a.Name))
	if emit == nil {
		emit = func(Event) {}
	}
	m := a.Model
	if m == nil {
		m = r.Model
	}
	if m == nil {
		return nil, fmt.Errorf("agent %q has no model and the runner has none", a.Name)
	}
	maxTurns := cfg.MaxTurns
	if maxTurns <= 0 {
		maxTurns = DefaultMaxTurns
	}

	// Capabilities are cloned per run: per-run state never leaks.
	var caps []capability.Capability
	if cfg.Sandbox != nil {
		for _, c := range a.capabilities() {
			caps = append(caps, c.Clone())
		}
	}
	defer func() {
		for _, c := range caps {
			if cl, ok := c.(capability.Closer); ok {
				if cerr := cl.Close(); cerr != nil {
					log.Warn("closing capability", zap.String("capability", c.Name()), zap.Error(cerr))
				}
			}
		}
	}()

	res = &Result{}
	rc := &RunContext{Agent: a}
	var sess *compute.Session
	if cfg.Sandbox != nil {
		var owned bool
		sess, owned, err = r.session(ctx, a, cfg.Sandbox, caps)
		if err != nil {
			return nil, err
		}
		rc.Manifest = sess.Manifest()
		rc.Workdir = cfg.Sandbox.Workdir
		if cfg.Sandbox.OnSession != nil {
			if err := cfg.Sandbox.OnSession(ctx, sess); err != nil {
				if owned {
					_, cerr := r.cleanup(ctx, sess, cfg.Sandbox)
					err = errors.Join(err, cerr)
				}
				return nil, fmt.Errorf("sandbox session hook: %w", err)
			}
		}
		if owned {
			defer func() {
				st, cerr := r.cleanup(ctx, sess, cfg.Sandbox)
				res.SessionState = st
				if cerr != nil {
					err = errors.Join(err, fmt.Errorf("sandbox cleanup: %w", cerr))
				}
			}()
		} else {
			defer func() {
				if st, serr := sess.State(); serr == nil {
					res.SessionState = st
				}
			}()
		}
	}

	env := capability.Env{HasSession: sess != nil, Model: r.modelName(a)}
	tools := slices.Clone(a.Tools)
	for _, c := range caps {
		tools = append(tools, c.Tools(env)...)
	}
	byName := map[string]tool.Tool{}
	defs := make([]model.Tool, 0, len(tools))
	for _, t := range tools {
		d := t.Definition()
		if _, dup := byName[d.Name]; dup {
			return res, fmt.Errorf("agent %q: two tools are named %q", a.Name, d.Name)
		}
		byName[d.Name] = t
		defs = append(defs, d)
	}
	if err := checkRequirements(caps); err != nil {
		return res, fmt.Errorf("agent %q: %w", a.Name, err)
	}
	instructions, err := buildInstructions(ctx, rc, caps, env)
	if err != nil {
		return res, err
	}
	info := capability.RunInfo{Session: sess, Model: m, ModelName: r.modelName(a), RunAs: a.RunAs, Log: log}
	if sess != nil {
		info.Agent = sess.Agent()
	}
	if cfg.Sandbox != nil {
		info.Workdir = cfg.Sandbox.Workdir
	}
	for _, c := range caps {
		if st, ok := c.(capability.RunStarter); ok {
			info.Items = items
			extra, err := st.OnRunStart(ctx, info)
			if err != nil {
				return res, fmt.Errorf("capability %s: %w", c.Name(), err)
			}
			if extra = strings.TrimSpace(extra); extra != "" {
				instructions += "\n\n" + extra
			}
		}
	}
	res.Items = slices.Clone(items)
	for turn := 1; turn <= maxTurns; turn++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.Turns = turn
		if a.Hooks.OnTurn != nil {
			a.Hooks.OnTurn(ctx, rc, turn)
		}
		emit(Event{Kind: EventTurnStarted, Agent: a.Name, Turn: turn})
		input := res.Items
		for _, c := range caps {
			if f, ok := c.(capability.InputFilter); ok {
				input = f.FilterInput(input)
			}
		}
		req := &model.Request{Model: r.modelName(a), Instructions: instructions, Input: input, Tools: defs,
			Output: a.Output, Reasoning: a.Reasoning, Settings: a.Settings}
		for _, c := range caps {
			if adj, ok := c.(capability.RequestAdjuster); ok {
				adj.AdjustRequest(req)
			}
		}
		resp, err := r.call(ctx, m, req, a, emit)
		if err != nil {
			return res, fmt.Errorf("turn %d: %w", turn, err)
		}
		res.Usage.Add(resp.Usage)
		res.Items = append(res.Items, resp.Output...)
		calls := resp.ToolCalls()
		if len(calls) == 0 {
			res.FinalOutput = resp.Text()
			if a.Output != nil && !json.Valid([]byte(res.FinalOutput)) {
				return res, fmt.Errorf("turn %d: the structured output is not valid JSON", turn)
			}
			for _, c := range caps {
				if en, ok := c.(capability.RunEnder); ok {
					info.Items, info.FinalOutput = res.Items, res.FinalOutput
					if err := en.OnRunEnd(ctx, info); err != nil {
						return res, fmt.Errorf("capability %s at the end of the run: %w", c.Name(), err)
					}
				}
			}
			emit(Event{Kind: EventFinalOutput, Agent: a.Name, Text: res.FinalOutput})
			return res, nil
		}
		for _, c := range calls {
			out, err := r.callTool(ctx, rc, byName, c, sess, cfg, a, emit, log)
			if err != nil {
				return res, fmt.Errorf("turn %d: tool %s: %w", turn, c.Name, err)
			}
			res.Items = append(res.Items, out)
		}
	}
	return res, fmt.Errorf("agent %q: %w (%d)", a.Name, ErrMaxTurns, maxTurns)
}

// checkRequirements fails when a capability requires one that is absent.
func checkRequirements(caps []capability.Capability) error {
	have := map[string]bool{}
	for _, c := range caps {
		have[c.Name()] = true
	}
	for _, c := range caps {
		if rq, ok := c.(capability.Requirer); ok {
			for _, name := range rq.Requires() {
				if !have[name] {
					return fmt.Errorf("capability %s requires capability %s", c.Name(), name)
				}
			}
		}
	}
	return nil
}

func (r *Runner) modelName(a *Agent) string {
	if a.ModelName != "" {
		return a.ModelName
	}
	return r.ModelName
}

// call runs one model call, forwarding text deltas.
func (r *Runner) call(ctx context.Context, m model.Model, req *model.Request, a *Agent, emit func(Event)) (*model.Response, error) {
	for ev, err := range m.Stream(ctx, req) {
		if err != nil {
			return nil, err
		}
		switch ev.Kind {
		case model.EventTextDelta:
			emit(Event{Kind: EventTextDelta, Agent: a.Name, Text: ev.Delta})
		case model.EventReset:
			emit(Event{Kind: EventModelReset, Agent: a.Name})
		case model.EventCompleted:
			return ev.Response, nil
		}
	}
	return nil, errors.New("the model stream ended without a response")
}

// callTool runs one tool call and returns its output item. Unknown tools
// and tool-level failures become outputs the model sees; only harness
// failures (a lost sandbox, cancellation) end the run.
func (r *Runner) callTool(ctx context.Context, rc *RunContext, byName map[string]tool.Tool, c model.Item, sess *compute.Session,
	cfg RunConfig, a *Agent, emit func(Event), log *zap.Logger) (model.Item, error) {
	call := ToolCall{ID: c.CallID, Name: c.Name, Kind: model.ToolFunction, Input: c.Arguments}
	if c.Kind == model.ItemCustomToolCall {
		call.Kind, call.Input = model.ToolCustom, c.Input
	}
	emit(Event{Kind: EventToolCall, Agent: a.Name, Call: &call})
	if a.Hooks.OnToolCall != nil {
		a.Hooks.OnToolCall(ctx, rc, call)
	}
	var result tool.Result
	t, ok := byName[c.Name]
	if !ok {
		result = tool.Result{Output: fmt.Sprintf("There is no tool named %q.", c.Name), IsError: true}
	} else {
		tc := tool.Context{Session: sess, RunAs: a.RunAs, CallID: c.CallID, Log: log.With(zap.String("tool", c.Name)),
			Emit: func(p tool.Progress) { emit(Event{Kind: EventToolOutput, Agent: a.Name, Call: &call, Output: p.Output}) }}
		if sess != nil {
			tc.Agent = sess.Agent()
		}
		if cfg.Sandbox != nil {
			tc.Workdir = cfg.Sandbox.Workdir
		}
		var err error
		result, err = t.Call(ctx, tc, call.Input)
		if err != nil {
			return model.Item{}, err
		}
	}
	if a.Hooks.OnToolResult != nil {
		a.Hooks.OnToolResult(ctx, rc, call, result)
	}
	emit(Event{Kind: EventToolResult, Agent: a.Name, Call: &call, Result: toolOut(result)})
	out := model.Item{Kind: model.ItemFunctionCallOutput, CallID: c.CallID, Output: result.Output}
	if c.Kind == model.ItemCustomToolCall {
		out.Kind = model.ItemCustomToolCallOutput
	}
	if len(result.Images) > 0 {
		out.Content = append([]model.Content{model.TextContent(result.Output)}, result.Images...)
	}
	return out, nil
}

// session resolves the run's sandbox session (see SandboxConfig) and
// reports whether the runner owns it.
func (r *Runner) session(ctx context.Context, a *Agent, sc *SandboxConfig, caps []capability.Capability) (*compute.Session, bool, error) {
	if sc.Session != nil {
		return sc.Session, false, nil
	}
	if sc.Client == nil {
		return nil, false, ErrNoSandboxClient
	}
	var (
		sess *compute.Session
		err  error
	)
	if sc.SessionState != nil {
		var opts []compute.ResumeOption
		if sc.TrustedManifest != nil {
			opts = append(opts, compute.WithTrustedManifest(sc.TrustedManifest))
		}
		if sess, err = sc.Client.Resume(ctx, sc.SessionState, opts...); err != nil {
			return nil, false, err
		}
	} else {
		m := sc.Manifest
		if m == nil {
			m = a.DefaultManifest
		}
		if m == nil {
			m = &manifest.Manifest{}
		}
		for _, c := range caps {
			if m, err = c.ProcessManifest(m); err != nil {
				return nil, false, fmt.Errorf("capability %s: %w", c.Name(), err)
			}
		}
		m = withRunAs(m, a.RunAs)
		sess, err = sc.Client.Create(ctx, compute.CreateOptions{Manifest: m, SnapshotID: sc.SnapshotID, ProviderOptions: sc.ProviderOptions})
		if err != nil {
			return nil, false, err
		}
	}
	if err := sess.Start(ctx); err != nil {
		cctx, cancel := r.cleanupContext(ctx)
		defer cancel()
		return nil, false, errors.Join(err, sc.Client.Delete(cctx, sess))
	}
	return sess, true, nil
}

// withRunAs declares the agent's run_as account in the manifest when it is
// not declared yet (and is not root).
func withRunAs(m *manifest.Manifest, runAs string) *manifest.Manifest {
	if runAs == "" || runAs == "root" {
		return m
	}
	for _, u := range m.Users {
		if u.Name == runAs {
			return m
		}
	}
	out := m.Clone()
	out.Users = append(out.Users, manifest.User{Name: runAs})
	if out.RunAs == "" {
		out.RunAs = runAs
	}
	return out
}

func (r *Runner) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.CleanupTimeout
	if d <= 0 {
		d = 2 * time.Minute
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// cleanup ends a runner-owned session: persist it, then either release it
// (KeepSession) or close and delete it. It runs even when ctx is done.
func (r *Runner) cleanup(ctx context.Context, sess *compute.Session, sc *SandboxConfig) (*compute.State, error) {
	cctx, cancel := r.cleanupContext(ctx)
	defer cancel()
	if sc.KeepSession {
		err := sess.Stop(cctx)
		st, serr := sess.State()
		return st, errors.Join(err, serr, sess.Release())
	}
	err := sess.Close(cctx)
	st, serr := sess.State()
	return st, errors.Join(err, serr, sc.Client.Delete(cctx, sess))
}
