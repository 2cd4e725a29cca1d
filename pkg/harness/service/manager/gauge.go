package manager

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
)

// RunGauge is told the number of runs in a state whenever it changes.
// States are the lower-case RunStatus names without their prefix
// (pending, waiting_approval, succeeded, failed, canceled) and
// "checkpointed". The manager never reports "running": the runner's
// observer counts the runs actually in a turn (metrics.StateRunning).
//
// The counts are the store's at New plus the transitions this manager
// makes, kept in memory (an O(1) update per transition, nothing at scrape
// time). Several replicas sharing one PostgreSQL store each report the
// store's counts at their start plus their own transitions, so their
// gauges drift apart; aggregate the running state only, or restart a
// replica to recount.
type RunGauge interface {
	SetRuns(state string, n int) error
}

// gaugeStatuses are the stored statuses the manager reports to its
// RunGauge (running is the runner observer's).
var gaugeStatuses = []string{statusPending, statusWaiting, statusCheckpointed, statusSucceeded, statusFailed, statusCanceled}

// stateLabel is the RunGauge state of a stored status:
// RUN_STATUS_WAITING_APPROVAL -> waiting_approval.
func stateLabel(status string) string {
	return strings.ToLower(strings.TrimPrefix(status, "RUN_STATUS_"))
}

// countRuns counts the stored runs by status (New, before recovery moves
// any) and reports every state, zeros included, so the gauge's series
// exist from the first scrape. It reads every record once: a start-up
// cost proportional to the store.
func (m *Manager) countRuns(ctx context.Context) error {
	if m.cfg.Runs == nil {
		return nil
	}
	runs, err := m.cfg.Store.ActiveRuns(ctx, append([]string{statusRunning}, gaugeStatuses...)...)
	if err != nil {
		return fmt.Errorf("count runs: %w", err)
	}
	m.countMu.Lock()
	defer m.countMu.Unlock()
	for _, r := range runs {
		m.counts[r.Status]++
	}
	for _, st := range gaugeStatuses {
		m.setGaugeLocked(st)
	}
	return nil
}

// moved records a run's status change from prev ("" for a new run) to
// next in the runs gauge.
func (m *Manager) moved(prev, next string) {
	if m.cfg.Runs == nil || prev == next {
		return
	}
	m.countMu.Lock()
	defer m.countMu.Unlock()
	if prev != "" {
		m.counts[prev]--
		m.setGaugeLocked(prev)
	}
	if next != "" {
		m.counts[next]++
		m.setGaugeLocked(next)
	}
}

// setGaugeLocked reports one status's count (countMu held, so reports of
// one status reach the gauge in the order of the counts).
func (m *Manager) setGaugeLocked(status string) {
	if status == statusRunning {
		return
	}
	if err := m.cfg.Runs.SetRuns(stateLabel(status), m.counts[status]); err != nil {
		m.log.Warn("setting the runs gauge", zap.String("status", status), zap.Error(err))
	}
}
