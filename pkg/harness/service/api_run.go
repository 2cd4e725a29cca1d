package service

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// runAPI implements RunService over the run manager: each method takes the
// request's tenant, converts the request (convert.go), calls the manager
// and converts its answer back.
type runAPI struct{ m *manager.Manager }

var errNoTenant = errors.New("no tenant bound to the request")

// tenantOf returns the request's tenant (set by the auth interceptor).
func tenantOf(ctx context.Context) (string, error) {
	t, ok := auth.Tenant(ctx)
	if !ok {
		return "", connect.NewError(connect.CodeUnauthenticated, errNoTenant)
	}
	return t, nil
}

func (a *runAPI) StartRun(ctx context.Context, req *connect.Request[harnessv1.StartRunRequest]) (*connect.Response[harnessv1.StartRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	run, err := a.m.StartRun(ctx, tenant, runSpecOf(req.Msg))
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.StartRunResponse{Run: runProto(run)}), nil
}

func (a *runAPI) GetRun(ctx context.Context, req *connect.Request[harnessv1.GetRunRequest]) (*connect.Response[harnessv1.GetRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	run, err := a.m.GetRun(ctx, tenant, req.Msg.GetRunId())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.GetRunResponse{Run: runProto(run)}), nil
}

func (a *runAPI) ListRuns(ctx context.Context, req *connect.Request[harnessv1.ListRunsRequest]) (*connect.Response[harnessv1.ListRunsResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	opts, err := listRunsOptionsOf(req.Msg)
	if err != nil {
		return nil, apiError(err)
	}
	runs, next, err := a.m.ListRuns(ctx, tenant, opts)
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListRunsResponse{NextPageToken: next}
	for _, r := range runs {
		out.Runs = append(out.Runs, runProto(r))
	}
	return connect.NewResponse(out), nil
}

func (a *runAPI) StreamRunEvents(ctx context.Context, req *connect.Request[harnessv1.StreamRunEventsRequest], stream *connect.ServerStream[harnessv1.StreamRunEventsResponse]) error {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return err
	}
	err = a.m.Events(ctx, tenant, req.Msg.GetRunId(), req.Msg.GetAfterSequence(), manager.EventsOptions{}, func(ev manager.Event) error {
		return stream.Send(&harnessv1.StreamRunEventsResponse{Event: eventProto(ev)})
	})
	return apiError(err)
}

func (a *runAPI) ApproveToolCall(ctx context.Context, req *connect.Request[harnessv1.ApproveToolCallRequest]) (*connect.Response[harnessv1.ApproveToolCallResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	run, err := a.m.Decide(ctx, tenant, req.Msg.GetRunId(), decisionOf(req.Msg))
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.ApproveToolCallResponse{Run: runProto(run)}), nil
}

func (a *runAPI) CancelRun(ctx context.Context, req *connect.Request[harnessv1.CancelRunRequest]) (*connect.Response[harnessv1.CancelRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	run, err := a.m.Cancel(ctx, tenant, req.Msg.GetRunId(), req.Msg.GetReason())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.CancelRunResponse{Run: runProto(run)}), nil
}

func (a *runAPI) ResumeRun(ctx context.Context, req *connect.Request[harnessv1.ResumeRunRequest]) (*connect.Response[harnessv1.ResumeRunResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	var run *manager.Run
	switch {
	case m.GetRunId() != "" && len(m.GetRunState()) > 0:
		return nil, apiError(invalid("run_id", "give run_id or run_state, not both"))
	case m.GetRunId() != "":
		run, err = a.m.Resume(ctx, tenant, m.GetRunId())
	case len(m.GetRunState()) > 0:
		run, err = a.m.ResumeFromState(ctx, tenant, m.GetRunState(), resumeSpecOf(m))
	default:
		return nil, apiError(invalid("run_id", "give run_id or run_state"))
	}
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.ResumeRunResponse{Run: runProto(run)}), nil
}
