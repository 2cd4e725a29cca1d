package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// Pausing API sandboxes, and what idle means.
//
// PauseSandbox persists a sandbox's workspace and stops it. Where the
// provider can checkpoint a sandbox (compute.Pauser: local with gVisor)
// its memory and processes are kept too; elsewhere (compute answers
// ErrUnimplemented) the workspace only: it is persisted to the snapshot
// store, the sandbox is shut down and the session released, and resuming
// launches it again from its kept workspace or its snapshot. The record
// keeps the paused session's state, so a restarted service finds a paused
// sandbox paused. A paused sandbox keeps its sandbox slot and its ttl; it
// has no idle clock. Calls other than Get, List, Resume and Delete are
// refused while it is paused, but for a sandbox paused by its OnIdle
// policy, which the next call resumes (open).
//
// Idle. When a sandbox's idle deadline comes, its daemon is asked for its
// last activity (an RPC other than Info, a process using CPU, output, a
// port tunnel carrying bytes). Activity later than the service's own last
// call moves the idle clock there; otherwise the sandbox is deleted, or
// paused when its OnIdle says so.

// errPaused answers the calls a paused sandbox refuses.
func errPaused(id string) error {
	return failedPrecondition("sandbox %s is paused; resume it (ResumeSandbox) first", id)
}

// activityTimeout bounds asking a daemon for its last activity.
const activityTimeout = 5 * time.Second

// activityResample is how long a second look at a daemon's activity
// waits: a daemon dates its processes' CPU use at the sample that sees it
// rise, and the first sample of a process only measures it, so a sandbox
// with running processes and nothing newer than since is sampled again
// after this pause before it is called idle.
const activityResample = time.Second

// daemonActivity is the last activity sess's daemon saw, looking again
// once when it saw nothing after since but runs processes (ok false when
// it cannot say: a daemon without the call, an error, no answer in
// time).
func (m *Manager) daemonActivity(sess *compute.Session, since time.Time) (at time.Time, ok bool) {
	ctx, cancel := context.WithTimeout(m.base, activityTimeout)
	defer cancel()
	at, procs, err := sess.LastActivity(ctx)
	if err == nil && !at.After(since) && procs > 0 {
		t := time.NewTimer(activityResample)
		select {
		case <-t.C:
			at, procs, err = sess.LastActivity(ctx)
		case <-ctx.Done():
			t.Stop()
		}
	}
	if err != nil {
		m.log.Debug("asking a sandbox daemon for its last activity", zap.String("sandbox", sess.ID()), zap.Error(err))
		return time.Time{}, false
	}
	m.log.Debug("sandbox daemon activity", zap.String("sandbox", sess.ID()), zap.Time("last", at), zap.Int("processes", procs))
	return at.UTC(), true
}

// idleBox handles b's idle deadline (a tracked goroutine of its timer):
// active in its daemon's eyes, its idle clock moves on; idle, it is
// paused (OnIdlePause) or deleted.
func (m *Manager) idleBox(b *box) {
	m.mu.Lock()
	sess, last := b.sess, b.lastUsed
	if b.activity.After(last) {
		last = b.activity // what the daemon said last time
	}
	m.mu.Unlock()
	if sess != nil {
		if at, ok := m.daemonActivity(sess, last); ok && at.After(last) {
			m.mu.Lock()
			if at.After(b.activity) {
				b.activity = at
			}
			m.armBoxLocked(b)
			m.mu.Unlock()
			return
		}
	}
	m.mu.Lock()
	now := m.now()
	if b.gone || m.closing {
		m.mu.Unlock()
		return
	}
	if b.deadline(now).After(now) {
		m.armBoxLocked(b) // used meanwhile
		m.mu.Unlock()
		return
	}
	pause := b.rec.OnIdle == string(OnIdlePause)
	m.mu.Unlock()
	if !pause {
		_ = m.dropBox(b, "it was idle for its idle timeout")
		return
	}
	ctx, cancel := context.WithTimeout(m.base, 2*time.Minute)
	defer cancel()
	if _, err := m.pauseBox(ctx, b, true); err != nil {
		// Kept (its tenant asked for a pause, not a deletion): tried
		// again after another idle timeout, deleted at its ttl.
		m.log.Warn("pausing an idle API sandbox", zap.String("sandbox", b.id), zap.Error(err))
		m.mu.Lock()
		b.lastUsed = m.now()
		m.armBoxLocked(b)
		m.mu.Unlock()
	}
}

// PauseSandbox pauses a tenant's API sandbox (see above) and returns it,
// with whether the pause kept its memory and processes. Pausing a paused
// sandbox changes nothing (but a pause by its OnIdle policy becomes an
// explicit one: the next call no longer resumes it). A run's sandbox
// follows its run, and a sandbox a run was started in is not paused while
// the run is active: failed precondition.
func (m *Manager) PauseSandbox(ctx context.Context, tenant, id string) (*Sandbox, bool, error) {
	return m.onBox(ctx, tenant, id, "paused", func(ctx context.Context, b *box) (bool, error) {
		if run := m.usedBy(b); run != "" {
			return false, errUsedByRun(id, run, "paused")
		}
		return m.pauseBox(ctx, b, false)
	})
}

// ResumeSandbox resumes a tenant's paused API sandbox and returns it
// running, with whether its memory and processes came back. Resuming a
// running sandbox changes nothing.
func (m *Manager) ResumeSandbox(ctx context.Context, tenant, id string) (*Sandbox, bool, error) {
	return m.onBox(ctx, tenant, id, "resumed", func(ctx context.Context, b *box) (bool, error) {
		m.mu.Lock()
		b.busy++
		b.lastUsed = m.now()
		m.mu.Unlock()
		defer func() {
			m.mu.Lock()
			m.doneLocked(b)
			m.mu.Unlock()
		}()
		sess, err := m.attachBox(ctx, b)
		if err != nil {
			return false, err
		}
		return sess.Restored(), nil
	})
}

// onBox runs do on a tenant's API sandbox (see apiBox) and returns the
// sandbox as it is then, with do's answer.
func (m *Manager) onBox(ctx context.Context, tenant, id, what string, do func(context.Context, *box) (bool, error)) (*Sandbox, bool, error) {
	if err := m.enter(tenant); err != nil {
		return nil, false, err
	}
	defer m.leave()
	b, err := m.apiBox(ctx, tenant, id, what)
	if err != nil {
		return nil, false, err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	kept, err := do(ctx, b)
	if err != nil {
		return nil, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if b.gone {
		return nil, false, errNoSandbox
	}
	sb := b.view()
	return &sb, kept, nil
}

// apiBox returns a tenant's API sandbox for a call that only applies to
// those (what: "paused"): not found, or failed precondition for a run's.
func (m *Manager) apiBox(ctx context.Context, tenant, id, what string) (*box, error) {
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if b := m.tenantBox(tenant, id); b != nil {
		return b, nil
	}
	if _, err := m.GetSandbox(ctx, tenant, id); err != nil {
		return nil, err
	}
	return nil, failedPrecondition("sandbox %s is a run's: only sandboxes made with CreateSandbox can be %s", id, what)
}

// pauseBox pauses b and reports whether its memory was kept. byIdle is a
// pause by its OnIdle policy: given up (nil, false) when a call uses the
// sandbox meanwhile.
func (m *Manager) pauseBox(ctx context.Context, b *box, byIdle bool) (bool, error) {
	b.attach.Lock()
	defer b.attach.Unlock()
	m.mu.Lock()
	gone, rec, busy := b.gone, b.rec, b.busy
	m.mu.Unlock()
	switch {
	case gone:
		return false, errNoSandbox
	case rec.Paused && !byIdle && rec.ResumeOnCall:
		return rec.KeepMemory, m.updateBox(ctx, b, func(r *store.Sandbox) { r.ResumeOnCall = false })
	case rec.Paused:
		return rec.KeepMemory, nil
	case byIdle && busy > 0:
		return false, nil
	}
	sess, err := m.attachHeld(ctx, b)
	if err != nil {
		return false, err
	}
	kept := true
	_, err = sess.Pause(ctx)
	switch {
	case errors.Is(err, errkind.ErrUnimplemented):
		kept = false
		if err := m.pauseWorkspace(ctx, b, sess); err != nil {
			return false, err
		}
	case err != nil:
		return false, fmt.Errorf("pause sandbox %s: %w", b.id, err)
	}
	// The session is released either way: the next call reattaches from
	// the record.
	m.mu.Lock()
	b.sess = nil
	m.mu.Unlock()
	st, err := sess.State()
	if !kept {
		_ = sess.Release()
	}
	if err == nil {
		var data []byte
		if data, err = st.Encode(); err == nil {
			err = m.updateBox(ctx, b, func(r *store.Sandbox) {
				r.SessionState, r.Paused, r.KeepMemory, r.ResumeOnCall = data, true, kept, byIdle
			})
		}
	}
	if err != nil {
		return false, fmt.Errorf("pause sandbox %s: record its state: %w", b.id, err)
	}
	m.mu.Lock()
	m.armBoxLocked(b) // its ttl only, now
	m.mu.Unlock()
	m.log.Info("API sandbox paused", zap.String("sandbox", b.id), zap.Bool("keep_memory", kept), zap.Bool("idle", byIdle))
	return kept, nil
}

// pauseWorkspace pauses a sandbox whose provider cannot keep its memory:
// its workspace is persisted to the snapshot store, then it is shut down
// (the caller releases its session).
func (m *Manager) pauseWorkspace(ctx context.Context, b *box, sess *compute.Session) error {
	if _, err := m.snapshotStore(); err != nil {
		return fmt.Errorf("pause sandbox %s: its provider cannot keep its memory, and %w", b.id, err)
	}
	if err := sess.Stop(ctx); err != nil {
		return fmt.Errorf("pause sandbox %s: persist its workspace: %w", b.id, err)
	}
	if err := sess.Shutdown(ctx); err != nil {
		return fmt.Errorf("pause sandbox %s: stop it: %w", b.id, err)
	}
	return nil
}
