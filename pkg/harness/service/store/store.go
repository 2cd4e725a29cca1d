// Package store persists the runs of `harness serve`: each run's record
// (tenant, status, spec, RunState, sandbox session state) and its event log,
// and the sandboxes tenants make through the API (SandboxService's
// CreateSandbox), which belong to no run: a record of their own kind
// (Sandbox), so a restarted service finds them again.
// Two implementations satisfy the one Store interface and pass the same
// conformance suite (storetest): bolt (bbolt, the default: pure Go, one file,
// no server) and postgres (pgx, for several replicas or an operated database).
//
// A store is tenant-aware: reading a run or a sandbox through another tenant
// answers ErrNotFound, the same as one that does not exist, so callers
// cannot tell one from the other.
package store

import (
	"context"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Errors of stores, each of an errkind class (errors.Is(err,
// errkind.ErrNotFound) holds for ErrNotFound).
var (
	// ErrNotFound: no run with that id for that tenant.
	ErrNotFound error = &classified{msg: "run not found", kind: errkind.ErrNotFound}
	// ErrExists: a run with that id already exists.
	ErrExists error = &classified{msg: "run already exists", kind: errkind.ErrAlreadyExists}
	// ErrSequence: an appended event does not follow the log's last one.
	ErrSequence error = &classified{msg: "event sequence out of order", kind: errkind.ErrConflict}
)

// classified is a sentinel of an errkind class.
type classified struct {
	msg  string
	kind error
}

func (e *classified) Error() string { return e.msg }
func (e *classified) Unwrap() error { return e.kind }

// Run is the stored record of one run. Spec, RunState and SessionState are
// opaque JSON the service writes; none holds a credential.
type Run struct {
	ID      string    `json:"id"`
	Tenant  string    `json:"tenant"`
	Status  string    `json:"status"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// Spec is how the run was asked for (agent, manifest, approvals, input).
	Spec []byte `json:"spec,omitempty"`
	// RunState is the harness RunState of a stopped run (approvals,
	// checkpoint), nil while none was saved.
	RunState []byte `json:"run_state,omitempty"`
	// SessionState is the compute.State of the run's sandbox.
	SessionState []byte `json:"session_state,omitempty"`
	// SandboxID is the sandbox session's id ("" before it is made).
	SandboxID string `json:"sandbox_id,omitempty"`
	// Provider made the sandbox.
	Provider string `json:"provider,omitempty"`
	// SandboxExpires is when a finished run's sandbox is deleted (zero:
	// none, or not yet).
	SandboxExpires time.Time `json:"sandbox_expires,omitzero"`
	// SandboxGone is set once the sandbox was deleted.
	SandboxGone bool `json:"sandbox_gone,omitempty"`
	// Ports are the sandbox's exposed ports (see Port).
	Ports []Port `json:"ports,omitempty"`
	// Checkpoint lists the pending call ids the service itself stopped
	// (graceful shutdown) and approves on resume.
	Checkpoint []string `json:"checkpoint,omitempty"`
	// Result fields.
	FinalOutput  string `json:"final_output,omitempty"`
	Error        string `json:"error,omitempty"`
	Turns        int    `json:"turns,omitempty"`
	InputTokens  int64  `json:"input_tokens,omitempty"`
	OutputTokens int64  `json:"output_tokens,omitempty"`
}

// Sandbox is the stored record of a sandbox made through the API (not a
// run's: those are kept on their Run). Spec and SessionState are opaque
// JSON the service writes; none holds a credential.
type Sandbox struct {
	ID      string    `json:"id"`
	Tenant  string    `json:"tenant"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// Spec is how the sandbox was asked for (its manifest).
	Spec []byte `json:"spec,omitempty"`
	// Labels are the tenant's labels.
	Labels map[string]string `json:"labels,omitempty"`
	// SessionState is the compute.State of the sandbox (nil until it is
	// made).
	SessionState []byte `json:"session_state,omitempty"`
	// Provider made the sandbox.
	Provider string `json:"provider,omitempty"`
	// Expires is when the sandbox is deleted (its ttl).
	Expires time.Time `json:"expires,omitzero"`
	// IdleTimeout deletes the sandbox once unused this long (zero: never).
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	// Gone is set once the sandbox was deleted.
	Gone bool `json:"gone,omitempty"`
	// Ports are the sandbox's exposed ports (see Port).
	Ports []Port `json:"ports,omitempty"`
	// OnIdle is what happens once it is idle: "" (deleted) or "pause".
	OnIdle string `json:"on_idle,omitempty"`
	// Paused is set while the sandbox is paused (SessionState is then
	// the paused session's); KeepMemory says the pause kept its memory
	// and processes, ResumeOnCall that its next call resumes it (paused
	// by its on_idle policy).
	Paused       bool `json:"paused,omitempty"`
	KeepMemory   bool `json:"keep_memory,omitempty"`
	ResumeOnCall bool `json:"resume_on_call,omitempty"`

	// Kind is KindSnapshot for a named snapshot of a sandbox's workspace
	// (SnapshotSandbox), kept as a record of this kind so that every
	// store keeps it with no schema of its own: it has no session state
	// and no deadline, Source names the sandbox it was taken of, Size is
	// its archive's size, and it is Gone once deleted. "" is a sandbox.
	Kind   string `json:"kind,omitempty"`
	Source string `json:"source,omitempty"`
	Size   int64  `json:"size,omitempty"`
}

// KindSnapshot is the Kind of a named snapshot's record.
const KindSnapshot = "snapshot"

// Port is an exposed port of a sandbox (its preview URL), kept with the
// sandbox's record so a restarted service with the same preview key
// honours the URL until it expires. The URL's token is not stored: it is
// Nonce with an HMAC under the service's key, which no store holds.
type Port struct {
	Port  int    `json:"port"`
	Nonce []byte `json:"nonce"`
	// KeyID names the key the token was signed with (a URL made under
	// another key is not taken back).
	KeyID   []byte    `json:"key_id"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// Event is one stored event of a run's log.
type Event struct {
	Seq  uint64
	Data []byte
}

// ListOptions filter and page ListRuns.
type ListOptions struct {
	// Status keeps only runs in this status ("" for all).
	Status string
	// Limit bounds the page (0: 50).
	Limit int
	// After is the cursor of the previous page's last run ("" for the first).
	After string
}

// Store keeps runs and their events. Implementations are safe for
// concurrent use.
type Store interface {
	// CreateRun stores a new run (ErrExists when its id is taken).
	CreateRun(ctx context.Context, r *Run) error
	// UpdateRun replaces a run's record (ErrNotFound when absent).
	UpdateRun(ctx context.Context, r *Run) error
	// GetRun returns a tenant's run (ErrNotFound for another tenant's).
	GetRun(ctx context.Context, tenant, id string) (*Run, error)
	// ListRuns returns a tenant's runs newest first, and the cursor of the
	// next page ("" on the last).
	ListRuns(ctx context.Context, tenant string, opts ListOptions) ([]*Run, string, error)
	// SandboxRuns returns a tenant's runs that hold a sandbox (SandboxID
	// set, SandboxGone false), newest first, through an index: listing
	// sandboxes does not read the tenant's other runs.
	SandboxRuns(ctx context.Context, tenant string) ([]*Run, error)
	// HeldSandboxes returns every tenant's runs that hold a sandbox (as
	// SandboxRuns does one tenant's), through the same index: a starting
	// service takes back the sandboxes it kept for finished runs without
	// reading every record.
	HeldSandboxes(ctx context.Context) ([]*Run, error)
	// ActiveRuns returns every tenant's runs whose status is one of these
	// (recovery after a restart, sandbox expiry).
	ActiveRuns(ctx context.Context, statuses ...string) ([]*Run, error)
	// AppendEvents appends events to a run's log; the first must follow the
	// log's last sequence by one (ErrSequence otherwise).
	AppendEvents(ctx context.Context, runID string, evs []Event) error
	// Events returns up to limit events with a sequence above after.
	Events(ctx context.Context, runID string, after uint64, limit int) ([]Event, error)
	// LastSequence is the sequence of the run's last event (0: none).
	LastSequence(ctx context.Context, runID string) (uint64, error)

	// CreateSandbox stores a new API sandbox (ErrExists when its id is
	// taken).
	CreateSandbox(ctx context.Context, sb *Sandbox) error
	// UpdateSandbox replaces an API sandbox's record (ErrNotFound when
	// absent; its tenant and creation time cannot change).
	UpdateSandbox(ctx context.Context, sb *Sandbox) error
	// GetSandbox returns a tenant's API sandbox, gone or not (ErrNotFound
	// for another tenant's).
	GetSandbox(ctx context.Context, tenant, id string) (*Sandbox, error)
	// LiveSandboxes returns every tenant's API sandboxes (and named
	// snapshots, Kind KindSnapshot) that are not gone, through an index
	// (gone ones are not read): a starting service takes them back.
	LiveSandboxes(ctx context.Context) ([]*Sandbox, error)
	// Close releases the store.
	Close() error
}

// DefaultLimit is the page size when ListOptions.Limit is zero.
const DefaultLimit = 50

// HoldsSandbox reports whether a run is one SandboxRuns returns.
func (r *Run) HoldsSandbox() bool { return r.SandboxID != "" && !r.SandboxGone }
