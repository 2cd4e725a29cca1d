package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/compaction"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/shell"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// Stored statuses: the API's RunStatus names, plus checkpointed (shown as
// running), a run the service stopped at the end of a turn to shut down.
var (
	statusPending      = harnessv1.RunStatus_RUN_STATUS_PENDING.String()
	statusRunning      = harnessv1.RunStatus_RUN_STATUS_RUNNING.String()
	statusWaiting      = harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL.String()
	statusSucceeded    = harnessv1.RunStatus_RUN_STATUS_SUCCEEDED.String()
	statusFailed       = harnessv1.RunStatus_RUN_STATUS_FAILED.String()
	statusCanceled     = harnessv1.RunStatus_RUN_STATUS_CANCELED.String()
	statusCheckpointed = "CHECKPOINTED"
	activeStatuses     = []string{statusPending, statusRunning, statusWaiting, statusCheckpointed}
)

func terminal(status string) bool {
	return status == statusSucceeded || status == statusFailed || status == statusCanceled
}

// errLost is the error of a run the service lost in the middle of a turn.
const errLost = "the service stopped while the run was in a turn; the turn was lost (ResumeRun continues from the last saved state, if any)"

// liveRun is an active run in this process.
type liveRun struct {
	s *Service
	// id and tenant never change (rec does: read it under mu).
	id, tenant string
	// draining makes every further tool call a checkpoint (Shutdown).
	draining atomic.Bool

	mu   sync.Mutex
	rec  *store.Run
	spec *harnessv1.StartRunRequest
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
}

func (s *Service) newLiveRun(rec *store.Run, spec *harnessv1.StartRunRequest, seq uint64) *liveRun {
	lr := &liveRun{s: s, id: rec.ID, tenant: rec.Tenant, rec: rec, spec: spec, checkpoint: map[string]bool{}, ended: make(chan struct{})}
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
	next.Updated = lr.s.now()
	if err := lr.s.cfg.Store.UpdateRun(context.WithoutCancel(ctx), &next); err != nil {
		return fmt.Errorf("save run %s: %w", next.ID, err)
	}
	lr.s.moved(lr.rec.Status, next.Status)
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

// capabilityNames are the capabilities a request may name.
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

// parseManifest reads a request's manifest with the rules for untrusted
// documents (no host sources, grants, mounts or secret references; no
// root) and the service's account policy (see validate.go).
func parseManifest(text string) (*manifest.Manifest, error) {
	if strings.TrimSpace(text) == "" {
		return &manifest.Manifest{}, nil
	}
	m, err := manifest.LoadUntrusted([]byte(text), manifest.FormatAuto, manifest.UntrustedOptions{})
	if err != nil {
		return nil, &fieldError{field: "manifest", err: err}
	}
	if err := checkAccounts(m); err != nil {
		return nil, err
	}
	return m, nil
}

// userPolicies are the approval policies a request asks for.
func userPolicies(p *harnessv1.ApprovalPolicy) (map[string]harness.ApprovalPolicy, error) {
	res, err := checkApprovals(p)
	if err != nil {
		return nil, err
	}
	out := map[string]harness.ApprovalPolicy{}
	for _, name := range p.GetRequireApproval() {
		out[name] = harness.AlwaysApprove()
	}
	if len(res) > 0 {
		if _, always := out["exec_command"]; !always {
			out["exec_command"] = harness.CommandsOutside(res...)
		}
	}
	return out, nil
}

func agentName(spec *harnessv1.StartRunRequest) string {
	if n := spec.GetAgent().GetName(); n != "" {
		return n
	}
	return "agent"
}

// buildAgent makes the run's agent, working as runAs (its sandbox's
// account, never the request's text: see resolveRunAs). Every tool of the
// agent gets a policy: the request's approval rule first, then, while the
// service drains, a checkpoint that holds the call so the run stops at the
// end of its turn.
func (s *Service) buildAgent(lr *liveRun, runAs string) (*harness.Agent, error) {
	spec := lr.spec
	caps, err := capabilitiesOf(spec.GetAgent().GetCapabilities())
	if err != nil {
		return nil, err
	}
	user, err := userPolicies(spec.GetApprovals())
	if err != nil {
		return nil, err
	}
	instr := spec.GetAgent().GetInstructions()
	if instr == "" {
		instr = s.cfg.DefaultInstructions
	}
	a := &harness.Agent{Name: agentName(spec), Instructions: instr, ModelName: spec.GetAgent().GetModel(),
		Capabilities: caps, RunAs: runAs, Approvals: map[string]harness.ApprovalPolicy{}}
	modelName := a.ModelName
	if modelName == "" {
		modelName = s.cfg.DefaultModel
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
// with the account the request's agent.run_as may choose (resolveRunAs).
func sandboxManifest(spec *harnessv1.StartRunRequest) (*manifest.Manifest, error) {
	m, err := parseManifest(spec.GetManifest())
	if err != nil {
		return nil, err
	}
	caps, err := capabilitiesOf(spec.GetAgent().GetCapabilities())
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
	return resolveRunAs(m, spec.GetAgent().GetRunAs())
}

// acquireSession returns the run's live sandbox session: the one held, the
// one its stored state names (reattached or rebuilt from its snapshot), or
// a fresh one. Sandboxes it makes get the operator's resource caps, and
// their git checkouts are charged to the tenant (MeteredGit). The run holds
// its tenant's sandbox slot already (newRun, resumeStored, recover).
func (s *Service) acquireSession(ctx context.Context, tenant string, rec *store.Run, spec *harnessv1.StartRunRequest) (_ *compute.Session, err error) {
	ctx = withFetchAccount(ctx, s.usage.fetchAccount(tenant))
	defer func() { err = quotaCause(ctx, err) }()
	s.mu.Lock()
	if h := s.sessions[rec.ID]; h != nil {
		s.mu.Unlock()
		return h.sess, nil
	}
	s.mu.Unlock()
	var sess *compute.Session
	if len(rec.SessionState) > 0 {
		st, err := s.cfg.Compute.DecodeState(rec.SessionState)
		if err != nil {
			return nil, fmt.Errorf("sandbox state of run %s: %w", rec.ID, err)
		}
		if sess, err = s.cfg.Compute.Resume(ctx, st, compute.WithLimits(s.limits), compute.WithProviderOptions(s.providerOpts)); err != nil {
			return nil, err
		}
	} else {
		if spec == nil {
			return nil, fmt.Errorf("run %s has no sandbox", rec.ID)
		}
		m, err := sandboxManifest(spec)
		if err != nil {
			return nil, err
		}
		sess, err = s.cfg.Compute.Create(ctx, compute.CreateOptions{Manifest: m, SessionID: sandboxID(rec.ID),
			Labels: map[string]string{"bulkhead.run": rec.ID}, ProviderOptions: s.providerOpts, Limits: s.limits})
		if err != nil {
			return nil, err
		}
	}
	if err := sess.Start(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return nil, errors.Join(err, s.cfg.Compute.Delete(cctx, sess))
	}
	st, err := sess.State()
	if err != nil {
		return nil, err
	}
	data, err := st.Encode()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if h := s.sessions[rec.ID]; h != nil {
		// Another caller got there first: keep theirs.
		s.mu.Unlock()
		_ = sess.Release()
		return h.sess, nil
	}
	s.sessions[rec.ID] = &held{sess: sess, tenant: tenant}
	s.mu.Unlock()
	err = s.updateStored(ctx, tenant, rec.ID, func(r *store.Run) {
		r.SessionState, r.SandboxID, r.Provider, r.SandboxGone = data, sess.ID(), sess.Provider(), false
	})
	return sess, err
}

// startDrive starts a goroutine driving lr from st (nil: a fresh run on
// its input). lr.mu must be held.
func (s *Service) startDriveLocked(lr *liveRun, st *harness.RunState, cause string) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return connect.NewError(connect.CodeUnavailable, errors.New("the service is shutting down"))
	}
	s.wg.Add(1)
	s.mu.Unlock()
	lr.driving = true
	go s.drive(lr, st, cause)
	return nil
}

// drive runs the agent until it finishes, fails, is canceled or stops for
// approvals (or a checkpoint).
func (s *Service) drive(lr *liveRun, st *harness.RunState, cause string) {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(s.base)
	defer cancel()
	lr.mu.Lock()
	lr.cancel = cancel
	canceled := lr.canceled
	rec := *lr.rec
	lr.mu.Unlock()
	if canceled {
		s.endRun(lr, statusCanceled, nil, nil)
		return
	}
	sess, err := s.acquireSession(ctx, rec.Tenant, &rec, lr.spec)
	if err != nil {
		s.settle(lr, nil, fmt.Errorf("sandbox: %w", err))
		return
	}
	agent, err := s.buildAgent(lr, sess.Manifest().RunAs)
	if err != nil {
		s.settle(lr, nil, err)
		return
	}
	_ = lr.update(ctx, func(r *store.Run) { r.Status, r.Error, r.Checkpoint = statusRunning, "", nil })
	if cause != "" {
		lr.publish(&harnessv1.RunEvent{Kind: &harnessv1.RunEvent_RunResumed{RunResumed: &harnessv1.RunResumed{Cause: cause}}})
	}
	maxTurns := int(lr.spec.GetMaxTurns())
	if maxTurns <= 0 || maxTurns > s.cfg.MaxTurns {
		maxTurns = s.cfg.MaxTurns
	}
	cfg := harness.RunConfig{MaxTurns: maxTurns, Sandbox: &harness.SandboxConfig{Session: sess, Workdir: lr.spec.GetWorkdir()},
		Observer: s.cfg.Observer}
	var stream *harness.Stream
	if st == nil {
		stream = s.runner.RunStreamed(ctx, agent, lr.spec.GetInput(), cfg)
	} else {
		stream = s.runner.ResumeStreamed(ctx, agent, st, cfg)
	}
	for ev := range stream.Events() {
		if pe := eventOf(ev); pe != nil {
			lr.publish(pe)
		}
	}
	res, err := stream.Wait()
	s.settle(lr, res, err)
}

// settle records how a drive ended.
func (s *Service) settle(lr *liveRun, res *harness.Result, err error) {
	lr.mu.Lock()
	canceled := lr.canceled
	lr.mu.Unlock()
	switch {
	case canceled:
		s.endRun(lr, statusCanceled, res, nil)
	case err != nil && s.base.Err() != nil:
		// Cut by a hard stop: the record stays running and the next
		// service reports the run lost.
		lr.mu.Lock()
		lr.driving = false
		lr.mu.Unlock()
		lr.flush() // its events are stored before the store may close
		s.forget(lr)
	case err != nil:
		s.endRun(lr, statusFailed, res, err)
	case res != nil && len(res.Interruptions) > 0:
		s.stopForApprovals(lr, res)
	default:
		s.endRun(lr, statusSucceeded, res, nil)
	}
}

// stopForApprovals records a run that stopped with pending calls: waiting
// for approvals, or checkpointed when the service is draining.
func (s *Service) stopForApprovals(lr *liveRun, res *harness.Result) {
	data, err := res.State.Encode()
	if err != nil {
		s.endRun(lr, statusFailed, res, fmt.Errorf("encode run state: %w", err))
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
	err = lr.updateLocked(s.base, func(r *store.Run) {
		r.Status, r.RunState, r.Checkpoint = status, data, cps
		r.Turns, r.InputTokens, r.OutputTokens = res.Turns, res.Usage.InputTokens, res.Usage.OutputTokens
	})
	if err != nil {
		s.log.Error("saving a stopped run", zap.String("run", lr.rec.ID), zap.Error(err))
	}
	if status == statusWaiting {
		s.announceLocked(lr)
	}
	lr.mu.Unlock()
}

// announceLocked publishes ApprovalRequested for each undecided call.
func (s *Service) announceLocked(lr *liveRun) {
	for _, p := range lr.state.Undecided() {
		lr.publishLocked(&harnessv1.RunEvent{Agent: p.Agent, Kind: &harnessv1.RunEvent_ApprovalRequested{
			ApprovalRequested: &harnessv1.ApprovalRequested{Call: pendingOf(p)}}})
	}
}

func pendingOf(p *harness.PendingCall) *harnessv1.PendingApproval {
	return &harnessv1.PendingApproval{CallId: p.Call.ID, Tool: p.Call.Name, Input: p.Call.Input, Agent: p.Agent}
}

// endRun records a run's end, publishes its last event, ends its streams
// and lets its sandbox go (kept for SandboxRetention, then deleted).
func (s *Service) endRun(lr *liveRun, status string, res *harness.Result, runErr error) {
	lr.mu.Lock()
	if lr.over { // already ended
		lr.mu.Unlock()
		return
	}
	lr.over = true
	var last *harnessv1.RunEvent
	err := lr.updateLocked(s.base, func(r *store.Run) {
		r.Status = status
		if res != nil {
			r.Turns, r.InputTokens, r.OutputTokens = res.Turns, res.Usage.InputTokens, res.Usage.OutputTokens
		}
		switch status {
		case statusSucceeded:
			r.FinalOutput = res.FinalOutput
			last = &harnessv1.RunEvent{Kind: &harnessv1.RunEvent_RunFinished{RunFinished: &harnessv1.RunFinished{
				FinalOutput: r.FinalOutput, Turns: int32(r.Turns), Usage: &harnessv1.Usage{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens}}}}
		case statusFailed:
			r.Error = oneLine(runErr.Error())
			last = &harnessv1.RunEvent{Kind: &harnessv1.RunEvent_RunFailed{RunFailed: &harnessv1.RunFailed{Error: r.Error}}}
		case statusCanceled:
			r.Error = "canceled"
			if lr.reason != "" {
				r.Error = "canceled: " + lr.reason
			}
			last = &harnessv1.RunEvent{Kind: &harnessv1.RunEvent_RunCanceled{RunCanceled: &harnessv1.RunCanceled{Reason: lr.reason}}}
		}
		if s.cfg.SandboxRetention > 0 && r.SandboxID != "" {
			r.SandboxExpires = s.now().Add(s.cfg.SandboxRetention)
		}
	})
	if err != nil {
		s.log.Error("saving the end of a run", zap.String("run", lr.rec.ID), zap.Error(err))
	}
	if last != nil {
		lr.publishLocked(last)
	}
	lr.driving = false
	lr.state = nil
	// Every event is stored and sent before the streams end.
	lr.endEvents()
	close(lr.ended)
	rec := *lr.rec
	lr.mu.Unlock()
	s.forget(lr)
	s.letSandboxGo(rec)
}

// forget drops an ended (or cut) run from the active set and gives its
// run slot back.
func (s *Service) forget(lr *liveRun) {
	s.mu.Lock()
	if s.runs[lr.id] == lr {
		delete(s.runs, lr.id)
		s.usage.releaseRun(lr.tenant, lr.id)
	}
	s.mu.Unlock()
}

// letSandboxGo deletes a finished run's sandbox now, or when its retention
// ends; a run that holds none gives its sandbox slot back now.
func (s *Service) letSandboxGo(rec store.Run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[rec.ID] == nil {
		if _, active := s.runs[rec.ID]; !active {
			s.usage.releaseSandbox(rec.Tenant, rec.ID)
		}
		return
	}
	if s.closing {
		return
	}
	if d := s.cfg.SandboxRetention; d > 0 {
		s.timers[rec.ID] = time.AfterFunc(d, func() { s.deleteSandbox(rec.Tenant, rec.ID) })
		return
	}
	s.wg.Add(1) // not closing: Shutdown's wait has not begun
	go func() {
		defer s.wg.Done()
		s.deleteSandbox(rec.Tenant, rec.ID)
	}()
}

// deleteSandbox deletes the sandbox held for a finished run (not when the
// run became active again: ResumeRun took it back) and gives its sandbox
// slot back.
func (s *Service) deleteSandbox(tenant, runID string) {
	s.mu.Lock()
	if _, active := s.runs[runID]; active {
		delete(s.timers, runID)
		s.mu.Unlock()
		return
	}
	h := s.sessions[runID]
	delete(s.sessions, runID)
	delete(s.timers, runID)
	closing := s.closing
	if h != nil {
		// Released with the session: the sandbox is going (deleted now,
		// or released at a shutdown, whose next service does not hold it).
		s.usage.releaseSandbox(tenant, runID)
	}
	s.mu.Unlock()
	if h == nil || closing {
		if h != nil {
			_ = h.sess.Release()
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.base), 2*time.Minute)
	defer cancel()
	if err := s.cfg.Compute.Delete(ctx, h.sess); err != nil {
		s.log.Warn("deleting a run's sandbox", zap.String("run", runID), zap.Error(err))
	}
	if err := s.updateStored(ctx, tenant, runID, func(r *store.Run) { r.SandboxGone = true }); err != nil {
		s.log.Warn("recording a deleted sandbox", zap.String("run", runID), zap.Error(err))
	}
}

// oneLine keeps an error on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// specJSON encodes a run's spec for the store.
func specJSON(spec *harnessv1.StartRunRequest) ([]byte, error) { return protojson.Marshal(spec) }

// specOf decodes a stored spec.
func specOf(data []byte) (*harnessv1.StartRunRequest, error) {
	spec := &harnessv1.StartRunRequest{}
	if err := protojson.Unmarshal(data, spec); err != nil {
		return nil, fmt.Errorf("stored run spec: %w", err)
	}
	return spec, nil
}

// recover takes over the active runs of the store (see New). Each holds
// its tenant's run and sandbox slots, whatever the quotas are now, so the
// quotas count from the store's state.
//
// Runs of tenant ids from before tenants were namespaced (auth's
// LegacyTenant: "alice" rather than "token:alice") are recovered like the
// others, but no credential reaches them through the API any more; they
// are counted in a warning. Nothing is migrated: a bare name does not say
// whether a static token or a JWT made the run.
func (s *Service) recover(ctx context.Context) error {
	runs, err := s.cfg.Store.ActiveRuns(ctx, activeStatuses...)
	if err != nil {
		return fmt.Errorf("recover runs: %w", err)
	}
	legacy := 0
	for _, rec := range runs {
		spec, err := specOf(rec.Spec)
		if err != nil {
			return err
		}
		seq, err := s.cfg.Store.LastSequence(ctx, rec.ID)
		if err != nil {
			return fmt.Errorf("recover run %s: %w", rec.ID, err)
		}
		if auth.LegacyTenant(rec.Tenant) {
			legacy++
		}
		lr := s.newLiveRun(rec, spec, seq)
		s.mu.Lock()
		s.runs[rec.ID] = lr
		s.usage.hold(rec.Tenant, rec.ID, true)
		s.mu.Unlock()
		var st *harness.RunState
		if len(rec.RunState) > 0 {
			if st, err = harness.DecodeRunState(rec.RunState); err != nil {
				s.endRun(lr, statusFailed, nil, fmt.Errorf("recover: %w", err))
				continue
			}
		}
		switch rec.Status {
		case statusWaiting:
			lr.mu.Lock()
			lr.state = st
			if len(st.Undecided()) == 0 {
				// Every call was decided but the run had not continued.
				if err := s.startDriveLocked(lr, st, "restart"); err != nil {
					lr.mu.Unlock()
					return err
				}
			}
			lr.mu.Unlock()
			s.log.Info("run waits for approval again", zap.String("run", rec.ID))
		case statusCheckpointed:
			for _, id := range rec.Checkpoint {
				_ = st.Approve(id)
			}
			lr.mu.Lock()
			lr.state = st
			if len(st.Undecided()) > 0 {
				data, _ := st.Encode()
				_ = lr.updateLocked(ctx, func(r *store.Run) { r.Status, r.RunState, r.Checkpoint = statusWaiting, data, nil })
				s.announceLocked(lr)
			} else if err := s.startDriveLocked(lr, st, "restart"); err != nil {
				lr.mu.Unlock()
				return err
			}
			lr.mu.Unlock()
			s.log.Info("checkpointed run continues", zap.String("run", rec.ID))
		case statusPending:
			// No turn had started: start (or continue) it now.
			lr.mu.Lock()
			err := s.startDriveLocked(lr, st, "restart")
			lr.mu.Unlock()
			if err != nil {
				return err
			}
		default:
			s.log.Warn("run lost in a turn by the previous service", zap.String("run", rec.ID))
			s.endRun(lr, statusFailed, nil, errors.New(errLost))
			if len(rec.SessionState) > 0 && !rec.SandboxGone {
				s.usage.holdSandbox(rec.Tenant, rec.ID) // until it is reaped
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					s.reapSandbox(rec)
				}()
			}
		}
	}
	if legacy > 0 {
		s.log.Warn("active runs of tenant ids from before tenants were namespaced (token:NAME, jwt:ISSUER:CLAIM): no credential reaches them; cancel them in the store or re-tenant them",
			zap.Int("runs", legacy))
	}
	// Sandboxes kept for finished runs by the previous service.
	return nil
}

// reapSandbox deletes the sandbox of a run lost by an earlier service and
// gives its sandbox slot back (whether or not the delete worked: a
// sandbox that cannot be found or deleted is not counted for ever).
func (s *Service) reapSandbox(rec *store.Run) {
	defer s.usage.releaseSandbox(rec.Tenant, rec.ID)
	ctx, cancel := context.WithTimeout(s.base, 2*time.Minute)
	defer cancel()
	st, err := s.cfg.Compute.DecodeState(rec.SessionState)
	if err == nil {
		var sess *compute.Session
		if sess, err = s.cfg.Compute.Resume(ctx, st); err == nil {
			err = s.cfg.Compute.Delete(ctx, sess)
		}
	}
	if err != nil {
		s.log.Warn("deleting the sandbox of a lost run", zap.String("run", rec.ID), zap.Error(err))
		return
	}
	_ = s.updateStored(ctx, rec.Tenant, rec.ID, func(r *store.Run) { r.SandboxGone = true })
}
