package manager

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/compaction"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/shell"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Stored statuses: the wire's RunStatus names, plus checkpointed (shown as
// running), a run the manager stopped at the end of a turn to shut down.
const (
	statusPending      = "RUN_STATUS_PENDING"
	statusRunning      = "RUN_STATUS_RUNNING"
	statusWaiting      = "RUN_STATUS_WAITING_APPROVAL"
	statusSucceeded    = "RUN_STATUS_SUCCEEDED"
	statusFailed       = "RUN_STATUS_FAILED"
	statusCanceled     = "RUN_STATUS_CANCELED"
	statusCheckpointed = "CHECKPOINTED"
)

var activeStatuses = []string{statusPending, statusRunning, statusWaiting, statusCheckpointed}

func terminal(status string) bool {
	return status == statusSucceeded || status == statusFailed || status == statusCanceled
}

// statusOf is the RunStatus of a stored status.
func statusOf(stored string) RunStatus {
	if stored == statusCheckpointed {
		return StatusRunning
	}
	return RunStatus(strings.ToLower(strings.TrimPrefix(stored, "RUN_STATUS_")))
}

// storedStatus is the stored status of a RunStatus ("" for none known).
func storedStatus(s RunStatus) string {
	switch s {
	case StatusPending, StatusRunning, StatusWaitingApproval, StatusSucceeded, StatusFailed, StatusCanceled:
		return "RUN_STATUS_" + strings.ToUpper(string(s))
	}
	return ""
}

// errLost is the error of a run the manager lost in the middle of a turn.
const errLost = "the service stopped while the run was in a turn; the turn was lost (ResumeRun continues from the last saved state, if any)"

// liveRun is an active run in this process.
type liveRun struct {
	m *Manager
	// id and tenant never change (rec does: read it under mu).
	id, tenant string
	// draining makes every further tool call a checkpoint (Shutdown).
	draining atomic.Bool

	mu   sync.Mutex
	rec  *store.Run
	spec *RunSpec
	// state is the run's RunState while it is stopped.
	state *harness.RunState
	// over is set once the run ended (endRun).
	over bool
	// ev is the run's event log and its subscribers (see events).
	ev events
	// driving is set while a goroutine drives the run; cancel stops it.
	driving  bool
	cancel   context.CancelFunc
	canceled bool
	reason   string
	// checkpoint holds the calls held because of draining.
	checkpoint map[string]bool
	ended      chan struct{}
	// box is the caller's sandbox the run claimed (RunSpec.Sandbox; nil
	// for a run with a sandbox of its own), under Manager.mu.
	box *box
}

func (m *Manager) newLiveRun(rec *store.Run, spec *RunSpec, seq uint64) *liveRun {
	lr := &liveRun{m: m, id: rec.ID, tenant: rec.Tenant, rec: rec, spec: spec, checkpoint: map[string]bool{}, ended: make(chan struct{})}
	lr.ev.cond = sync.NewCond(&lr.ev.mu)
	lr.ev.seq = seq
	lr.ev.subs = map[*subscriber]struct{}{}
	return lr
}

// update applies fn to the run's record and saves it.
func (lr *liveRun) update(ctx context.Context, fn func(r *store.Run)) error {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.updateLocked(ctx, fn)
}

func (lr *liveRun) updateLocked(ctx context.Context, fn func(r *store.Run)) error {
	next := *lr.rec
	fn(&next)
	next.Updated = lr.m.now()
	if err := lr.m.cfg.Store.UpdateRun(context.WithoutCancel(ctx), &next); err != nil {
		return fmt.Errorf("save run %s: %w", next.ID, err)
	}
	lr.m.moved(lr.rec.Status, next.Status)
	lr.rec = &next
	return nil
}

// newID returns prefix-<24 hex digits>.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// sandboxID is the sandbox session id of a run: its id with another prefix,
// so a sandbox id leads to its run (and tenant) without an index.
func sandboxID(runID string) string { return "sbx-" + strings.TrimPrefix(runID, "run-") }

// runIDOf is the inverse of sandboxID ("" for a malformed id).
func runIDOf(sandbox string) string {
	rest, ok := strings.CutPrefix(sandbox, "sbx-")
	if !ok || rest == "" {
		return ""
	}
	return "run-" + rest
}

// capabilityNames are the capabilities a spec may name.
var capabilityNames = []string{"filesystem", "shell", "compaction"}

func capabilitiesOf(names []string) ([]capability.Capability, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out := []capability.Capability{}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return nil, fmt.Errorf("capability %q is named twice", n)
		}
		seen[n] = true
		switch n {
		case "filesystem":
			out = append(out, filesystem.New(filesystem.Options{}))
		case "shell":
			out = append(out, shell.New(shell.Options{}))
		case "compaction":
			out = append(out, compaction.New(compaction.Options{}))
		default:
			return nil, fmt.Errorf("unknown capability %q (known: %s)", n, strings.Join(capabilityNames, ", "))
		}
	}
	return out, nil
}

// parseManifest reads a spec's manifest with the rules for untrusted
// documents (no host sources, grants, mounts or secret references; no
// root) and the manager's account policy (see validate.go).
func parseManifest(text string) (*manifest.Manifest, error) {
	if strings.TrimSpace(text) == "" {
		return &manifest.Manifest{}, nil
	}
	m, err := manifest.LoadUntrusted([]byte(text), manifest.FormatAuto, manifest.UntrustedOptions{})
	if err != nil {
		return nil, &FieldError{Field: "manifest", Err: err}
	}
	if err := checkAccounts(m); err != nil {
		return nil, err
	}
	return m, nil
}

// userPolicies are the approval policies a spec asks for.
func userPolicies(p ApprovalPolicy) (map[string]harness.ApprovalPolicy, error) {
	res, err := checkApprovals(p)
	if err != nil {
		return nil, err
	}
	out := map[string]harness.ApprovalPolicy{}
	for _, name := range p.RequireApproval {
		out[name] = harness.AlwaysApprove()
	}
	if len(res) > 0 {
		if _, always := out["exec_command"]; !always {
			out["exec_command"] = harness.CommandsOutside(res...)
		}
	}
	return out, nil
}

func agentName(spec *RunSpec) string {
	if n := spec.Agent.Name; n != "" {
		return n
	}
	return "agent"
}

// buildAgent makes the run's agent, working as runAs (its sandbox's
// account, never the spec's text: see resolveRunAs). Every tool of the
// agent gets a policy: the spec's approval rule first, then, while the
// manager drains, a checkpoint that holds the call so the run stops at the
// end of its turn.
func (m *Manager) buildAgent(lr *liveRun, runAs string) (*harness.Agent, error) {
	spec := lr.spec
	caps, err := capabilitiesOf(spec.Agent.Capabilities)
	if err != nil {
		return nil, err
	}
	user, err := userPolicies(spec.Approvals)
	if err != nil {
		return nil, err
	}
	instr := spec.Agent.Instructions
	if instr == "" {
		instr = m.cfg.DefaultInstructions
	}
	a := &harness.Agent{Name: agentName(spec), Instructions: instr, ModelName: spec.Agent.Model,
		Capabilities: caps, RunAs: runAs, Approvals: map[string]harness.ApprovalPolicy{}}
	modelName := a.ModelName
	if modelName == "" {
		modelName = m.cfg.DefaultModel
	}
	templates := caps
	if templates == nil {
		templates = harness.DefaultCapabilities()
	}
	names := map[string]bool{}
	for name := range user {
		names[name] = true
	}
	for _, c := range templates {
		for _, t := range c.Clone().Tools(capability.Env{HasSession: true, Model: modelName}) {
			names[t.Definition().Name] = true
		}
	}
	for name := range names {
		up := user[name]
		a.Approvals[name] = func(ctx context.Context, call harness.ToolCall) (bool, error) {
			if up != nil {
				need, err := up(ctx, call)
				if err != nil || need {
					return need, err
				}
			}
			if lr.draining.Load() {
				lr.mu.Lock()
				lr.checkpoint[call.ID] = true
				lr.mu.Unlock()
				return true, nil
			}
			return false, nil
		}
	}
	return a, nil
}

// sandboxManifest is the manifest of a run's fresh sandbox, prepared by the
// agent's capabilities the way the runner prepares the sandboxes it makes,
// with the account the spec's agent.run_as may choose (resolveRunAs).
func sandboxManifest(spec *RunSpec) (*manifest.Manifest, error) {
	m, err := parseManifest(spec.Manifest)
	if err != nil {
		return nil, err
	}
	caps, err := capabilitiesOf(spec.Agent.Capabilities)
	if err != nil {
		return nil, err
	}
	if caps == nil {
		caps = harness.DefaultCapabilities()
	}
	for _, c := range caps {
		if m, err = c.ProcessManifest(m); err != nil {
			return nil, fmt.Errorf("capability %s: %w", c.Name(), err)
		}
	}
	return resolveRunAs(m, spec.Agent.RunAs)
}

// acquireSession returns the run's live sandbox session: the one held, the
// one its stored state names (reattached or rebuilt from its snapshot), or
// a fresh one. Sandboxes it makes get the operator's resource caps, and
// their git checkouts are charged to the tenant (MeteredGit). The run holds
// its tenant's sandbox slot already (newRun, resumeStored, recover,
// recoverRetained).
func (m *Manager) acquireSession(ctx context.Context, tenant string, rec *store.Run, spec *RunSpec) (_ *compute.Session, err error) {
	if spec != nil && spec.Sandbox != "" {
		// The caller's sandbox, which the run only uses (callerbox.go).
		return m.claimedSession(ctx, tenant, rec.ID, spec.Sandbox)
	}
	ctx = withFetchAccount(ctx, m.usage.fetchAccount(tenant))
	defer func() { err = quotaCause(ctx, err) }()
	m.mu.Lock()
	if h := m.sessions[rec.ID]; h != nil {
		m.mu.Unlock()
		return h.sess, nil
	}
	m.mu.Unlock()
	var sess *compute.Session
	if len(rec.SessionState) > 0 {
		st, err := m.cfg.Compute.DecodeState(rec.SessionState)
		if err != nil {
			return nil, fmt.Errorf("sandbox state of run %s: %w", rec.ID, err)
		}
		if sess, err = m.cfg.Compute.Resume(ctx, st, compute.WithLimits(m.limits), compute.WithProviderOptions(m.providerOpts)); err != nil {
			return nil, err
		}
	} else {
		if spec == nil {
			return nil, fmt.Errorf("run %s has no sandbox", rec.ID)
		}
		man, err := sandboxManifest(spec)
		if err != nil {
			return nil, err
		}
		sess, err = m.cfg.Compute.Create(ctx, compute.CreateOptions{Manifest: man, SessionID: sandboxID(rec.ID),
			Labels: map[string]string{"bulkhead.run": rec.ID}, ProviderOptions: m.providerOpts, Limits: m.limits})
		if err != nil {
			return nil, err
		}
	}
	if err := sess.Start(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return nil, errors.Join(err, m.cfg.Compute.Delete(cctx, sess))
	}
	st, err := sess.State()
	if err != nil {
		return nil, err
	}
	data, err := st.Encode()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if h := m.sessions[rec.ID]; h != nil {
		// Another caller got there first: keep theirs.
		m.mu.Unlock()
		_ = sess.Release()
		return h.sess, nil
	}
	if m.released {
		// Shutdown has released the sessions already: this one is not
		// held either.
		m.mu.Unlock()
		_ = sess.Release()
		return nil, errShuttingDown
	}
	m.sessions[rec.ID] = &held{sess: sess, tenant: tenant}
	// A retained sandbox of an earlier manager is held now (its timer
	// still runs).
	delete(m.retained, rec.ID)
	m.mu.Unlock()
	err = m.updateStored(ctx, tenant, rec.ID, func(r *store.Run) {
		r.SessionState, r.SandboxID, r.Provider, r.SandboxGone = data, sess.ID(), sess.Provider(), false
	})
	return sess, err
}

// startDriveLocked starts a goroutine driving lr from st (nil: a fresh run
// on its input). lr.mu must be held. Without a model: ErrNoModel.
func (m *Manager) startDriveLocked(lr *liveRun, st *harness.RunState, cause string) error {
	if err := m.runsOff(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing || !m.drives.enter() {
		return errShuttingDown
	}
	lr.driving = true
	if !m.tasks.goTracked(func() {
		defer m.drives.leave()
		m.drive(lr, st, cause)
	}) {
		lr.driving = false
		m.drives.leave()
		return errShuttingDown
	}
	return nil
}

// drive runs the agent until it finishes, fails, is canceled or stops for
// approvals (or a checkpoint).
func (m *Manager) drive(lr *liveRun, st *harness.RunState, cause string) {
	ctx, cancel := context.WithCancel(m.base)
	defer cancel()
	lr.mu.Lock()
	lr.cancel = cancel
	canceled := lr.canceled
	rec := *lr.rec
	lr.mu.Unlock()
	if canceled {
		m.endRun(lr, statusCanceled, nil, nil)
		return
	}
	sess, err := m.acquireSession(ctx, rec.Tenant, &rec, lr.spec)
	if err != nil {
		m.settle(lr, nil, fmt.Errorf("sandbox: %w", err))
		return
	}
	agent, err := m.buildAgent(lr, sess.Manifest().RunAs)
	if err != nil {
		m.settle(lr, nil, err)
		return
	}
	_ = lr.update(ctx, func(r *store.Run) { r.Status, r.Error, r.Checkpoint = statusRunning, "", nil })
	if cause != "" {
		lr.publish(Event{Kind: EventRunResumed, Text: cause})
	}
	maxTurns := lr.spec.MaxTurns
	if maxTurns <= 0 || maxTurns > m.cfg.MaxTurns {
		maxTurns = m.cfg.MaxTurns
	}
	cfg := harness.RunConfig{MaxTurns: maxTurns, Sandbox: &harness.SandboxConfig{Session: sess, Workdir: lr.spec.Workdir},
		Observer: m.cfg.Observer}
	var stream *harness.Stream
	if st == nil {
		stream = m.runner.RunStreamed(ctx, agent, lr.spec.Input, cfg)
	} else {
		stream = m.runner.ResumeStreamed(ctx, agent, st, cfg)
	}
	for ev := range stream.Events() {
		if e, ok := eventOf(ev); ok {
			lr.publish(e)
		}
	}
	res, err := stream.Wait()
	m.settle(lr, res, err)
}

// settle records how a drive ended.
func (m *Manager) settle(lr *liveRun, res *harness.Result, err error) {
	lr.mu.Lock()
	canceled := lr.canceled
	lr.mu.Unlock()
	switch {
	case canceled:
		m.endRun(lr, statusCanceled, res, nil)
	case err != nil && m.base.Err() != nil:
		// Cut by a hard stop: the record stays running and the next
		// manager reports the run lost.
		lr.mu.Lock()
		lr.driving = false
		lr.mu.Unlock()
		lr.flush() // its events are stored before the store may close
		m.forget(lr)
	case err != nil:
		m.endRun(lr, statusFailed, res, err)
	case res != nil && len(res.Interruptions) > 0:
		m.stopForApprovals(lr, res)
	default:
		m.endRun(lr, statusSucceeded, res, nil)
	}
}

// stopForApprovals records a run that stopped with pending calls: waiting
// for approvals, or checkpointed when the manager is draining.
func (m *Manager) stopForApprovals(lr *liveRun, res *harness.Result) {
	data, err := res.State.Encode()
	if err != nil {
		m.endRun(lr, statusFailed, res, fmt.Errorf("encode run state: %w", err))
		return
	}
	lr.mu.Lock()
	var cps []string
	for _, p := range res.State.Pending {
		if lr.checkpoint[p.Call.ID] {
			cps = append(cps, p.Call.ID)
		}
	}
	status := statusWaiting
	if len(cps) > 0 {
		status = statusCheckpointed
	}
	lr.state = res.State
	lr.driving = false
	err = lr.updateLocked(m.base, func(r *store.Run) {
		r.Status, r.RunState, r.Checkpoint = status, data, cps
		r.Turns, r.InputTokens, r.OutputTokens = res.Turns, res.Usage.InputTokens, res.Usage.OutputTokens
	})
	if err != nil {
		m.log.Error("saving a stopped run", zap.String("run", lr.rec.ID), zap.Error(err))
	}
	if lr.canceled {
		// Canceled while its turn ended (after settle looked): Cancel
		// saw it driving and waits for its end. Its state is saved, so
		// Resume can continue it.
		lr.mu.Unlock()
		m.endRun(lr, statusCanceled, res, nil)
		return
	}
	if status == statusWaiting {
		m.announceLocked(lr)
	}
	lr.mu.Unlock()
}

// announceLocked publishes ApprovalRequested for each undecided call.
func (m *Manager) announceLocked(lr *liveRun) {
	for _, p := range lr.state.Undecided() {
		lr.publishLocked(Event{Agent: p.Agent, Kind: EventApprovalRequested, CallID: p.Call.ID, Tool: p.Call.Name, Input: p.Call.Input})
	}
}

func pendingOf(p *harness.PendingCall) PendingApproval {
	return PendingApproval{CallID: p.Call.ID, Tool: p.Call.Name, Input: p.Call.Input, Agent: p.Agent}
}

// endRun records a run's end, publishes its last event, ends its streams
// and lets its sandbox go (kept for SandboxRetention, then deleted).
func (m *Manager) endRun(lr *liveRun, status string, res *harness.Result, runErr error) {
	lr.mu.Lock()
	if lr.over { // already ended
		lr.mu.Unlock()
		return
	}
	lr.over = true
	var last *Event
	err := lr.updateLocked(m.base, func(r *store.Run) {
		r.Status = status
		if res != nil {
			r.Turns, r.InputTokens, r.OutputTokens = res.Turns, res.Usage.InputTokens, res.Usage.OutputTokens
		}
		switch status {
		case statusSucceeded:
			r.FinalOutput = res.FinalOutput
			last = &Event{Kind: EventRunFinished, Text: r.FinalOutput, Turn: r.Turns,
				Usage: Usage{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens}}
		case statusFailed:
			r.Error = oneLine(runErr.Error())
			last = &Event{Kind: EventRunFailed, Text: r.Error}
		case statusCanceled:
			r.Error = "canceled"
			if lr.reason != "" {
				r.Error = "canceled: " + lr.reason
			}
			last = &Event{Kind: EventRunCanceled, Text: lr.reason}
		}
		if m.cfg.SandboxRetention > 0 && r.SandboxID != "" {
			r.SandboxExpires = m.now().Add(m.cfg.SandboxRetention)
		}
	})
	if err != nil {
		m.log.Error("saving the end of a run", zap.String("run", lr.rec.ID), zap.Error(err))
	}
	if last != nil {
		lr.publishLocked(*last)
	}
	lr.driving = false
	lr.state = nil
	// Every event is stored and sent before the streams end.
	lr.endEvents()
	close(lr.ended)
	rec := *lr.rec
	lr.mu.Unlock()
	m.forget(lr)
	m.letSandboxGo(rec)
}

// forget drops an ended (or cut) run from the active set, gives its run
// slot back and ends its claim of a caller's sandbox (which stays).
func (m *Manager) forget(lr *liveRun) {
	m.mu.Lock()
	if m.runs[lr.id] == lr {
		delete(m.runs, lr.id)
		m.usage.releaseRun(lr.tenant, lr.id)
		m.unclaimLocked(lr.box, lr.id)
		lr.box = nil
	}
	m.mu.Unlock()
}

// oneLine keeps an error on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// specJSON encodes a run's spec for the store.
func specJSON(spec *RunSpec) ([]byte, error) { return json.Marshal(spec) }

// specOf decodes a stored spec.
func specOf(data []byte) (*RunSpec, error) {
	spec := &RunSpec{}
	if err := json.Unmarshal(data, spec); err != nil {
		return nil, fmt.Errorf("stored run spec: %w", err)
	}
	return spec, nil
}
