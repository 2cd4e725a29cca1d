package agentd

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/materialize"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/process"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
)

// MaterializeRequest is one materialization: the plan, the grants to set
// (when SetGrants), the sandbox environment to set (when SetEnvironment)
// and the tar stream of the files' bytes.
type MaterializeRequest struct {
	Plan      materialize.Plan
	Grants    []workspace.Grant
	SetGrants bool
	// Environment replaces the sandbox environment every process started
	// afterwards gets (see process.Manager.SetEnvironment) when
	// SetEnvironment. It lives in memory only and is never logged.
	Environment    map[string]string
	SetEnvironment bool
}

// Materialize applies a plan (see package materialize). It runs alone with
// respect to Archive, Restore and Fingerprint, so none of them sees a
// half-moved tree. Grants are replaced before the entries are applied. The
// environment is checked first and replaced only once the plan has been
// applied, so a plan that fails leaves the processes' environment as it was.
func (d *Daemon) Materialize(ctx context.Context, req MaterializeRequest, r io.Reader) (materialize.Result, error) {
	d.restoreMu.Lock()
	defer d.restoreMu.Unlock()
	if req.SetEnvironment {
		for k, v := range req.Environment {
			if err := process.CheckEnvVar(k, v); err != nil {
				return materialize.Result{}, fmt.Errorf("materialize: environment: %w", err)
			}
		}
	}
	if req.SetGrants {
		if err := d.ws.SetGrants(req.Grants); err != nil {
			return materialize.Result{}, err
		}
	}
	res, err := materialize.Apply(ctx, d.cfg.WorkspaceRoot, req.Plan, r, accounts{d: d}, materialize.Options{
		MaxFileBytes: d.cfg.MaxFileBytes,
	})
	if err != nil {
		return res, err
	}
	if req.SetEnvironment {
		if err := d.procs.SetEnvironment(req.Environment); err != nil {
			return res, fmt.Errorf("materialize: environment: %w", err)
		}
		d.log.Debug("sandbox environment set", zap.Strings("names", slices.Sorted(maps.Keys(req.Environment))))
	}
	return res, nil
}
