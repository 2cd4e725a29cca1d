package manager

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// recover takes over the active runs of the store (see New). Each holds
// its tenant's run and sandbox slots, whatever the quotas are now, so the
// quotas count from the store's state.
//
// Runs of tenant ids from before tenants were namespaced (auth's
// LegacyTenant: "alice" rather than "token:alice") are recovered like the
// others, but no credential reaches them through the API any more; they
// are counted in a warning. Nothing is migrated: a bare name does not say
// whether a static token or a JWT made the run.
func (m *Manager) recover(ctx context.Context) error {
	runs, err := m.cfg.Store.ActiveRuns(ctx, activeStatuses...)
	if err != nil {
		return fmt.Errorf("recover runs: %w", err)
	}
	legacy := 0
	for _, rec := range runs {
		spec, err := specOf(rec.Spec)
		if err != nil {
			return err
		}
		seq, err := m.cfg.Store.LastSequence(ctx, rec.ID)
		if err != nil {
			return fmt.Errorf("recover run %s: %w", rec.ID, err)
		}
		if auth.LegacyTenant(rec.Tenant) {
			legacy++
		}
		lr := m.newLiveRun(rec, spec, seq)
		m.mu.Lock()
		m.runs[rec.ID] = lr
		m.usage.hold(rec.Tenant, rec.ID, spec.Sandbox == "")
		var claimErr error
		if spec.Sandbox != "" {
			// The caller's sandbox (recovered before the runs): claimed
			// again, never reaped with the run.
			lr.box, claimErr = m.claimBoxLocked(rec.Tenant, spec.Sandbox, rec.ID)
		}
		m.mu.Unlock()
		if claimErr != nil {
			m.log.Warn("run's sandbox is gone after a restart; the run fails", zap.String("run", rec.ID), zap.String("sandbox", spec.Sandbox))
			m.endRun(lr, statusFailed, nil, fmt.Errorf("recover: the run's sandbox %s: %w", spec.Sandbox, claimErr))
			continue
		}
		var st *harness.RunState
		if len(rec.RunState) > 0 {
			if st, err = harness.DecodeRunState(rec.RunState); err != nil {
				m.endRun(lr, statusFailed, nil, fmt.Errorf("recover: %w", err))
				continue
			}
		}
		switch rec.Status {
		case statusWaiting:
			lr.mu.Lock()
			lr.state = st
			if len(st.Undecided()) == 0 {
				// Every call was decided but the run had not continued.
				if err := m.continueRecovered(lr, st); err != nil {
					lr.mu.Unlock()
					return err
				}
			}
			lr.mu.Unlock()
			m.log.Info("run waits for approval again", zap.String("run", rec.ID))
		case statusCheckpointed:
			for _, id := range rec.Checkpoint {
				_ = st.Approve(id)
			}
			lr.mu.Lock()
			lr.state = st
			if len(st.Undecided()) > 0 {
				data, _ := st.Encode()
				_ = lr.updateLocked(ctx, func(r *store.Run) { r.Status, r.RunState, r.Checkpoint = statusWaiting, data, nil })
				m.announceLocked(lr)
			} else if err := m.continueRecovered(lr, st); err != nil {
				lr.mu.Unlock()
				return err
			}
			lr.mu.Unlock()
			m.log.Info("checkpointed run continues", zap.String("run", rec.ID))
		case statusPending:
			// No turn had started: start (or continue) it now.
			lr.mu.Lock()
			err := m.continueRecovered(lr, st)
			lr.mu.Unlock()
			if err != nil {
				return err
			}
		default:
			m.log.Warn("run lost in a turn by the previous service", zap.String("run", rec.ID))
			m.endRun(lr, statusFailed, nil, errors.New(errLost))
			if spec.Sandbox == "" && len(rec.SessionState) > 0 && !rec.SandboxGone {
				m.usage.holdSandbox(rec.Tenant, rec.ID) // until it is reaped
				if !m.tasks.goTracked(func() { m.reapSandbox(rec) }) {
					m.usage.releaseSandbox(rec.Tenant, rec.ID)
				}
			}
		}
	}
	if legacy > 0 {
		m.log.Warn("active runs of tenant ids from before tenants were namespaced (token:NAME, jwt:ISSUER:CLAIM): no credential reaches them; cancel them in the store or re-tenant them",
			zap.Int("runs", legacy))
	}
	return nil
}

// continueRecovered starts driving a recovered run (lr.mu held). Without a
// model (Config.Model nil) the run is left as the store has it, for a
// manager with one to continue.
func (m *Manager) continueRecovered(lr *liveRun, st *harness.RunState) error {
	err := m.startDriveLocked(lr, st, "restart")
	if errors.Is(err, ErrNoModel) {
		m.log.Warn("run left as it is: this service has no model to continue it", zap.String("run", lr.id))
		return nil
	}
	return err
}
