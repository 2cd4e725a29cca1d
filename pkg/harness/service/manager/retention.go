package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// Sandboxes kept for finished runs. A finished run's sandbox is deleted at
// once, or kept until the deadline endRun stores with the run
// (store.Run.SandboxExpires, Config.SandboxRetention after the end). The
// deadline is what counts, not a timer: a timer only carries it out in
// this process. So a manager that stops (Shutdown) or crashes leaves the
// deadline in the store, and the next manager's New finds every sandbox it
// owned there (store.HeldSandboxes: the finished runs whose sandbox is not
// gone) and deletes those whose deadline passed, or that never had one, at
// once, and the others when it comes (recoverRetained). Until then they
// count against their tenant's sandbox quota, and their files can be read:
// the first use reattaches them.

// letSandboxGo deletes a finished run's sandbox now, or arms its deadline;
// a run that holds none gives its sandbox slot back now. While the manager
// drains, the sandbox is left to Shutdown.
func (m *Manager) letSandboxGo(rec store.Run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[rec.ID] == nil {
		if _, active := m.runs[rec.ID]; !active {
			m.usage.releaseSandbox(rec.Tenant, rec.ID)
		}
		return
	}
	if m.closing {
		return
	}
	if m.cfg.SandboxRetention > 0 && !rec.SandboxExpires.IsZero() {
		m.armLocked(rec.Tenant, rec.ID, rec.SandboxExpires)
		return
	}
	m.tasks.goTracked(func() { m.deleteSandbox(rec.Tenant, rec.ID) })
}

// armLocked deletes the sandbox kept for runID at deadline (m.mu held). A
// timer that fires does its work as a tracked task; one that fires while
// the manager drains does nothing (the deadline is in the store).
func (m *Manager) armLocked(tenant, runID string, deadline time.Time) {
	if t := m.timers[runID]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(max(deadline.Sub(m.now()), 0), func() {
		m.mu.Lock()
		if m.closing || m.timers[runID] != t || !m.tasks.enter() {
			m.mu.Unlock()
			return
		}
		delete(m.timers, runID)
		m.mu.Unlock()
		defer m.tasks.leave()
		m.deleteSandbox(tenant, runID)
	})
	m.timers[runID] = t
}

// deleteSandbox deletes the sandbox kept for a finished run (not when the
// run became active again: Resume took it back), held or not, and gives
// its sandbox slot back.
func (m *Manager) deleteSandbox(tenant, runID string) {
	m.mu.Lock()
	if _, active := m.runs[runID]; active {
		m.mu.Unlock()
		return
	}
	h := m.sessions[runID]
	rec := m.retained[runID]
	delete(m.sessions, runID)
	delete(m.retained, runID)
	if t := m.timers[runID]; t != nil {
		t.Stop()
		delete(m.timers, runID)
	}
	if h != nil || rec != nil {
		// Released with the sandbox: it is going.
		m.usage.releaseSandbox(tenant, runID)
	}
	m.mu.Unlock()
	m.ports.dropSandbox(sandboxID(runID))
	if h == nil && rec == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.base), 2*time.Minute)
	defer cancel()
	var err error
	if h != nil {
		err = m.cfg.Compute.Delete(ctx, h.sess)
	} else {
		err = m.destroy(ctx, rec)
	}
	if err != nil {
		m.log.Warn("deleting a run's sandbox", zap.String("run", runID), zap.Error(err))
		return
	}
	if err := m.updateStored(ctx, tenant, runID, func(r *store.Run) { r.SandboxGone = true }); err != nil {
		m.log.Warn("recording a deleted sandbox", zap.String("run", runID), zap.Error(err))
	}
}

// destroy deletes the sandbox a stored run names (reattaching to it: a
// session is what compute deletes).
func (m *Manager) destroy(ctx context.Context, rec *store.Run) error {
	st, err := m.cfg.Compute.DecodeState(rec.SessionState)
	if err != nil {
		return err
	}
	sess, err := m.cfg.Compute.Resume(ctx, st)
	if err != nil {
		return err
	}
	return m.cfg.Compute.Delete(ctx, sess)
}

// reapSandbox deletes the sandbox of a run an earlier manager lost, or
// kept past its deadline, and gives its sandbox slot back (whether or not
// the delete worked: a sandbox that cannot be found or deleted is not
// counted for ever). A record whose sandbox could not be deleted keeps
// it, and the next manager tries again; one whose state cannot be read is
// marked gone (nothing could ever find it).
func (m *Manager) reapSandbox(rec *store.Run) {
	defer m.usage.releaseSandbox(rec.Tenant, rec.ID)
	ctx, cancel := context.WithTimeout(m.base, 2*time.Minute)
	defer cancel()
	err := m.destroy(ctx, rec)
	if err != nil && !errors.Is(err, errkind.ErrInvalidArgument) {
		m.log.Warn("deleting the sandbox of an earlier service", zap.String("run", rec.ID), zap.Error(err))
		return
	}
	if err != nil {
		m.log.Error("the sandbox of an earlier service cannot be found from its stored state; forgetting it",
			zap.String("run", rec.ID), zap.Error(err))
	}
	_ = m.updateStored(ctx, rec.Tenant, rec.ID, func(r *store.Run) { r.SandboxGone = true })
}

// recoverRetained takes back the sandboxes an earlier manager kept for
// finished runs (New, before recover fails the runs it lost, whose
// sandboxes recover reaps itself). Each holds its tenant's sandbox slot
// until it is deleted.
func (m *Manager) recoverRetained(ctx context.Context) error {
	runs, err := m.cfg.Store.HeldSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("recover kept sandboxes: %w", err)
	}
	now := m.now()
	var kept, reaped int
	for _, rec := range runs {
		if !terminal(rec.Status) || !rec.HoldsSandbox() {
			continue // an active run's: recover's
		}
		m.mu.Lock()
		m.usage.holdSandbox(rec.Tenant, rec.ID)
		if rec.SandboxExpires.IsZero() || !rec.SandboxExpires.After(now) {
			m.mu.Unlock()
			reaped++
			if !m.tasks.goTracked(func() { m.reapSandbox(rec) }) {
				m.usage.releaseSandbox(rec.Tenant, rec.ID)
			}
			continue
		}
		m.retained[rec.ID] = rec
		m.armLocked(rec.Tenant, rec.ID, rec.SandboxExpires)
		m.mu.Unlock()
		kept++
	}
	if kept+reaped > 0 {
		m.log.Info("sandboxes kept for finished runs by an earlier service", zap.Int("deleted_now", reaped), zap.Int("kept_until_deadline", kept))
	}
	return nil
}

// releaseFinished lets a finished run's held sandbox go at Shutdown: deleted
// when its deadline passed (or it has none), else released with the
// deadline in the store for the next manager.
func (m *Manager) releaseFinished(ctx context.Context, runID string, h *held) error {
	defer m.usage.releaseSandbox(h.tenant, runID)
	rec, err := m.cfg.Store.GetRun(ctx, h.tenant, runID)
	if err == nil && !rec.SandboxExpires.IsZero() && rec.SandboxExpires.After(m.now()) {
		if err := h.sess.Release(); err != nil {
			return fmt.Errorf("release the sandbox of finished run %s: %w", runID, err)
		}
		return nil
	}
	err = m.cfg.Compute.Delete(ctx, h.sess)
	if err == nil {
		err = m.updateStored(ctx, h.tenant, runID, func(r *store.Run) { r.SandboxGone = true })
	}
	if err != nil {
		return fmt.Errorf("delete sandbox of finished run %s: %w", runID, err)
	}
	return nil
}
