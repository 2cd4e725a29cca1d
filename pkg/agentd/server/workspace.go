package server

import (
	"context"
	"errors"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	"github.com/bulkhead-dev/bulkhead/pkg/patch"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// workspaceService adapts workspace-wide operations to WorkspaceService.
type workspaceService struct {
	agentdv1.UnimplementedWorkspaceServiceServer
	d    *agentd.Daemon
	m    *metrics.Set // nil: metrics off
	bulk *bulkProcs   // nil: GOMAXPROCS is left alone
}

func (s *workspaceService) ApplyPatch(ctx context.Context, req *agentdv1.ApplyPatchRequest) (*agentdv1.ApplyPatchResponse, error) {
	pr := agentd.PatchRequest{Text: req.GetPatch(), Cwd: req.GetCwd(), User: req.GetUser(), DryRun: req.GetDryRun()}
	if ops := req.GetOperations(); ops != nil {
		pr.Operations = make([]patch.Operation, 0, len(ops.GetOperations()))
		for _, op := range ops.GetOperations() {
			pr.Operations = append(pr.Operations, patch.Operation{Type: operationType(op.GetType()), Path: op.GetPath(), Diff: op.GetDiff(), MoveTo: op.GetMoveTo()})
		}
	}
	changes, err := s.d.ApplyPatch(ctx, pr)
	if err != nil {
		return nil, errmap.ToStatus(err, patchRejection(err))
	}
	out := &agentdv1.ApplyPatchResponse{Changes: make([]*agentdv1.PatchChange, 0, len(changes))}
	for _, c := range changes {
		pc := &agentdv1.PatchChange{Path: c.Path}
		switch {
		case c.Kind == patch.OpAdd:
			pc.Kind = agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_CREATED
		case c.Kind == patch.OpDelete:
			pc.Kind = agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_DELETED
		case c.MoveTo != "":
			pc.Kind, pc.NewPath = agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_MOVED, c.MoveTo
		default:
			pc.Kind = agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_UPDATED
		}
		out.Changes = append(out.Changes, pc)
	}
	return out, nil
}

func operationType(t agentdv1.PatchOperationType) string {
	switch t {
	case agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_CREATE_FILE:
		return patch.OperationCreateFile
	case agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_UPDATE_FILE:
		return patch.OperationUpdateFile
	case agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_DELETE_FILE:
		return patch.OperationDeleteFile
	}
	return "" // rejected by the patch package with a clear error
}

// patchRejection extracts the structured reason of a failed patch: every
// failure of the patch engine has one (path empty for the patch as a
// whole), with its kind, its specific cause and the engine's one-line
// message, which is written for the model and names only the patch's
// paths. Other failures (of the commit, of the run_as user) have none.
func patchRejection(err error) *agentdv1.PatchRejection {
	var pe *patch.Error
	if !errors.As(err, &pe) {
		return nil
	}
	line, _, _ := strings.Cut(pe.Error(), "\n")
	out := &agentdv1.PatchRejection{
		Path:    validUTF8(pe.Path),
		Kind:    errmap.Reason(pe.Err),
		Cause:   errmap.Reason(pe.Cause),
		Message: validUTF8(line),
	}
	for _, l := range pe.Context {
		out.ExpectedLines = append(out.ExpectedLines, validUTF8(l))
	}
	if pe.Closest != nil {
		out.ClosestLine = int32(pe.Closest.StartLine)
		for _, l := range pe.Closest.Lines {
			out.ClosestLines = append(out.ClosestLines, validUTF8(l))
		}
	}
	return out
}
