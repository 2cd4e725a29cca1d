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

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tracing"
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
	// TracerProvider receives the spans of runs, turns, model calls, tool
	// calls and handoffs (see pkg/harness/tracing); nil means the global
	// OpenTelemetry provider, a no-op unless the application set one.
	TracerProvider trace.TracerProvider
}

// Result is a finished or interrupted run.
type Result struct {
	// FinalOutput is the last assistant text (JSON for structured output).
	FinalOutput string
	// Agent is the key of the agent that gave the final output (or whose
	// turn it is, when interrupted).
	Agent string
	// Items is the whole conversation, input included.
	Items []model.Item
	Usage model.Usage
	Turns int
	// Interruptions are the tool calls waiting for approval; when there are
	// any, the run stopped and State resumes it (Runner.Resume).
	Interruptions []*PendingCall
	State         *RunState
	// SessionState is the state of the final agent's sandbox session, when
	// it had one (persisted first when the runner owned it).
	SessionState *compute.State
}

// Run runs agent on input until it gives a final output, fails, stops for
// approvals, or uses up its turns.
func (r *Runner) Run(ctx context.Context, a *Agent, input string, cfg RunConfig) (*Result, error) {
	return r.run(ctx, a, &RunState{Version: RunStateVersion, Items: []model.Item{model.UserMessage(input)}}, cfg, nil)
}

// Resume continues a run from its state: the decisions recorded with
// RunState.Approve and Reject are applied, the sandbox sessions are
// reattached (or rebuilt from their snapshots), and the run goes on. start
// must be the agent the run was started with (the state names agents by
// their keys in its graph, see AgentKeys).
func (r *Runner) Resume(ctx context.Context, start *Agent, st *RunState, cfg RunConfig) (*Result, error) {
	if st == nil {
		return nil, errors.New("resume: nil run state")
	}
	return r.run(ctx, start, st, cfg, nil)
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
	return r.stream(ctx, a, &RunState{Version: RunStateVersion, Items: []model.Item{model.UserMessage(input)}}, cfg)
}

// ResumeStreamed is Resume with an event stream.
func (r *Runner) ResumeStreamed(ctx context.Context, start *Agent, st *RunState, cfg RunConfig) *Stream {
	return r.stream(ctx, start, st, cfg)
}

func (r *Runner) stream(ctx context.Context, a *Agent, st *RunState, cfg RunConfig) *Stream {
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
		if st == nil {
			s.err = errors.New("resume: nil run state")
			return
		}
		s.res, s.err = r.run(ctx, a, st, cfg, emit)
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

// AgentKeys returns the stable keys of the agents reachable from start
// through handoffs, in a deterministic order: an agent's name, with "#2",
// "#3", ... for later agents of the same name.
func AgentKeys(start *Agent) map[*Agent]string {
	keys := map[*Agent]string{}
	seen := map[string]int{}
	var visit func(a *Agent)
	visit = func(a *Agent) {
		if a == nil {
			return
		}
		if _, ok := keys[a]; ok {
			return
		}
		seen[a.Name]++
		k := a.Name
		if n := seen[a.Name]; n > 1 {
			k = fmt.Sprintf("%s#%d", a.Name, n)
		}
		keys[a] = k
		for _, h := range a.Handoffs {
			visit(h)
		}
	}
	visit(start)
	return keys
}

// runLoop is the state of one run.
type runLoop struct {
	r      *Runner
	tr     *tracing.Tracer
	cfg    RunConfig
	emit   func(Event)
	log    *zap.Logger
	st     *RunState
	keys   map[*Agent]string
	byKey  map[string]*Agent
	slots  map[string]*agentSlot
	result *Result
	final  bool // the run gave its final output
}

// agentSlot is what one agent of the run holds: its cloned capabilities,
// its session, its tools.
type agentSlot struct {
	a       *Agent
	key     string
	caps    []capability.Capability
	sess    *compute.Session
	owned   bool
	tools   map[string]tool.Tool
	defs    []model.Tool
	handoff map[string]*Agent // tool name -> target
	instr   string
	info    capability.RunInfo
	rc      *RunContext
	ready   bool
}

// run is the agent loop behind Run, Resume and their streamed forms.
func (r *Runner) run(ctx context.Context, start *Agent, st *RunState, cfg RunConfig, emit func(Event)) (res *Result, err error) {
	if start == nil {
		return nil, errors.New("run: nil agent")
	}
	tr := tracing.New(r.TracerProvider)
	ctx, span := tr.StartRun(ctx, start.Name, tracing.WithMaxTurns(cfg.MaxTurns), tracing.WithResumed(st.Turn > 0 || len(st.Pending) > 0),
		tracing.WithStreamed(emit != nil), tracing.WithProvider(r.providerName(start)), tracing.WithConversation(cfg.ConversationID))
	l := &runLoop{r: r, tr: tr, cfg: cfg, emit: emit, st: st, keys: AgentKeys(start), byKey: map[string]*Agent{}, slots: map[string]*agentSlot{}}
	defer func() {
		rr := tracing.RunResult{Turns: l.st.Turn, FinalAgent: l.st.Agent, Usage: l.st.Usage}
		if res != nil {
			rr.PendingApprovals = len(res.Interruptions)
		}
		tracing.EndRun(span, rr, err)
	}()
	if obs := cfg.Observer; obs != nil {
		info := RunInfo{Agent: start.Name, Resumed: st.Turn > 0 || len(st.Pending) > 0, Streamed: emit != nil}
		began := time.Now()
		obs.RunStarted(ctx, info)
		defer func() { obs.RunEnded(ctx, info, outcomeOf(res, err), time.Since(began)) }()
	}
	if l.emit == nil {
		l.emit = func(Event) {}
	}
	l.log = r.Log
	if l.log == nil {
		l.log = zap.NewNop()
	}
	for a, k := range l.keys {
		l.byKey[k] = a
	}
	// One agent value runs in one run at a time.
	var locked []*Agent
	defer func() {
		for _, a := range locked {
			a.inUse.Store(false)
		}
	}()
	for a := range l.keys {
		if !a.inUse.CompareAndSwap(false, true) {
			return nil, fmt.Errorf("agent %q: %w", a.Name, ErrAgentInUse)
		}
		locked = append(locked, a)
	}
	if st.Agent == "" {
		st.Agent = l.keys[start]
	}
	if _, ok := l.byKey[st.Agent]; !ok {
		return nil, fmt.Errorf("run state names agent %q, which is not reachable from agent %q", st.Agent, start.Name)
	}
	res = &Result{}
	l.result = res
	interrupted := false
	defer func() {
		cerr := l.finish(ctx, interrupted)
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("sandbox cleanup: %w", cerr))
		}
		if interrupted && err == nil {
			res.State = l.st
		}
	}()
	interrupted, err = l.loop(ctx)
	return res, err
}

// loop runs turns until a final output, an interruption or an error.
func (l *runLoop) loop(ctx context.Context) (interrupted bool, err error) {
	maxTurns := l.cfg.MaxTurns
	if maxTurns <= 0 {
		maxTurns = DefaultMaxTurns
	}
	res := l.result
	defer func() {
		res.Items, res.Usage, res.Turns, res.Agent = l.st.Items, l.st.Usage, l.st.Turn, l.st.Agent
	}()
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		slot, err := l.slot(ctx, l.byKey[l.st.Agent])
		if err != nil {
			return false, err
		}
		// Decisions first: a resumed run applies them before the next turn.
		if len(l.st.Pending) > 0 {
			if und := l.st.Undecided(); len(und) > 0 {
				res.Interruptions = und
				return true, nil
			}
			if err := l.applyDecisions(ctx); err != nil {
				return false, err
			}
			continue
		}
		if l.st.Turn >= maxTurns {
			return false, fmt.Errorf("agent %q: %w (%d)", slot.a.Name, ErrMaxTurns, maxTurns)
		}
		l.st.Turn++
		turn := l.st.Turn
		a := slot.a
		if a.Hooks.OnTurn != nil {
			a.Hooks.OnTurn(ctx, slot.rc, turn)
		}
		l.emit(Event{Kind: EventTurnStarted, Agent: slot.key, Turn: turn})
		tctx, tspan := l.tr.StartTurn(ctx, turn, slot.key, l.r.modelName(a))
		interrupted, err := l.turn(tctx, slot, turn)
		tracing.EndTurn(tspan, err)
		if err != nil || interrupted {
			return interrupted, err
		}
		if l.final {
			return false, nil
		}
	}
}

// turn runs one model call and its tool calls. It reports whether the run
// stopped for approvals; l.final is set when the run gave its final output.
func (l *runLoop) turn(ctx context.Context, slot *agentSlot, turn int) (interrupted bool, err error) {
	a, res := slot.a, l.result
	mctx, mspan := l.tr.StartModelCall(ctx, l.r.modelName(a), tracing.WithProvider(l.r.providerName(a)), tracing.WithConversation(l.cfg.ConversationID))
	began := time.Now()
	resp, err := l.callModel(mctx, slot)
	tracing.EndModelCall(mspan, resp, err)
	if obs := l.cfg.Observer; obs != nil {
		info := ModelCallInfo{Agent: slot.key, Model: l.r.modelName(a), Duration: time.Since(began), Err: err}
		if resp != nil {
			info.ResponseModel, info.Usage = resp.Model, resp.Usage
		}
		obs.ModelCalled(ctx, info)
	}
	if err != nil {
		return false, fmt.Errorf("turn %d: %w", turn, err)
	}
	l.st.Usage.Add(resp.Usage)
	l.st.Items = append(l.st.Items, resp.Output...)
	calls := resp.ToolCalls()
	if len(calls) == 0 {
		res.FinalOutput = resp.Text()
		if a.Output != nil && !json.Valid([]byte(res.FinalOutput)) {
			return false, fmt.Errorf("turn %d: the structured output is not valid JSON", turn)
		}
		for _, c := range slot.caps {
			if en, ok := c.(capability.RunEnder); ok {
				info := slot.info
				info.Items, info.FinalOutput = l.st.Items, res.FinalOutput
				if err := en.OnRunEnd(ctx, info); err != nil {
					return false, fmt.Errorf("capability %s at the end of the run: %w", c.Name(), err)
				}
			}
		}
		l.emit(Event{Kind: EventFinalOutput, Agent: slot.key, Text: res.FinalOutput})
		l.final = true
		return false, nil
	}
	var next *Agent
	for _, c := range calls {
		call := toolCallOf(c)
		if target, ok := slot.handoff[c.Name]; ok {
			l.emit(Event{Kind: EventToolCall, Agent: slot.key, Call: &call})
			if next == nil {
				next = target
			}
			out := fmt.Sprintf(`{"assistant": %q}`, target.Name)
			l.emit(Event{Kind: EventToolResult, Agent: slot.key, Call: &call, Result: &ToolOut{Output: out}})
			l.st.Items = append(l.st.Items, outputItem(c, tool.Result{Output: out}))
			continue
		}
		need, err := l.needsApproval(ctx, slot, call)
		if err != nil {
			return false, fmt.Errorf("turn %d: approval policy of %s: %w", turn, c.Name, err)
		}
		if need {
			l.st.Pending = append(l.st.Pending, &PendingCall{Call: call, Agent: slot.key})
			tracing.RecordApproval(ctx, call.Name, call.ID, tracing.ApprovalPending)
			continue
		}
		out, err := l.callTool(ctx, slot, call)
		if err != nil {
			return false, fmt.Errorf("turn %d: tool %s: %w", turn, c.Name, err)
		}
		l.st.Items = append(l.st.Items, out)
	}
	if len(l.st.Pending) > 0 {
		// Handoffs wait until the decisions are applied.
		if next != nil {
			l.st.Agent = l.keys[next]
		}
		res.Interruptions = l.st.Undecided()
		return true, nil
	}
	if next != nil {
		l.log.Info("handoff", zap.String("from", slot.key), zap.String("to", l.keys[next]))
		_, hspan := l.tr.StartHandoff(ctx, slot.key, l.keys[next])
		tracing.EndHandoff(hspan, nil)
		l.st.Agent = l.keys[next]
	}
	return false, nil
}

// applyDecisions runs the approved pending calls and answers the rejected
// ones, in the original order.
func (l *runLoop) applyDecisions(ctx context.Context) error {
	pending := l.st.Pending
	for _, p := range pending {
		slot, err := l.slot(ctx, l.byKey[p.Agent])
		if err != nil {
			return err
		}
		c := p.Call
		decision := tracing.ApprovalApproved
		if !p.Decision.Approved {
			decision = tracing.ApprovalRejected
		}
		tracing.RecordApproval(ctx, c.Name, c.ID, decision)
		if !p.Decision.Approved {
			msg := p.Decision.Message
			if msg == "" {
				msg = DefaultRejection
			}
			res := tool.Result{Output: msg, IsError: true}
			if obs := l.cfg.Observer; obs != nil {
				obs.ToolCalled(ctx, ToolCallInfo{Agent: slot.key, Tool: c.Name, CallID: c.ID, Outcome: ToolRejected})
			}
			l.emit(Event{Kind: EventToolResult, Agent: slot.key, Call: &c, Result: toolOut(res)})
			l.st.Items = append(l.st.Items, outputItem(modelCall(c), res))
			continue
		}
		out, err := l.callTool(ctx, slot, c)
		if err != nil {
			return fmt.Errorf("approved tool %s: %w", c.Name, err)
		}
		l.st.Items = append(l.st.Items, out)
	}
	l.st.Pending = nil
	return nil
}

// needsApproval applies the agent's policy for the call's tool.
func (l *runLoop) needsApproval(ctx context.Context, slot *agentSlot, call ToolCall) (bool, error) {
	policy := slot.a.Approvals[call.Name]
	if policy == nil {
		return false, nil
	}
	return policy(ctx, call)
}

// callModel runs one model call for the slot's agent.
func (l *runLoop) callModel(ctx context.Context, slot *agentSlot) (*model.Response, error) {
	a := slot.a
	m := a.Model
	if m == nil {
		m = l.r.Model
	}
	if m == nil {
		return nil, fmt.Errorf("agent %q has no model and the runner has none", a.Name)
	}
	input := l.st.Items
	for _, c := range slot.caps {
		if f, ok := c.(capability.InputFilter); ok {
			input = f.FilterInput(input)
		}
	}
	req := &model.Request{Model: l.r.modelName(a), Instructions: slot.instr, Input: input, Tools: slot.defs,
		Output: a.Output, Reasoning: a.Reasoning, Settings: a.Settings}
	for _, c := range slot.caps {
		if adj, ok := c.(capability.RequestAdjuster); ok {
			adj.AdjustRequest(req)
		}
	}
	for ev, err := range m.Stream(ctx, req) {
		if err != nil {
			return nil, err
		}
		switch ev.Kind {
		case model.EventTextDelta:
			l.emit(Event{Kind: EventTextDelta, Agent: slot.key, Text: ev.Delta})
		case model.EventReset:
			l.emit(Event{Kind: EventModelReset, Agent: slot.key})
		case model.EventCompleted:
			return ev.Response, nil
		}
	}
	return nil, errors.New("the model stream ended without a response")
}

// toolCallOf describes a model's tool call item.
func toolCallOf(c model.Item) ToolCall {
	call := ToolCall{ID: c.CallID, Name: c.Name, Kind: model.ToolFunction, Input: c.Arguments}
	if c.Kind == model.ItemCustomToolCall {
		call.Kind, call.Input = model.ToolCustom, c.Input
	}
	return call
}

// modelCall is the inverse of toolCallOf, enough to build its output item.
func modelCall(c ToolCall) model.Item {
	if c.Kind == model.ToolCustom {
		return model.Item{Kind: model.ItemCustomToolCall, CallID: c.ID, Name: c.Name, Input: c.Input}
	}
	return model.Item{Kind: model.ItemFunctionCall, CallID: c.ID, Name: c.Name, Arguments: c.Input}
}

// outputItem is the conversation item answering call c with res.
func outputItem(c model.Item, res tool.Result) model.Item {
	out := model.Item{Kind: model.ItemFunctionCallOutput, CallID: c.CallID, Output: res.Output}
	if c.Kind == model.ItemCustomToolCall {
		out.Kind = model.ItemCustomToolCallOutput
	}
	if len(res.Images) > 0 {
		out.Content = append([]model.Content{model.TextContent(res.Output)}, res.Images...)
	}
	return out
}

// callTool runs one tool call and returns its output item. Unknown tools
// and tool-level failures become outputs the model sees; only harness
// failures (a lost sandbox, cancellation) end the run.
func (l *runLoop) callTool(ctx context.Context, slot *agentSlot, call ToolCall) (model.Item, error) {
	a := slot.a
	l.emit(Event{Kind: EventToolCall, Agent: slot.key, Call: &call})
	if a.Hooks.OnToolCall != nil {
		a.Hooks.OnToolCall(ctx, slot.rc, call)
	}
	var result tool.Result
	t, ok := slot.tools[call.Name]
	if !ok {
		result = tool.Result{Output: fmt.Sprintf("There is no tool named %q.", call.Name), IsError: true}
		if obs := l.cfg.Observer; obs != nil {
			obs.ToolCalled(ctx, ToolCallInfo{Agent: slot.key, Tool: call.Name, CallID: call.ID, Outcome: ToolUnknown})
		}
	} else {
		tc := tool.Context{Session: slot.sess, RunAs: l.runAs(a), CallID: call.ID, Log: l.log.With(zap.String("tool", call.Name)),
			Emit: func(p tool.Progress) {
				l.emit(Event{Kind: EventToolOutput, Agent: slot.key, Call: &call, Output: p.Output})
			}}
		if slot.sess != nil {
			tc.Agent = slot.sess.Agent()
		}
		if l.cfg.Sandbox != nil {
			tc.Workdir = l.cfg.Sandbox.Workdir
		}
		tctx, tspan := l.tr.StartToolCall(ctx, call.Name, call.ID)
		began := time.Now()
		var err error
		result, err = t.Call(tctx, tc, call.Input)
		tracing.EndToolCall(tspan, result.IsError, err)
		if obs := l.cfg.Observer; obs != nil {
			outcome := ToolOK
			switch {
			case err != nil:
				outcome = ToolFailed
			case result.IsError:
				outcome = ToolError
			}
			obs.ToolCalled(ctx, ToolCallInfo{Agent: slot.key, Tool: call.Name, CallID: call.ID, Outcome: outcome, Duration: time.Since(began)})
		}
		if err != nil {
			return model.Item{}, err
		}
	}
	if a.Hooks.OnToolResult != nil {
		a.Hooks.OnToolResult(ctx, slot.rc, call, result)
	}
	l.emit(Event{Kind: EventToolResult, Agent: slot.key, Call: &call, Result: toolOut(result)})
	return outputItem(modelCall(call), result), nil
}

// slot prepares an agent for its turns: capabilities cloned for this run,
// its sandbox session resolved, tools and instructions built.
func (l *runLoop) slot(ctx context.Context, a *Agent) (*agentSlot, error) {
	key := l.keys[a]
	if s := l.slots[key]; s != nil && s.ready {
		return s, nil
	}
	s := &agentSlot{a: a, key: key, rc: &RunContext{Agent: a}}
	l.slots[key] = s
	sandbox := l.cfg.Sandbox != nil && !a.NoSandbox
	if sandbox {
		for _, c := range a.capabilities() {
			s.caps = append(s.caps, c.Clone())
		}
		if err := checkRequirements(s.caps); err != nil {
			return nil, fmt.Errorf("agent %q: %w", a.Name, err)
		}
		sess, owned, err := l.session(ctx, a, key, s.caps)
		if err != nil {
			return nil, err
		}
		s.sess, s.owned = sess, owned
		s.rc.Manifest = sess.Manifest()
		s.rc.Workdir = l.cfg.Sandbox.Workdir
		if l.cfg.Sandbox.OnSession != nil && owned {
			if err := l.cfg.Sandbox.OnSession(ctx, sess); err != nil {
				return nil, fmt.Errorf("sandbox session hook: %w", err)
			}
		}
	}
	env := capability.Env{HasSession: s.sess != nil, Model: l.r.modelName(a)}
	tools := slices.Clone(a.Tools)
	for _, c := range s.caps {
		tools = append(tools, c.Tools(env)...)
	}
	s.tools = map[string]tool.Tool{}
	for _, t := range tools {
		d := t.Definition()
		if _, dup := s.tools[d.Name]; dup {
			return nil, fmt.Errorf("agent %q: two tools are named %q", a.Name, d.Name)
		}
		s.tools[d.Name] = t
		s.defs = append(s.defs, d)
	}
	s.handoff = map[string]*Agent{}
	for _, h := range a.Handoffs {
		def := handoffTool(h)
		if _, dup := s.tools[def.Name]; dup || s.handoff[def.Name] != nil {
			return nil, fmt.Errorf("agent %q: two tools are named %q", a.Name, def.Name)
		}
		s.handoff[def.Name] = h
		s.defs = append(s.defs, def)
	}
	instr, err := buildInstructions(ctx, s.rc, s.caps, env)
	if err != nil {
		return nil, err
	}
	s.info = capability.RunInfo{Session: s.sess, Model: a.Model, ModelName: l.r.modelName(a), RunAs: l.runAs(a), Log: l.log}
	if s.info.Model == nil {
		s.info.Model = l.r.Model
	}
	if s.sess != nil {
		s.info.Agent = s.sess.Agent()
		s.info.Workdir = l.cfg.Sandbox.Workdir
	}
	for _, c := range s.caps {
		if rs, ok := c.(capability.RunStarter); ok {
			info := s.info
			info.Items = l.st.Items
			extra, err := rs.OnRunStart(ctx, info)
			if err != nil {
				return nil, fmt.Errorf("capability %s: %w", c.Name(), err)
			}
			if extra = strings.TrimSpace(extra); extra != "" {
				instr += "\n\n" + extra
			}
		}
	}
	s.instr = instr
	s.ready = true
	return s, nil
}

// handoffTool is the tool that hands the conversation to target.
func handoffTool(target *Agent) model.Tool {
	desc := "Hand the conversation over to " + target.Name + "."
	if target.HandoffDescription != "" {
		desc += " " + target.HandoffDescription
	}
	return model.FunctionTool("transfer_to_"+toolName(target.Name), desc,
		json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`), true)
}

// toolName turns an agent name into a tool-name-safe string.
func toolName(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// runAs is the account an agent's tools run as in this run.
func (l *runLoop) runAs(a *Agent) string {
	if l.cfg.Sandbox != nil && l.cfg.Sandbox.RunAs != "" {
		return l.cfg.Sandbox.RunAs
	}
	return a.RunAs
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

// providerName is the gen_ai.provider.name of a's model ("" when unknown).
func (r *Runner) providerName(a *Agent) string {
	m := a.Model
	if m == nil {
		m = r.Model
	}
	if m == nil {
		return ""
	}
	return model.ProviderName(m)
}

func (r *Runner) modelName(a *Agent) string {
	if a.ModelName != "" {
		return a.ModelName
	}
	return r.ModelName
}

// session resolves an agent's sandbox session (see SandboxConfig) and
// reports whether the runner owns it: an injected live session, then the
// session recorded for this agent in the run state, then an explicit
// session state (for the run's first agent), then a fresh session.
func (l *runLoop) session(ctx context.Context, a *Agent, key string, caps []capability.Capability) (*compute.Session, bool, error) {
	sc := l.cfg.Sandbox
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
	state := l.st.Sessions[key]
	if state == nil && sc.SessionState != nil && len(l.slots) == 1 {
		state = sc.SessionState
	}
	if state != nil {
		opts := []compute.ResumeOption{compute.WithLimits(sc.Limits)}
		if sc.TrustedManifest != nil {
			opts = append(opts, compute.WithTrustedManifest(sc.TrustedManifest))
		}
		if sess, err = sc.Client.Resume(ctx, state, opts...); err != nil {
			return nil, false, err
		}
	} else {
		m := a.DefaultManifest
		if sc.Manifest != nil && len(l.slots) == 1 {
			m = sc.Manifest
		}
		if m == nil {
			m = &manifest.Manifest{}
		}
		for _, c := range caps {
			if m, err = c.ProcessManifest(m); err != nil {
				return nil, false, fmt.Errorf("capability %s: %w", c.Name(), err)
			}
		}
		m = withRunAs(m, l.runAs(a))
		sess, err = sc.Client.Create(ctx, compute.CreateOptions{Manifest: m, SnapshotID: sc.SnapshotID, ProviderOptions: sc.ProviderOptions, Limits: sc.Limits})
		if err != nil {
			return nil, false, err
		}
	}
	if err := sess.Start(ctx); err != nil {
		cctx, cancel := l.r.cleanupContext(ctx)
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

// finish releases what the run holds: capabilities are closed; runner-owned
// sessions are persisted and released when the run is interrupted (or
// KeepSession is set), and closed and deleted otherwise. It runs even when
// ctx is done, and records the sessions' states.
func (l *runLoop) finish(ctx context.Context, interrupted bool) error {
	cctx, cancel := l.r.cleanupContext(ctx)
	defer cancel()
	var errs []error
	keys := make([]string, 0, len(l.slots))
	for k := range l.slots {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s := l.slots[k]
		for _, c := range s.caps {
			if cl, ok := c.(capability.Closer); ok {
				if err := cl.Close(); err != nil {
					l.log.Warn("closing capability", zap.String("capability", c.Name()), zap.Error(err))
				}
			}
		}
		if s.sess == nil {
			continue
		}
		var st *compute.State
		switch {
		case !s.owned:
			st, _ = s.sess.State()
		case interrupted || l.cfg.Sandbox.KeepSession:
			err := s.sess.Stop(cctx)
			var serr error
			st, serr = s.sess.State()
			errs = append(errs, err, serr, s.sess.Release())
			if st != nil {
				if l.st.Sessions == nil {
					l.st.Sessions = map[string]*compute.State{}
				}
				l.st.Sessions[k] = st
			}
		default:
			err := s.sess.Close(cctx)
			var serr error
			st, serr = s.sess.State()
			errs = append(errs, err, serr, l.cfg.Sandbox.Client.Delete(cctx, s.sess))
			delete(l.st.Sessions, k)
		}
		if k == l.st.Agent || l.result.SessionState == nil {
			l.result.SessionState = st
		}
	}
	return errors.Join(errs...)
}
