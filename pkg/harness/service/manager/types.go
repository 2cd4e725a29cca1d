package manager

import "time"

// RunSpec is how a run is asked for. Every field is untrusted input,
// checked like an untrusted manifest before anything is made. Its JSON form
// is what the store keeps (the field names of the wire's StartRunRequest
// in JSON, so records written by earlier versions read back).
type RunSpec struct {
	// Agent is the agent that runs.
	Agent AgentSpec `json:"agent,omitzero"`
	// Manifest is the sandbox's manifest (YAML or JSON), read by the rules
	// of untrusted documents: no host sources, grants, mounts or secret
	// references, no root, no fixed ids; "" is an empty workspace.
	Manifest string `json:"manifest,omitempty"`
	// Approvals are the tool calls that wait for a decision.
	Approvals ApprovalPolicy `json:"approvals,omitzero"`
	// Input is the task (required by StartRun; not used by
	// ResumeFromState, whose state holds the conversation).
	Input string `json:"input,omitempty"`
	// MaxTurns bounds the run (0: the manager's bound, which also caps it).
	MaxTurns int `json:"maxTurns,omitempty"`
	// Workdir is the workspace-relative directory the agent works in.
	Workdir string `json:"workdir,omitempty"`
	// Sandbox, when set, is an API sandbox of the tenant's (CreateSandbox)
	// the run works in as a caller-owned session: the run never deletes,
	// pauses or keeps it (see callerbox.go). Manifest and Agent.RunAs are
	// then empty.
	Sandbox string `json:"sandbox,omitempty"`
}

// AgentSpec is a run's agent.
type AgentSpec struct {
	// Name names the agent ("" is "agent").
	Name string `json:"name,omitempty"`
	// Instructions are its system prompt ("": the manager's default).
	Instructions string `json:"instructions,omitempty"`
	// Model is one of the model names the manager offers ("": its default).
	Model string `json:"model,omitempty"`
	// Capabilities are among filesystem, shell and compaction (none: the
	// harness's defaults).
	Capabilities []string `json:"capabilities,omitempty"`
	// RunAs is the sandbox account the agent works as: a user the manifest
	// declares, compute.DefaultRunAsName, or "" (the manifest's run_as, or
	// the sandbox's own account). Never root or a system account.
	RunAs string `json:"runAs,omitempty"`
}

// ApprovalPolicy names the tool calls that wait for a decision.
type ApprovalPolicy struct {
	// RequireApproval are tool names whose every call waits.
	RequireApproval []string `json:"requireApproval,omitempty"`
	// AllowedCommands are regular expressions: an exec_command whose
	// command matches none waits (none given: no command waits for that
	// reason).
	AllowedCommands []string `json:"allowedCommands,omitempty"`
}

// RunStatus is where a run is.
type RunStatus string

// Run statuses. A run the manager checkpointed to shut down shows as
// running.
const (
	StatusPending         RunStatus = "pending"
	StatusRunning         RunStatus = "running"
	StatusWaitingApproval RunStatus = "waiting_approval"
	StatusSucceeded       RunStatus = "succeeded"
	StatusFailed          RunStatus = "failed"
	StatusCanceled        RunStatus = "canceled"
)

// Run is a run as a tenant sees it.
type Run struct {
	ID     string
	Status RunStatus
	// Agent, Model and Input are from its spec (Model: the one it uses).
	Agent, Model, Input string
	Created, Updated    time.Time
	Turns               int
	Usage               Usage
	FinalOutput         string
	// Error is why it failed or was canceled.
	Error string
	// PendingApprovals are the calls waiting for a decision (waiting
	// runs only).
	PendingApprovals []PendingApproval
	// SandboxID is its sandbox while it has one ("" before, and once
	// deleted).
	SandboxID string
	// LastSequence is the sequence of its last stored event.
	LastSequence uint64
}

// Usage counts a run's model tokens.
type Usage struct {
	InputTokens, OutputTokens int64
}

// PendingApproval is a tool call waiting for a decision.
type PendingApproval struct {
	CallID, Tool, Input, Agent string
}

// Decision approves or rejects a pending call.
type Decision struct {
	CallID   string
	Approved bool
	// Reason is shown to the model with a rejection (and kept in the
	// event log either way).
	Reason string
}

// ListRunsOptions filter and page ListRuns.
type ListRunsOptions struct {
	// Status keeps the runs in one status ("": all).
	Status RunStatus
	// PageSize bounds the page: 0 to 500 (0: 50).
	PageSize int
	// PageToken continues from an earlier page's next token.
	PageToken string
}

// EventKind is what an Event says.
type EventKind string

// Event kinds (the names of the wire's RunEvent kinds and of SSE events).
const (
	EventTurnStarted       EventKind = "turn_started"
	EventModelText         EventKind = "model_text"
	EventModelReset        EventKind = "model_reset"
	EventToolCall          EventKind = "tool_call"
	EventToolOutput        EventKind = "tool_output"
	EventToolResult        EventKind = "tool_result"
	EventApprovalRequested EventKind = "approval_requested"
	EventApprovalDecided   EventKind = "approval_decided"
	EventRunFinished       EventKind = "run_finished"
	EventRunFailed         EventKind = "run_failed"
	EventRunCanceled       EventKind = "run_canceled"
	EventRunResumed        EventKind = "run_resumed"
)

// Event is one entry of a run's event log. Which fields are set depends on
// Kind, as each field says.
type Event struct {
	// Sequence numbers the run's events from 1, with no gap.
	Sequence uint64
	RunID    string
	// Time is when the manager got the event from the run.
	Time  time.Time
	Agent string
	Kind  EventKind
	// Turn: turn_started's turn; run_finished's turns.
	Turn int
	// Text: model_text's text; tool_result's output; run_finished's final
	// output; run_failed's error; run_canceled's and approval_decided's
	// reason; run_resumed's cause ("approved", "resume", "restart").
	Text string
	// CallID: tool_call, tool_output, tool_result, approval_requested,
	// approval_decided.
	CallID string
	// Tool: tool_call, tool_result, approval_requested.
	Tool string
	// Input: tool_call's and approval_requested's arguments.
	Input string
	// Output: tool_output's bytes (a process's output as it comes).
	Output []byte
	// IsError: tool_result.
	IsError bool
	// Approved: approval_decided.
	Approved bool
	// Usage: run_finished.
	Usage Usage
}

// SandboxStatus is whether a sandbox is held live.
type SandboxStatus string

// Sandbox statuses.
const (
	// SandboxRunning: the manager holds a live session of it.
	SandboxRunning SandboxStatus = "running"
	// SandboxStopped: it is not attached now (a run recovered after a
	// restart, a sandbox kept for a finished run of an earlier manager);
	// using it reattaches it.
	SandboxStopped SandboxStatus = "stopped"
	// SandboxPaused: an API sandbox paused (PauseSandbox, or by its
	// OnIdle policy): persisted and stopped until it is resumed.
	SandboxPaused SandboxStatus = "paused"
)

// OnIdle is what happens to an API sandbox once it was idle for its idle
// timeout.
type OnIdle string

// OnIdle policies.
const (
	// OnIdleDelete deletes it (the default, "").
	OnIdleDelete OnIdle = "delete"
	// OnIdlePause pauses it (PauseSandbox); its next call resumes it.
	OnIdlePause OnIdle = "pause"
)

// Sandbox is a tenant's sandbox: a run's, or one made with CreateSandbox
// (RunID "").
type Sandbox struct {
	ID, RunID, Provider string
	Status              SandboxStatus
	Created             time.Time
	// Expires is when the sandbox is deleted: a finished run's at the end
	// of its retention (zero while the run is active); an API sandbox's
	// at its ttl.
	Expires time.Time
	// Labels are an API sandbox's labels (a run's has none).
	Labels map[string]string
	// IdleTimeout deletes (or pauses, see OnIdle) an API sandbox once it
	// was idle this long.
	IdleTimeout time.Duration
	// OnIdle is an API sandbox's idle policy (OnIdleDelete or
	// OnIdlePause).
	OnIdle OnIdle
	// KeepMemory: a paused sandbox's pause kept its memory and processes.
	KeepMemory bool
}

// Snapshot is a tenant's named snapshot of a sandbox's workspace
// (SnapshotSandbox), to make sandboxes from
// (SandboxSpec.FromSnapshot).
type Snapshot struct {
	ID string
	// SandboxID is the sandbox it was taken of (maybe gone since).
	SandboxID string
	Created   time.Time
	// Size is the stored archive's size in bytes.
	Size int64
	// KeepMemory is false: snapshots hold the workspace only.
	KeepMemory bool
	Labels     map[string]string
}

// SandboxSpec is how a sandbox is asked for (CreateSandbox). Every field
// is untrusted input.
type SandboxSpec struct {
	// Manifest is the workspace's manifest (YAML or JSON), read by the
	// rules of untrusted documents exactly like RunSpec.Manifest; "" is
	// an empty workspace.
	Manifest string `json:"manifest,omitempty"`
	// TTL deletes the sandbox this long after it was made (0: the
	// policy's default; at most its maximum).
	TTL time.Duration `json:"-"`
	// IdleTimeout deletes it once no call used it this long (0: the
	// policy's default; at most its maximum).
	IdleTimeout time.Duration `json:"-"`
	// Labels find it again (ListSandboxesOptions.Labels): at most 32; keys
	// of 1 to 63 bytes of a-z, 0-9, '.', '_', '-', '/', starting and ending
	// with a letter or digit; values at most 256 bytes of text.
	Labels map[string]string `json:"-"`
	// FromSnapshot starts the sandbox from one of the tenant's snapshots
	// (its workspace and its manifest; Manifest must then be "").
	FromSnapshot string `json:"-"`
	// OnIdle is what happens once it is idle ("": OnIdleDelete).
	OnIdle OnIdle `json:"-"`
}

// ListSandboxesOptions filter and page ListSandboxes.
type ListSandboxesOptions struct {
	// RunID keeps that run's sandbox only (not found when the tenant has
	// no such run); "" keeps every sandbox.
	RunID string
	// Labels keeps the sandboxes carrying every one of these labels (a
	// run's sandbox carries none).
	Labels map[string]string
	// Status keeps the sandboxes in one status ("": all).
	Status SandboxStatus
	// PageSize bounds the page: 0 to 500 (0: 50).
	PageSize int
	// PageToken continues from an earlier page's next token.
	PageToken string
}

// CommandSpec is a command to run in a sandbox. Every field is untrusted
// input.
type CommandSpec struct {
	// Command is a shell command line (`/bin/sh -c Command`); Argv a
	// program and its arguments. Exactly one is set.
	Command string
	Argv    []string
	// Cwd is the workspace-relative working directory ("": the root).
	Cwd string
	// Env is set on top of the sandbox's clean defaults.
	Env map[string]string
	// User is the sandbox account: a user the sandbox's manifest declares,
	// or "" for its run_as account; never root or a system account.
	User string
	// Stdin is written to the process's stdin, which is then closed
	// (RunCommand, Exec).
	Stdin []byte
	// KeepStdin keeps a stdin pipe open for WriteStdin (StartProcess).
	KeepStdin bool
	// Timeout kills the process after this long (0: the policy's
	// default; at most its maximum).
	Timeout time.Duration
}

// OutputStream is where output came from.
type OutputStream string

// Output streams.
const (
	Stdout OutputStream = "stdout"
	Stderr OutputStream = "stderr"
)

// OutputChunk is a piece of a process's output.
type OutputChunk struct {
	Stream OutputStream
	Data   []byte
}

// ProcessExit is how a process ended.
type ProcessExit struct {
	// ExitCode is 128+N when signal N killed the process.
	ExitCode int
	Signal   string
	// TimedOut is set when its timeout killed it.
	TimedOut bool
	// Dropped counts output bytes the sandbox's bounded buffer dropped.
	Dropped int64
	At      time.Time
}

// CommandResult is what RunCommand's command printed and how it ended.
type CommandResult struct {
	// Stdout and Stderr are the output, each up to the policy's cap (cut
	// at a UTF-8 character's boundary when the rest is UTF-8).
	Stdout, Stderr []byte
	Exit           ProcessExit
	// Dropped counts the bytes not returned: past the caps, or dropped
	// by the sandbox's buffer.
	Dropped int64
}

// ExecEvent is one event of Exec: the start (ProcessID), output, the exit.
type ExecEvent struct {
	// ProcessID is set in the first event only.
	ProcessID string
	Output    []OutputChunk
	// Exit is set in the last event only.
	Exit *ProcessExit
}

// Process is a process of a sandbox.
type Process struct {
	ID      string
	Argv    []string
	Cwd     string
	User    string
	Running bool
	Started time.Time
	// Exit is set once it exited.
	Exit *ProcessExit
}

// ProcessOutput is a batch of a started process's output.
type ProcessOutput struct {
	Output     []OutputChunk
	NextCursor int64
	// Dropped bytes lie between the cursor and the oldest byte buffered.
	Dropped int64
	// Exit is set once the process exited and all its output was read.
	Exit *ProcessExit
}

// WriteFileOptions tune WriteFile.
type WriteFileOptions struct {
	// Mode is a new file's permission bits (0: 0644; at most 0777).
	Mode uint32
	// CreateParents makes missing parent directories.
	CreateParents bool
}

// PatchChange is one operation a patch applied.
type PatchChange struct {
	// Kind is created, updated, moved or deleted.
	Kind string
	// Path is as the patch wrote it; NewPath where a moved file went.
	Path, NewPath string
}

// PatchRejection says why a patch did not apply.
type PatchRejection struct {
	Path, Message string
	ExpectedLines []string
	// ClosestLine is the 1-based first line of the closest region (0:
	// none); ClosestLines that region.
	ClosestLine  int
	ClosestLines []string
}

// PatchResult is what ApplyPatch changed, or (nothing changed) why not.
type PatchResult struct {
	Changes   []PatchChange
	Rejection *PatchRejection
}

// FileType is the type of a file in a sandbox.
type FileType string

// File types.
const (
	FileRegular   FileType = "file"
	FileDirectory FileType = "directory"
	FileSymlink   FileType = "symlink"
	FileOther     FileType = "other"
)

// FileEntry is one entry of a sandbox directory.
type FileEntry struct {
	// Name is the entry's name; Path its workspace-relative path.
	Name, Path string
	Type       FileType
	Size       int64
	Mode       uint32
	Modified   time.Time
}

// FileInfo describes a sandbox file about to be downloaded.
type FileInfo struct {
	// Path is the workspace-relative path, cleaned.
	Path string
	Size int64
}

// TerminalOptions start a terminal.
type TerminalOptions struct {
	// Command is the argv (none: the sandbox account's login shell).
	Command []string
	// Cols and Rows size it (at least 20x5; at most 1000 each).
	Cols, Rows uint32
}

// TerminalSize resizes a terminal.
type TerminalSize struct {
	Cols, Rows uint32
}

// TerminalExit is how a terminal's process ended.
type TerminalExit struct {
	ExitCode int32
	Signal   string
}

// TerminalIO is the client's side of a terminal.
type TerminalIO struct {
	// Recv returns the next stdin bytes or resize (io.EOF when the client
	// closed its side). It is called from one goroutine.
	Recv func() (stdin []byte, resize *TerminalSize, err error)
	// Output and Exited send to the client (never at once).
	Output func([]byte) error
	Exited func(TerminalExit) error
	// StopInput, when set, makes a blocked Recv return (after the exit,
	// or when the manager shuts down).
	StopInput func()
}
