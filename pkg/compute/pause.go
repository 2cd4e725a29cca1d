package compute

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"
)

// Pausing a live sandbox with its memory and processes: Session.Pause
// persists the workspace, then has the provider save the whole sandbox (a
// checkpoint: every process, its memory, open files and output) and stop
// it, releasing its CPU and memory; Client.Resume of the paused session
// restores it, processes running on from where they were. Only providers
// that can checkpoint implement Pauser (local with gVisor isolation);
// the others refuse with ErrUnimplemented, saying what they would need,
// and keep only the workspace (Stop, Close, Resume from the snapshot).

// Pauser is implemented by providers that can pause a sandbox with its
// memory and processes. Their Reattach restores a paused sandbox (and
// its Sandbox then implements RestoredSandbox), unless the LaunchSpec
// says DiscardMemory, when it returns ErrNotFound so that the sandbox is
// rebuilt from its workspace.
type Pauser interface {
	// Pause checks all it can, calls spec.Persist, then checkpoints the
	// sandbox and stops it. An error wrapping ErrUnimplemented means this
	// sandbox cannot be paused (nothing was touched). On any other error
	// the sandbox runs on (reconnected) when it can; when the failed
	// checkpoint ended it, the error says so, and the session resumes
	// from its workspace (Client.Resume launches a replacement).
	Pause(ctx context.Context, sb Sandbox, spec PauseSpec) (*PauseInfo, error)
}

// PauseSpec is what a Pauser needs from the session.
type PauseSpec struct {
	// SessionID names the session.
	SessionID string
	// Persist persists the workspace (the session's snapshot, as Stop
	// does). The provider calls it once its own checks passed and before
	// it touches the sandbox, so that a failed checkpoint never loses the
	// files.
	Persist func(ctx context.Context) error
}

// PauseInfo describes a pause.
type PauseInfo struct {
	// Checkpoint is where the sandbox's image is (local: a directory in
	// the sandbox's private directory).
	Checkpoint string
	// Bytes is the size of the image.
	Bytes int64
	// Persisted is how long persisting the workspace took.
	Persisted time.Duration
	// Checkpointed is how long the checkpoint itself took.
	Checkpointed time.Duration
}

// RestoredSandbox is implemented by a Sandbox a provider's Reattach may
// have restored from a pause.
type RestoredSandbox interface {
	// Restored reports whether the sandbox was restored from a pause
	// (rather than found running).
	Restored() bool
}

// DiscardMemory makes Resume rebuild a paused sandbox from its workspace
// (the files kept on the host, or the snapshot Pause persisted) instead
// of restoring its memory and processes: the way back when a restore
// fails. The checkpoint is deleted once the replacement runs.
func DiscardMemory() ResumeOption {
	return func(o *resumeOptions) { o.discardMemory = true }
}

// OpPause is Session.Pause, reported to an Observer.
const OpPause = "pause"

// Pause pauses the session's sandbox with its memory and processes (see
// Pauser): the workspace is persisted first (as Stop does), then the
// provider checkpoints the sandbox and stops it. The session is released
// (as by Release): resume it from its State, which says it is paused,
// with Client.Resume, which restores it; Client.Delete discards it.
// Calls in flight when the sandbox stops end with an error (its processes
// do not: Follow again from the cursor after the resume). A provider that
// cannot pause returns an ErrUnimplemented error, and the session goes on
// untouched.
func (s *Session) Pause(ctx context.Context) (_ *PauseInfo, err error) {
	ctx, span := s.startSpan(ctx, "session.pause")
	defer func(start time.Time) { endSpan(span, err); s.c.observe(OpPause, start, err) }(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: session %s is closed", ErrFailedPrecondition, s.id)
	}
	p, ok := s.c.p.(Pauser)
	if !ok {
		return nil, fmt.Errorf("%w: pause session %s: the %s provider cannot pause a sandbox with its memory and processes "+
			"(Stop persists the workspace; Close shuts the sandbox down)", ErrUnimplemented, s.id, s.c.p.Name())
	}
	info, err := p.Pause(ctx, s.sb, PauseSpec{SessionID: s.id, Persist: s.stop})
	if err != nil {
		return nil, fmt.Errorf("pause session %s: %w", s.id, err)
	}
	s.paused, s.closed = true, true
	_ = s.sb.Close()
	span.SetAttributes(attribute.Int64("bulkhead.checkpoint.bytes", info.Bytes))
	s.c.log.Info("sandbox paused", zap.String("session", s.id), zap.Int64("bytes", info.Bytes),
		zap.Duration("persisted", info.Persisted), zap.Duration("checkpointed", info.Checkpointed))
	return info, nil
}

// Restored reports whether Client.Resume restored this session's sandbox
// from a pause (its processes and memory as they were).
func (s *Session) Restored() bool { return s.restored }

// DeleteState deletes the sandbox a state describes without reattaching
// to it first, as Delete does for a session: a paused sandbox is not
// restored only to be deleted. The snapshot stays in the store.
func (c *Client) DeleteState(ctx context.Context, st *State) (err error) {
	if st == nil {
		return fmt.Errorf("%w: nil session state", ErrInvalidArgument)
	}
	if st.Provider != c.p.Name() {
		return fmt.Errorf("%w: session %s belongs to provider %q, not %q", ErrInvalidArgument, st.SessionID, st.Provider, c.p.Name())
	}
	ctx, span := c.startSpan(ctx, "compute.delete", attribute.String(attrSessionID, st.SessionID))
	defer func(start time.Time) { endSpan(span, err); c.observe(OpDelete, start, err) }(time.Now())
	if err := c.p.Destroy(ctx, st.ProviderState); err != nil {
		return fmt.Errorf("delete session %s: %w", st.SessionID, err)
	}
	c.log.Info("sandbox deleted", zap.String("session", st.SessionID))
	return nil
}
