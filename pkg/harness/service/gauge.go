package service

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
)

// gaugeStatuses are the stored statuses the service reports to its
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
func (s *Service) countRuns(ctx context.Context) error {
	if s.cfg.Runs == nil {
		return nil
	}
	runs, err := s.cfg.Store.ActiveRuns(ctx, append([]string{statusRunning}, gaugeStatuses...)...)
	if err != nil {
		return fmt.Errorf("count runs: %w", err)
	}
	s.countMu.Lock()
	defer s.countMu.Unlock()
	for _, r := range runs {
		s.counts[r.Status]++
	}
	for _, st := range gaugeStatuses {
		s.setGaugeLocked(st)
	}
	return nil
}

// moved records a run's status change from prev ("" for a new run) to
// next in the runs gauge.
func (s *Service) moved(prev, next string) {
	if s.cfg.Runs == nil || prev == next {
		return
	}
	s.countMu.Lock()
	defer s.countMu.Unlock()
	if prev != "" {
		s.counts[prev]--
		s.setGaugeLocked(prev)
	}
	if next != "" {
		s.counts[next]++
		s.setGaugeLocked(next)
	}
}

// setGaugeLocked reports one status's count (countMu held, so reports of
// one status reach the gauge in the order of the counts).
func (s *Service) setGaugeLocked(status string) {
	if status == statusRunning {
		return
	}
	if err := s.cfg.Runs.SetRuns(stateLabel(status), s.counts[status]); err != nil {
		s.log.Warn("setting the runs gauge", zap.String("status", status), zap.Error(err))
	}
}
