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
)

// Sandbox is a run's sandbox.
type Sandbox struct {
	ID, RunID, Provider string
	Status              SandboxStatus
	Created             time.Time
	// Expires is when a finished run's sandbox is deleted (zero: while
	// the run is active).
	Expires time.Time
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
