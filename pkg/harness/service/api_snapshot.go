package service

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// The pause, resume, snapshot and fork calls of SandboxService.

func (a *sandboxAPI) PauseSandbox(ctx context.Context, req *connect.Request[harnessv1.PauseSandboxRequest]) (*connect.Response[harnessv1.PauseSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sb, kept, err := a.m.PauseSandbox(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.PauseSandboxResponse{Sandbox: sandboxProto(*sb), KeepMemory: kept}), nil
}

func (a *sandboxAPI) ResumeSandbox(ctx context.Context, req *connect.Request[harnessv1.ResumeSandboxRequest]) (*connect.Response[harnessv1.ResumeSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sb, kept, err := a.m.ResumeSandbox(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.ResumeSandboxResponse{Sandbox: sandboxProto(*sb), KeepMemory: kept}), nil
}

func (a *sandboxAPI) SnapshotSandbox(ctx context.Context, req *connect.Request[harnessv1.SnapshotSandboxRequest]) (*connect.Response[harnessv1.SnapshotSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	snap, err := a.m.SnapshotSandbox(ctx, tenant, req.Msg.GetSandboxId(), req.Msg.GetLabels())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.SnapshotSandboxResponse{Snapshot: snapshotProto(*snap)}), nil
}

func (a *sandboxAPI) ForkSandbox(ctx context.Context, req *connect.Request[harnessv1.ForkSandboxRequest]) (*connect.Response[harnessv1.ForkSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sbs, err := a.m.ForkSandbox(ctx, tenant, req.Msg.GetSandboxId(), int(req.Msg.GetCount()))
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ForkSandboxResponse{}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, sandboxProto(sb))
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) ListSnapshots(ctx context.Context, req *connect.Request[harnessv1.ListSnapshotsRequest]) (*connect.Response[harnessv1.ListSnapshotsResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	snaps, err := a.m.ListSnapshots(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListSnapshotsResponse{}
	for _, s := range snaps {
		out.Snapshots = append(out.Snapshots, snapshotProto(s))
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) DeleteSnapshot(ctx context.Context, req *connect.Request[harnessv1.DeleteSnapshotRequest]) (*connect.Response[harnessv1.DeleteSnapshotResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.m.DeleteSnapshot(ctx, tenant, req.Msg.GetSnapshotId()); err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.DeleteSnapshotResponse{}), nil
}

func snapshotProto(s manager.Snapshot) *harnessv1.Snapshot {
	return &harnessv1.Snapshot{SnapshotId: s.ID, SandboxId: s.SandboxID, CreateTime: timestamppb.New(s.Created),
		SizeBytes: s.Size, KeepMemory: s.KeepMemory, Labels: s.Labels}
}
