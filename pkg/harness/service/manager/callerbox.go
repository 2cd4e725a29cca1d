package manager

import (
	"context"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Runs in a caller's sandbox (RunSpec.Sandbox: StartRunRequest.sandbox_id).
// Such a run works in an API sandbox of its tenant's as a caller-owned
// session, the ownership rule of the Agents SDK's runtime boundary: the
// run never deletes, pauses, checkpoints or keeps the sandbox, whether it
// succeeds, fails, is canceled or is cut by a restart, and its record holds
// no sandbox state of its own (store.Run.SandboxID and SessionState stay
// empty, so neither retention nor recovery ever reaps it; the spec names
// the sandbox, and the run's view shows it). The run takes no sandbox slot:
// the sandbox holds its own.
//
// One run at a time per sandbox: an active run claims its sandbox
// (box.run) from its start, its resumption or its recovery until it ends
// (forget). While claimed, the sandbox is busy (no idle deadline), and
// DeleteSandbox and PauseSandbox refuse it; its ttl stands, and a sandbox
// deleted at its ttl under a run fails the run's next sandbox call.

// claimBoxLocked makes tenant's API sandbox id the sandbox of run runID
// (m.mu held): not found for another tenant's, a deleted or an unknown
// one; failed precondition for one another run uses, or one paused by a
// client (a pause by its OnIdle policy is undone by the run's first use).
// Claiming a sandbox the run holds already changes nothing.
func (m *Manager) claimBoxLocked(tenant, id, runID string) (*box, error) {
	b := m.api.boxes[id]
	switch {
	case b == nil || b.tenant != tenant || b.gone:
		return nil, errNoSandbox
	case b.run == runID:
		return b, nil
	case b.run != "":
		return nil, failedPrecondition("sandbox %s is used by run %s; one run at a time per sandbox (wait for it to end, or cancel it)", id, b.run)
	case b.rec.Paused && !b.rec.ResumeOnCall:
		return nil, errPaused(id)
	}
	b.run = runID
	b.busy++
	b.lastUsed = m.now()
	return b, nil
}

// unclaimLocked ends run runID's claim of b, if it holds it (m.mu held):
// the sandbox's idle clock starts again. Nothing else happens to it.
func (m *Manager) unclaimLocked(b *box, runID string) {
	if b == nil || b.run != runID {
		return
	}
	b.run = ""
	m.doneLocked(b)
}

// usedBy is the active run using b ("" for none).
func (m *Manager) usedBy(b *box) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return b.run
}

// errUsedByRun answers the calls a sandbox refuses while a run uses it.
func errUsedByRun(id, runID, what string) error {
	return failedPrecondition("sandbox %s is used by run %s, which is active; it cannot be %s until the run ends (cancel the run first)", id, runID, what)
}

// claimedSession returns the live session of the caller's sandbox run
// runID claimed (reattached, or resumed after a pause by its OnIdle
// policy, if need be). The session stays the sandbox's: the run's end
// leaves it as it is.
func (m *Manager) claimedSession(ctx context.Context, tenant, runID, id string) (*compute.Session, error) {
	m.mu.Lock()
	b := m.api.boxes[id]
	ok := b != nil && b.tenant == tenant && !b.gone && b.run == runID
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("the run's sandbox %s is gone: %w", id, errNoSandbox)
	}
	return m.attachBox(ctx, b)
}
