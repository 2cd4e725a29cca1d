package manager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// The runs of a tenant: the Go API the transports call. Every method
// checks its input (validate.go) before it reads or makes anything.

// StartRun stores a new run of tenant and starts driving it; the run holds
// one of the tenant's run slots and one of its sandbox slots (resource
// exhausted when either quota is full), or, with spec.Sandbox, claims
// that API sandbox of the tenant's instead (callerbox.go). Without a
// model: ErrNoModel.
func (m *Manager) StartRun(ctx context.Context, tenant string, spec RunSpec) (*Run, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := m.runsOff(); err != nil {
		return nil, err
	}
	spec = spec.clone()
	man, err := m.validateSpec(&spec, true)
	if err != nil {
		return nil, err
	}
	return m.newRun(ctx, tenant, &spec, man, nil, "")
}

// GetRun returns a tenant's run.
func (m *Manager) GetRun(ctx context.Context, tenant, runID string) (*Run, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkRunID("run_id", runID); err != nil {
		return nil, err
	}
	return m.view(ctx, tenant, runID)
}

// ListRuns returns a page of a tenant's runs, newest first, and the token
// of the next page ("" on the last).
func (m *Manager) ListRuns(ctx context.Context, tenant string, o ListRunsOptions) ([]*Run, string, error) {
	if err := m.enter(tenant); err != nil {
		return nil, "", err
	}
	defer m.leave()
	status, err := checkListOptions(o)
	if err != nil {
		return nil, "", err
	}
	runs, next, err := m.cfg.Store.ListRuns(ctx, tenant, store.ListOptions{Status: status, Limit: o.PageSize, After: o.PageToken})
	if err != nil {
		return nil, "", err
	}
	out := make([]*Run, 0, len(runs))
	for _, r := range runs {
		v, err := m.view(ctx, tenant, r.ID)
		if err != nil {
			return nil, "", err
		}
		out = append(out, v)
	}
	return out, next, nil
}

// EventsOptions shape Events.
type EventsOptions struct {
	// KeepAlive, when set, is called every KeepAliveEvery while the
	// stream waits for the run's next event (an SSE comment that keeps
	// proxies from closing an idle stream); its error ends the stream.
	KeepAlive      func() error
	KeepAliveEvery time.Duration
}

// Events sends a tenant's run's events after sequence after (0: all) to
// send, in order: those stored first, then live ones as the run makes
// them, until the run has ended and every event is sent (nil), send fails
// (its error), ctx is done, or the manager shuts down (unavailable: the
// next manager goes on from the last sequence sent). send is called from
// the calling goroutine.
func (m *Manager) Events(ctx context.Context, tenant, runID string, after uint64, o EventsOptions, send func(Event) error) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	if err := checkRunID("run_id", runID); err != nil {
		return err
	}
	return m.streamEvents(ctx, tenant, runID, after, o, send)
}

// Approve approves a pending call of a tenant's run waiting for approval;
// the run continues once no call is undecided.
func (m *Manager) Approve(ctx context.Context, tenant, runID, callID string) (*Run, error) {
	return m.Decide(ctx, tenant, runID, Decision{CallID: callID, Approved: true})
}

// Reject rejects a pending call; reason is shown to the model.
func (m *Manager) Reject(ctx context.Context, tenant, runID, callID, reason string) (*Run, error) {
	return m.Decide(ctx, tenant, runID, Decision{CallID: callID, Reason: reason})
}

// Decide approves or rejects a pending call of a tenant's run (Approve
// and Reject): failed precondition when the run is not waiting for
// approval, not found for a call it does not wait for. A decision may
// continue the run: without a model, ErrNoModel (nothing is recorded).
func (m *Manager) Decide(ctx context.Context, tenant, runID string, d Decision) (*Run, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := m.runsOff(); err != nil {
		return nil, err
	}
	if err := checkRunID("run_id", runID); err != nil {
		return nil, err
	}
	if err := checkCallID(d.CallID); err != nil {
		return nil, err
	}
	if err := checkText("reason", d.Reason, maxReasonBytes); err != nil {
		return nil, err
	}
	lr, err := m.active(ctx, tenant, runID)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	closing := m.closing
	m.mu.Unlock()
	if closing {
		return nil, unavailable("the service is shutting down; decide again after its restart")
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.rec.Status != statusWaiting || lr.state == nil {
		return nil, failedPrecondition("run %s is not waiting for approval", runID)
	}
	if d.Approved {
		err = lr.state.Approve(d.CallID)
	} else {
		err = lr.state.Reject(d.CallID, d.Reason)
	}
	if errors.Is(err, harness.ErrUnknownCall) {
		return nil, withKind(errkind.ErrNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	data, err := lr.state.Encode()
	if err == nil {
		err = lr.updateLocked(ctx, func(r *store.Run) { r.RunState = data })
	}
	if err != nil {
		return nil, err
	}
	lr.publishLocked(Event{Kind: EventApprovalDecided, CallID: d.CallID, Approved: d.Approved, Text: d.Reason})
	if len(lr.state.Undecided()) == 0 {
		// The run continues: it is no longer waiting (a second decision
		// fails), and the next manager starts it if this one stops first.
		if err := m.startDriveLocked(lr, lr.state, "approved"); err != nil {
			return nil, err
		}
		lr.state = nil
		_ = lr.updateLocked(ctx, func(r *store.Run) { r.Status = statusPending })
	}
	return m.runOf(lr.rec, lr.state, lr.lastSeq()), nil
}

// Cancel cancels a tenant's active run (failed precondition once it has
// ended) and returns it once it has stopped.
func (m *Manager) Cancel(ctx context.Context, tenant, runID, reason string) (*Run, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkRunID("run_id", runID); err != nil {
		return nil, err
	}
	if err := checkText("reason", reason, maxReasonBytes); err != nil {
		return nil, err
	}
	lr, err := m.active(ctx, tenant, runID)
	if err != nil {
		return nil, err
	}
	lr.mu.Lock()
	if lr.over {
		lr.mu.Unlock()
		return nil, failedPrecondition("run %s has ended", runID)
	}
	lr.canceled, lr.reason = true, reason
	driving, cancel := lr.driving, lr.cancel
	lr.mu.Unlock()
	if driving {
		if cancel != nil {
			cancel()
		}
		select {
		case <-lr.ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	} else {
		m.endRun(lr, statusCanceled, nil, nil)
	}
	return m.view(ctx, tenant, runID)
}

// Resume continues a tenant's failed or canceled run from its saved
// state, with its sandbox (the one kept for it, or one rebuilt from its
// snapshot). Without a model: ErrNoModel.
func (m *Manager) Resume(ctx context.Context, tenant, runID string) (*Run, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := m.runsOff(); err != nil {
		return nil, err
	}
	if err := checkRunID("run_id", runID); err != nil {
		return nil, err
	}
	return m.resumeStored(ctx, tenant, runID)
}

// ResumeFromState starts a new run of tenant from a RunState (the JSON
// `harness run` saves; untrusted like the rest), with spec's agent,
// manifest and policies (its Input is not used: the state holds the
// conversation). A state cannot name sandboxes: the run gets a fresh one.
// Without a model: ErrNoModel.
func (m *Manager) ResumeFromState(ctx context.Context, tenant string, state []byte, spec RunSpec) (*Run, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := m.runsOff(); err != nil {
		return nil, err
	}
	if len(state) == 0 {
		return nil, badField("run_state", "missing")
	}
	st, err := harness.DecodeRunState(state)
	if err != nil {
		return nil, badField("run_state", "%v", err)
	}
	st.Sessions = nil
	spec = spec.clone()
	spec.Input = ""
	man, err := m.validateSpec(&spec, false)
	if err != nil {
		return nil, err
	}
	if st.Agent != agentName(&spec) {
		return nil, badField("agent.name", "the run state is for agent %q; the request's agent is %q", clip(st.Agent), agentName(&spec))
	}
	return m.newRun(ctx, tenant, &spec, man, st, "resume")
}

// clone copies the spec's slices: the manager keeps the spec, the caller
// keeps its own.
func (s RunSpec) clone() RunSpec {
	s.Agent.Capabilities = append([]string(nil), s.Agent.Capabilities...)
	s.Approvals.RequireApproval = append([]string(nil), s.Approvals.RequireApproval...)
	s.Approvals.AllowedCommands = append([]string(nil), s.Approvals.AllowedCommands...)
	return s
}

// runOf renders a stored run (with the live pending calls when waiting).
func (m *Manager) runOf(r *store.Run, st *harness.RunState, lastSeq uint64) *Run {
	out := &Run{ID: r.ID, Status: statusOf(r.Status), Created: r.Created, Updated: r.Updated, Turns: r.Turns,
		Usage: Usage{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens}, FinalOutput: r.FinalOutput, Error: r.Error,
		LastSequence: lastSeq}
	if !r.SandboxGone {
		out.SandboxID = r.SandboxID
	}
	if spec, err := specOf(r.Spec); err == nil {
		out.Agent, out.Model, out.Input = agentName(spec), spec.Agent.Model, spec.Input
		if spec.Sandbox != "" {
			out.SandboxID = spec.Sandbox // the caller's, named from the start
		}
	}
	if out.Model == "" {
		out.Model = m.cfg.DefaultModel
	}
	if st == nil && r.Status == statusWaiting && len(r.RunState) > 0 {
		st, _ = harness.DecodeRunState(r.RunState)
	}
	if r.Status == statusWaiting && st != nil {
		for _, p := range st.Undecided() {
			out.PendingApprovals = append(out.PendingApprovals, pendingOf(p))
		}
	}
	return out
}

// view returns a tenant's run.
func (m *Manager) view(ctx context.Context, tenant, id string) (*Run, error) {
	m.mu.Lock()
	lr := m.runs[id]
	m.mu.Unlock()
	if lr != nil {
		lr.mu.Lock()
		defer lr.mu.Unlock()
		if lr.tenant != tenant {
			return nil, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
		}
		return m.runOf(lr.rec, lr.state, lr.lastSeq()), nil
	}
	r, err := m.cfg.Store.GetRun(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	seq, err := m.cfg.Store.LastSequence(ctx, id)
	if err != nil {
		return nil, err
	}
	return m.runOf(r, nil, seq), nil
}

// active returns a tenant's active run, or an error: not found when the
// tenant has no such run, failed precondition when it is not active.
func (m *Manager) active(ctx context.Context, tenant, id string) (*liveRun, error) {
	m.mu.Lock()
	lr := m.runs[id]
	m.mu.Unlock()
	if lr != nil && lr.tenant == tenant {
		return lr, nil
	}
	r, err := m.cfg.Store.GetRun(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return nil, failedPrecondition("run %s has ended (%s)", id, statusOf(r.Status))
}

// newRun stores a new run and starts driving it. man is its sandbox's
// manifest (validateSpec's); the run takes a run slot and a sandbox slot
// of its tenant first (resource exhausted when either is full),
// atomically.
func (m *Manager) newRun(ctx context.Context, tenant string, spec *RunSpec, man *manifest.Manifest, st *harness.RunState, cause string) (*Run, error) {
	data, err := specJSON(spec)
	if err != nil {
		return nil, err
	}
	now := m.now()
	rec := &store.Run{ID: newID("run-"), Tenant: tenant, Status: statusPending, Created: now, Updated: now, Spec: data}
	if st != nil {
		if rec.RunState, err = st.Encode(); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	closing := m.closing
	m.mu.Unlock()
	if closing {
		return nil, errShuttingDown
	}
	if hasGit(man) && m.usage.fetchLeft(tenant) <= 0 {
		return nil, m.usage.errFetchBudget()
	}
	// A run in the caller's sandbox claims it and takes no sandbox slot
	// (the sandbox holds its own).
	var b *box
	m.mu.Lock()
	if spec.Sandbox != "" {
		if b, err = m.claimBoxLocked(tenant, spec.Sandbox, rec.ID); err != nil {
			m.mu.Unlock()
			return nil, err
		}
	}
	if err := m.usage.reserve(tenant, rec.ID, b == nil); err != nil {
		m.unclaimLocked(b, rec.ID)
		m.mu.Unlock()
		return nil, err
	}
	m.mu.Unlock()
	if err := m.cfg.Store.CreateRun(ctx, rec); err != nil {
		m.mu.Lock()
		m.unclaimLocked(b, rec.ID)
		m.mu.Unlock()
		m.usage.releaseRun(tenant, rec.ID)
		m.usage.releaseSandbox(tenant, rec.ID)
		return nil, err
	}
	m.moved("", rec.Status)
	lr := m.newLiveRun(rec, spec, 0)
	m.mu.Lock()
	lr.box = b
	m.runs[rec.ID] = lr
	m.mu.Unlock()
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if err := m.startDriveLocked(lr, st, cause); err != nil {
		// Only a shutdown refuses: the next manager recovers the
		// pending run.
		return nil, err
	}
	return m.runOf(lr.rec, nil, lr.lastSeq()), nil
}

// resumeStored continues a failed or canceled run from its saved state.
func (m *Manager) resumeStored(ctx context.Context, tenant, id string) (*Run, error) {
	m.mu.Lock()
	_, active := m.runs[id]
	m.mu.Unlock()
	r, err := m.cfg.Store.GetRun(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if active || !terminal(r.Status) || r.Status == statusSucceeded {
		return nil, failedPrecondition("run %s is %s; only failed or canceled runs resume", id, strings.ToLower(strings.TrimPrefix(r.Status, "RUN_STATUS_")))
	}
	if len(r.RunState) == 0 {
		return nil, failedPrecondition("run %s stopped before any state was saved; start it again", id)
	}
	st, err := harness.DecodeRunState(r.RunState)
	if err != nil {
		return nil, err
	}
	spec, err := specOf(r.Spec)
	if err != nil {
		return nil, err
	}
	seq, err := m.cfg.Store.LastSequence(ctx, id)
	if err != nil {
		return nil, err
	}
	lr := m.newLiveRun(r, spec, seq)
	m.mu.Lock()
	if _, dup := m.runs[id]; dup {
		m.mu.Unlock()
		return nil, failedPrecondition("run %s is being resumed", id)
	}
	// The run is active again: a run slot, and a sandbox slot unless its
	// kept sandbox is still held (it keeps that one) or it works in the
	// caller's sandbox (claimed again: it may be gone, or busy).
	_, heldSandbox := m.sessions[id]
	_, kept := m.retained[id]
	if spec.Sandbox != "" {
		if lr.box, err = m.claimBoxLocked(tenant, spec.Sandbox, id); err != nil {
			m.mu.Unlock()
			return nil, err
		}
	}
	if err := m.usage.reserve(tenant, id, lr.box == nil && !heldSandbox && !kept); err != nil {
		m.unclaimLocked(lr.box, id)
		m.mu.Unlock()
		return nil, err
	}
	m.runs[id] = lr
	if t := m.timers[id]; t != nil {
		t.Stop() // the kept sandbox is the run's again
		delete(m.timers, id)
	}
	delete(m.retained, id)
	m.mu.Unlock()
	undo := func() {
		// Finished again: its sandbox (slot) goes as a finished run's.
		m.forget(lr)
		m.letSandboxGo(*r)
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if err := lr.updateLocked(ctx, func(r *store.Run) {
		r.Status, r.Error, r.SandboxExpires = statusPending, "", time.Time{}
	}); err != nil {
		undo()
		return nil, err
	}
	if err := m.startDriveLocked(lr, st, "resume"); err != nil {
		undo()
		return nil, err
	}
	return m.runOf(lr.rec, nil, lr.lastSeq()), nil
}
