package agentd

import (
	"context"
	"io"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/materialize"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/workspace"
)

// MaterializeRequest is one materialization: the plan, the grants to set
// (when SetGrants) and the tar stream of the files' bytes.
type MaterializeRequest struct {
	Plan      materialize.Plan
	Grants    []workspace.Grant
	SetGrants bool
}

// Materialize applies a plan (see package materialize). It runs alone with
// respect to Archive, Restore and Fingerprint, so none of them sees a
// half-moved tree. Grants are replaced before the entries are applied and
// only when the plan's accounts and entries are valid.
func (d *Daemon) Materialize(ctx context.Context, req MaterializeRequest, r io.Reader) (materialize.Result, error) {
	d.restoreMu.Lock()
	defer d.restoreMu.Unlock()
	if req.SetGrants {
		if err := d.ws.SetGrants(req.Grants); err != nil {
			return materialize.Result{}, err
		}
	}
	return materialize.Apply(ctx, d.cfg.WorkspaceRoot, req.Plan, r, accounts{d: d}, materialize.Options{
		MaxFileBytes: d.cfg.MaxFileBytes,
	})
}
