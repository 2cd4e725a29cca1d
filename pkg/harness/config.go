package harness

import (
	"context"
	"errors"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// DefaultMaxTurns bounds a run when RunConfig.MaxTurns is zero.
const DefaultMaxTurns = 10

// RunConfig configures one run.
type RunConfig struct {
	// MaxTurns bounds the model calls of the run (0: DefaultMaxTurns).
	MaxTurns int
	// Sandbox gives the run a sandbox session; nil runs without one (only
	// the agent's own tools).
	Sandbox *SandboxConfig
	// ConversationID, when set, identifies the conversation in traces
	// (gen_ai.conversation.id on the run's and model calls' spans): the
	// service's run id, say. It must not be a secret.
	ConversationID string
	// Observer, when set, is told how the run goes: its start and end,
	// every model request and tool call (for metrics; see RunObserver).
	Observer RunObserver
}

// SandboxConfig says where a run's sandbox session comes from. The runner
// resolves it in this order: an injected live Session (owned by the
// caller: never stopped or deleted by the runner), then a SessionState to
// resume, then a fresh session from Manifest or the agent's
// DefaultManifest, seeded from SnapshotID when that snapshot exists. A
// resumed or fresh session is owned by the runner, which cleans it up at
// the end of the run (pre-stop hooks, persist, shut down, delete) even
// when the run fails or is cancelled.
type SandboxConfig struct {
	// Client creates and resumes sessions (required unless Session is set).
	Client *compute.Client
	// Session is a live, started session the caller owns.
	Session *compute.Session
	// SessionState is a session to resume (runner-owned once resumed).
	SessionState *compute.State
	// TrustedManifest rebinds host sources and grants when a resumed
	// session must be rebuilt from its redacted state.
	TrustedManifest *manifest.Manifest
	// Manifest overrides the agent's DefaultManifest for a fresh session.
	Manifest *manifest.Manifest
	// SnapshotID seeds a fresh session from (and persists it to) this
	// snapshot; "" means the session's id.
	SnapshotID string
	// ProviderOptions are passed to the provider for a fresh session.
	ProviderOptions any
	// Limits bound materialization concurrency and snapshot restores of
	// the sessions the runner creates or resumes.
	Limits compute.Limits
	// RunAs, when set, overrides the agents' RunAs in this run.
	RunAs string
	// Workdir is the run's working directory, relative to the workspace
	// root; tools resolve the model's relative paths against it.
	Workdir string
	// OnSession, when set, is called with the resolved session before the
	// first turn (to register pre-stop hooks, export files, ...).
	OnSession func(ctx context.Context, s *compute.Session) error
	// KeepSession leaves a runner-owned session running (persisted and
	// released, not shut down or deleted), for a caller that resumes it
	// later from Result.SessionState.
	KeepSession bool
}

// Errors of runs.
var (
	// ErrMaxTurns: the run used its turns without a final output.
	ErrMaxTurns = errors.New("maximum turns exceeded")
	// ErrAgentInUse: the agent value is already running in another run.
	ErrAgentInUse = errors.New("agent is already running in another run")
	// ErrNoSandboxClient: a fresh session is needed but no client is set.
	ErrNoSandboxClient = errors.New("sandbox session needs a compute client")
)
