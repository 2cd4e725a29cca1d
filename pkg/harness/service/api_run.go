package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// runAPI implements RunService.
type runAPI struct{ s *Service }

// tenantOf returns the request's tenant (set by the auth interceptor).
func tenantOf(ctx context.Context) (string, error) {
	t, ok := auth.Tenant(ctx)
	if !ok {
		return "", connect.NewError(connect.CodeUnauthenticated, errNoTenant)
	}
	return t, nil
}

// apiError maps an error to a Connect error: absent (or another tenant's)
// runs are NotFound, bad input InvalidArgument, a tenant over a quota
// ResourceExhausted, the rest Internal with the error's text (which never
// holds a secret).
func apiError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	var fe *fieldError
	switch {
	case errors.As(err, &ce):
		return err
	case errors.As(err, &fe):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, ErrQuotaExceeded):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, store.ErrNotFound), errors.Is(err, harness.ErrUnknownCall):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, compute.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, compute.ErrInvalidArgument):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, compute.ErrPathEscape), errors.Is(err, compute.ErrPermissionDenied):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

// runProto renders a stored run (with the live pending calls when waiting).
func runProto(r *store.Run, st *harness.RunState, lastSeq uint64) *harnessv1.Run {
	status := harnessv1.RunStatus(harnessv1.RunStatus_value[r.Status])
	if r.Status == statusCheckpointed {
		status = harnessv1.RunStatus_RUN_STATUS_RUNNING
	}
	out := &harnessv1.Run{RunId: r.ID, Status: status, CreateTime: timestamppb.New(r.Created), UpdateTime: timestamppb.New(r.Updated),
		Turns: int32(r.Turns), Usage: &harnessv1.Usage{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens},
		FinalOutput: r.FinalOutput, Error: r.Error, LastSequence: lastSeq}
	if !r.SandboxGone {
		out.SandboxId = r.SandboxID
	}
	if spec, err := specOf(r.Spec); err == nil {
		out.Agent, out.Model, out.Input = agentName(spec), spec.GetAgent().GetModel(), spec.GetInput()
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

// view returns the API view of a tenant's run.
func (s *Service) view(ctx context.Context, tenant, id string) (*harnessv1.Run, error) {
	s.mu.Lock()
	lr := s.runs[id]
	s.mu.Unlock()
	if lr != nil {
		lr.mu.Lock()
		defer lr.mu.Unlock()
		if lr.tenant != tenant {
			return nil, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
		}
		return s.withModel(runProto(lr.rec, lr.state, lr.lastSeq())), nil
	}
	r, err := s.cfg.Store.GetRun(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	seq, err := s.cfg.Store.LastSequence(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.withModel(runProto(r, nil, seq)), nil
}

func (s *Service) withModel(r *harnessv1.Run) *harnessv1.Run {
	if r.Model == "" {
		r.Model = s.cfg.DefaultModel
	}
	return r
}

// active returns a tenant's active run, or an error: NotFound when the
// tenant has no such run, FailedPrecondition when it is not active.
func (s *Service) active(ctx context.Context, tenant, id string) (*liveRun, error) {
	s.mu.Lock()
	lr := s.runs[id]
	s.mu.Unlock()
	if lr != nil && lr.tenant == tenant {
		return lr, nil
	}
	r, err := s.cfg.Store.GetRun(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s has ended (%s)", id, strings.ToLower(strings.TrimPrefix(r.Status, "RUN_STATUS_"))))
}

// newRun stores a new run and starts driving it. m is its sandbox's
// manifest (validateSpec's); the run takes a run slot and a sandbox slot
// of its tenant first (ResourceExhausted when either is full), atomically.
func (s *Service) newRun(ctx context.Context, tenant string, spec *harnessv1.StartRunRequest, m *manifest.Manifest, st *harness.RunState, cause string) (*harnessv1.Run, error) {
	data, err := specJSON(spec)
	if err != nil {
		return nil, err
	}
	now := s.now()
	rec := &store.Run{ID: newID("run-"), Tenant: tenant, Status: statusPending, Created: now, Updated: now, Spec: data}
	if st != nil {
		if rec.RunState, err = st.Encode(); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the service is shutting down"))
	}
	if hasGit(m) && s.usage.fetchLeft(tenant) <= 0 {
		return nil, s.usage.errFetchBudget()
	}
	if err := s.usage.reserve(tenant, rec.ID, true); err != nil {
		return nil, err
	}
	if err := s.cfg.Store.CreateRun(ctx, rec); err != nil {
		s.usage.releaseRun(tenant, rec.ID)
		s.usage.releaseSandbox(tenant, rec.ID)
		return nil, err
	}
	s.moved("", rec.Status)
	lr := s.newLiveRun(rec, spec, 0)
	s.mu.Lock()
	s.runs[rec.ID] = lr
	s.mu.Unlock()
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if err := s.startDriveLocked(lr, st, cause); err != nil {
		// Only a shutdown refuses: the next service recovers the
		// pending run.
		return nil, err
	}
	return s.withModel(runProto(lr.rec, nil, lr.lastSeq())), nil
}

func (a *runAPI) StartRun(ctx context.Context, req *connect.Request[harnessv1.StartRunRequest]) (*connect.Response[harnessv1.StartRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m, err := a.s.validateSpec(req.Msg, true)
	if err != nil {
		return nil, apiError(err)
	}
	run, err := a.s.newRun(ctx, tenant, req.Msg, m, nil, "")
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.StartRunResponse{Run: run}), nil
}

func (a *runAPI) GetRun(ctx context.Context, req *connect.Request[harnessv1.GetRunRequest]) (*connect.Response[harnessv1.GetRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkRunID("run_id", req.Msg.GetRunId()); err != nil {
		return nil, apiError(err)
	}
	run, err := a.s.view(ctx, tenant, req.Msg.GetRunId())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.GetRunResponse{Run: run}), nil
}

func (a *runAPI) ListRuns(ctx context.Context, req *connect.Request[harnessv1.ListRunsRequest]) (*connect.Response[harnessv1.ListRunsResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	size := int(req.Msg.GetPageSize())
	if size < 0 || size > 500 {
		return nil, invalid("page_size must be between 0 and 500")
	}
	if tok := req.Msg.GetPageToken(); len(tok) > maxPageTokenBytes || strings.ContainsFunc(tok, func(r rune) bool {
		return !(r == '.' || r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
	}) {
		return nil, apiError(badField("page_token", "not a page token of this service"))
	}
	status := ""
	if st := req.Msg.GetStatus(); st != harnessv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		if _, known := harnessv1.RunStatus_name[int32(st)]; !known {
			return nil, apiError(badField("status", "unknown run status %d", st))
		}
		status = st.String()
	}
	runs, next, err := a.s.cfg.Store.ListRuns(ctx, tenant, store.ListOptions{Status: status, Limit: size, After: req.Msg.GetPageToken()})
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListRunsResponse{NextPageToken: next}
	for _, r := range runs {
		v, err := a.s.view(ctx, tenant, r.ID)
		if err != nil {
			return nil, apiError(err)
		}
		out.Runs = append(out.Runs, v)
	}
	return connect.NewResponse(out), nil
}

func (a *runAPI) StreamRunEvents(ctx context.Context, req *connect.Request[harnessv1.StreamRunEventsRequest], stream *connect.ServerStream[harnessv1.StreamRunEventsResponse]) error {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return err
	}
	if err := checkRunID("run_id", req.Msg.GetRunId()); err != nil {
		return apiError(err)
	}
	err = a.s.streamEvents(ctx, tenant, req.Msg.GetRunId(), req.Msg.GetAfterSequence(), func(ev *harnessv1.RunEvent) error {
		return stream.Send(&harnessv1.StreamRunEventsResponse{Event: ev})
	})
	return apiError(err)
}

func (a *runAPI) ApproveToolCall(ctx context.Context, req *connect.Request[harnessv1.ApproveToolCallRequest]) (*connect.Response[harnessv1.ApproveToolCallResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if err := checkRunID("run_id", m.GetRunId()); err != nil {
		return nil, apiError(err)
	}
	if m.GetCallId() == "" {
		return nil, apiError(badField("call_id", "missing"))
	}
	if err := checkName("call_id", m.GetCallId()); err != nil || len(m.GetCallId()) > maxCallIDBytes {
		return nil, apiError(badField("call_id", "not a call id"))
	}
	if err := checkText("reason", m.GetReason(), maxReasonBytes); err != nil {
		return nil, apiError(err)
	}
	lr, err := a.s.active(ctx, tenant, m.GetRunId())
	if err != nil {
		return nil, apiError(err)
	}
	s := a.s
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the service is shutting down; decide again after its restart"))
	}
	lr.mu.Lock()
	if lr.rec.Status != statusWaiting || lr.state == nil {
		lr.mu.Unlock()
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s is not waiting for approval", m.GetRunId()))
	}
	if m.GetApproved() {
		err = lr.state.Approve(m.GetCallId())
	} else {
		err = lr.state.Reject(m.GetCallId(), m.GetReason())
	}
	if err != nil {
		lr.mu.Unlock()
		return nil, apiError(err)
	}
	data, err := lr.state.Encode()
	if err == nil {
		err = lr.updateLocked(ctx, func(r *store.Run) { r.RunState = data })
	}
	if err != nil {
		lr.mu.Unlock()
		return nil, apiError(err)
	}
	lr.publishLocked(&harnessv1.RunEvent{Kind: &harnessv1.RunEvent_ApprovalDecided{ApprovalDecided: &harnessv1.ApprovalDecided{
		CallId: m.GetCallId(), Approved: m.GetApproved(), Reason: m.GetReason()}}})
	if len(lr.state.Undecided()) == 0 {
		// The run continues: it is no longer waiting (a second decision
		// fails), and the next service starts it if this one stops first.
		st := lr.state
		if err := a.s.startDriveLocked(lr, st, "approved"); err != nil {
			lr.mu.Unlock()
			return nil, err
		}
		lr.state = nil
		_ = lr.updateLocked(ctx, func(r *store.Run) { r.Status = statusPending })
	}
	run := a.s.withModel(runProto(lr.rec, lr.state, lr.lastSeq()))
	lr.mu.Unlock()
	return connect.NewResponse(&harnessv1.ApproveToolCallResponse{Run: run}), nil
}

func (a *runAPI) CancelRun(ctx context.Context, req *connect.Request[harnessv1.CancelRunRequest]) (*connect.Response[harnessv1.CancelRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkRunID("run_id", req.Msg.GetRunId()); err != nil {
		return nil, apiError(err)
	}
	if err := checkText("reason", req.Msg.GetReason(), maxReasonBytes); err != nil {
		return nil, apiError(err)
	}
	lr, err := a.s.active(ctx, tenant, req.Msg.GetRunId())
	if err != nil {
		return nil, apiError(err)
	}
	lr.mu.Lock()
	if lr.over {
		lr.mu.Unlock()
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s has ended", req.Msg.GetRunId()))
	}
	lr.canceled, lr.reason = true, req.Msg.GetReason()
	driving, cancel := lr.driving, lr.cancel
	lr.mu.Unlock()
	if driving {
		if cancel != nil {
			cancel()
		}
		select {
		case <-lr.ended:
		case <-ctx.Done():
			return nil, apiError(ctx.Err())
		}
	} else {
		a.s.endRun(lr, statusCanceled, nil, nil)
	}
	run, err := a.s.view(ctx, tenant, req.Msg.GetRunId())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.CancelRunResponse{Run: run}), nil
}

func (a *runAPI) ResumeRun(ctx context.Context, req *connect.Request[harnessv1.ResumeRunRequest]) (*connect.Response[harnessv1.ResumeRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if err := checkResumeRequest(m); err != nil {
		return nil, apiError(err)
	}
	if m.GetRunId() != "" {
		run, err := a.s.resumeStored(ctx, tenant, m.GetRunId())
		if err != nil {
			return nil, apiError(err)
		}
		return connect.NewResponse(&harnessv1.ResumeRunResponse{Run: run}), nil
	}
	if len(m.GetRunState()) == 0 {
		return nil, invalid("give run_id or run_state")
	}
	st, err := harness.DecodeRunState(m.GetRunState())
	if err != nil {
		return nil, apiError(badField("run_state", "%v", err))
	}
	// A client's state cannot name sandboxes: the run gets a fresh one.
	st.Sessions = nil
	spec := &harnessv1.StartRunRequest{Agent: m.GetAgent(), Manifest: m.GetManifest(), Approvals: m.GetApprovals(), MaxTurns: m.GetMaxTurns()}
	sm, err := a.s.validateSpec(spec, false)
	if err != nil {
		return nil, apiError(err)
	}
	if st.Agent != agentName(spec) {
		return nil, invalid("agent.name: the run state is for agent %q; the request's agent is %q", clip(st.Agent), agentName(spec))
	}
	run, err := a.s.newRun(ctx, tenant, spec, sm, st, "resume")
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.ResumeRunResponse{Run: run}), nil
}

// resumeStored continues a failed or canceled run from its saved state.
func (s *Service) resumeStored(ctx context.Context, tenant, id string) (*harnessv1.Run, error) {
	s.mu.Lock()
	_, active := s.runs[id]
	s.mu.Unlock()
	r, err := s.cfg.Store.GetRun(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if active || !terminal(r.Status) || r.Status == statusSucceeded {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s is %s; only failed or canceled runs resume", id,
			strings.ToLower(strings.TrimPrefix(r.Status, "RUN_STATUS_"))))
	}
	if len(r.RunState) == 0 {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s stopped before any state was saved; start it again", id))
	}
	st, err := harness.DecodeRunState(r.RunState)
	if err != nil {
		return nil, err
	}
	spec, err := specOf(r.Spec)
	if err != nil {
		return nil, err
	}
	seq, err := s.cfg.Store.LastSequence(ctx, id)
	if err != nil {
		return nil, err
	}
	lr := s.newLiveRun(r, spec, seq)
	s.mu.Lock()
	if _, dup := s.runs[id]; dup {
		s.mu.Unlock()
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("run %s is being resumed", id))
	}
	// The run is active again: a run slot, and a sandbox slot unless its
	// retained sandbox is still held (it keeps that one).
	_, heldSandbox := s.sessions[id]
	if err := s.usage.reserve(tenant, id, !heldSandbox); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.runs[id] = lr
	if t := s.timers[id]; t != nil {
		t.Stop() // the retained sandbox is the run's again
		delete(s.timers, id)
	}
	s.mu.Unlock()
	undo := func() {
		// Finished again: its sandbox (slot) goes as a finished run's.
		s.forget(lr)
		s.letSandboxGo(*r)
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if err := lr.updateLocked(ctx, func(r *store.Run) {
		r.Status, r.Error, r.SandboxExpires = statusPending, "", time.Time{}
	}); err != nil {
		undo()
		return nil, err
	}
	if err := s.startDriveLocked(lr, st, "resume"); err != nil {
		undo()
		return nil, err
	}
	return s.withModel(runProto(lr.rec, nil, lr.lastSeq())), nil
}
