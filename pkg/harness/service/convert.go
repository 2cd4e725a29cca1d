package service

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// The one place that knows both the wire (proto/bulkhead/harness/v1) and
// the run manager's Go types: every handler converts its request here,
// calls the manager, and converts the answer back. Nothing is checked
// here but the wire's own shape (an enum value the contract does not
// have); the manager checks every field.

// invalid is bad input in a field of the wire's shape.
func invalid(field, format string, a ...any) error {
	return &manager.FieldError{Field: field, Err: fmt.Errorf(format, a...)}
}

func agentSpecOf(a *harnessv1.AgentSpec) manager.AgentSpec {
	return manager.AgentSpec{Name: a.GetName(), Instructions: a.GetInstructions(), Model: a.GetModel(),
		Capabilities: a.GetCapabilities(), RunAs: a.GetRunAs()}
}

func approvalsOf(p *harnessv1.ApprovalPolicy) manager.ApprovalPolicy {
	return manager.ApprovalPolicy{RequireApproval: p.GetRequireApproval(), AllowedCommands: p.GetAllowedCommands()}
}

// runSpecOf is a StartRunRequest's spec.
func runSpecOf(r *harnessv1.StartRunRequest) manager.RunSpec {
	return manager.RunSpec{Agent: agentSpecOf(r.GetAgent()), Manifest: r.GetManifest(), Approvals: approvalsOf(r.GetApprovals()),
		Input: r.GetInput(), MaxTurns: int(r.GetMaxTurns()), Workdir: r.GetWorkdir(), Sandbox: r.GetSandboxId()}
}

// resumeSpecOf is the spec of a ResumeRunRequest with a run state.
func resumeSpecOf(r *harnessv1.ResumeRunRequest) manager.RunSpec {
	return manager.RunSpec{Agent: agentSpecOf(r.GetAgent()), Manifest: r.GetManifest(), Approvals: approvalsOf(r.GetApprovals()),
		MaxTurns: int(r.GetMaxTurns())}
}

// runStatusOf is a RunStatus filter ("" for unspecified).
func runStatusOf(st harnessv1.RunStatus) (manager.RunStatus, error) {
	if st == harnessv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		return "", nil
	}
	name, known := harnessv1.RunStatus_name[int32(st)]
	if !known {
		return "", invalid("status", "unknown run status %d", st)
	}
	return manager.RunStatus(strings.ToLower(strings.TrimPrefix(name, "RUN_STATUS_"))), nil
}

func listRunsOptionsOf(r *harnessv1.ListRunsRequest) (manager.ListRunsOptions, error) {
	st, err := runStatusOf(r.GetStatus())
	if err != nil {
		return manager.ListRunsOptions{}, err
	}
	return manager.ListRunsOptions{Status: st, PageSize: int(r.GetPageSize()), PageToken: r.GetPageToken()}, nil
}

func runStatusProto(s manager.RunStatus) harnessv1.RunStatus {
	return harnessv1.RunStatus(harnessv1.RunStatus_value["RUN_STATUS_"+strings.ToUpper(string(s))])
}

// timeProto is t on the wire (nil for the zero time).
func timeProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func pendingProto(p manager.PendingApproval) *harnessv1.PendingApproval {
	return &harnessv1.PendingApproval{CallId: p.CallID, Tool: p.Tool, Input: p.Input, Agent: p.Agent}
}

// runProto is a run on the wire.
func runProto(r *manager.Run) *harnessv1.Run {
	out := &harnessv1.Run{RunId: r.ID, Status: runStatusProto(r.Status), Agent: r.Agent, Model: r.Model, Input: r.Input,
		CreateTime: timestamppb.New(r.Created), UpdateTime: timestamppb.New(r.Updated), Turns: int32(r.Turns),
		Usage:       &harnessv1.Usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens},
		FinalOutput: r.FinalOutput, Error: r.Error, SandboxId: r.SandboxID, LastSequence: r.LastSequence}
	for _, p := range r.PendingApprovals {
		out.PendingApprovals = append(out.PendingApprovals, pendingProto(p))
	}
	return out
}

// eventProto is an event on the wire.
func eventProto(ev manager.Event) *harnessv1.RunEvent {
	out := &harnessv1.RunEvent{Sequence: ev.Sequence, RunId: ev.RunID, Time: timestamppb.New(ev.Time), Agent: ev.Agent}
	switch ev.Kind {
	case manager.EventTurnStarted:
		out.Kind = &harnessv1.RunEvent_TurnStarted{TurnStarted: &harnessv1.TurnStarted{Turn: int32(ev.Turn)}}
	case manager.EventModelText:
		out.Kind = &harnessv1.RunEvent_ModelText{ModelText: &harnessv1.ModelText{Text: ev.Text}}
	case manager.EventModelReset:
		out.Kind = &harnessv1.RunEvent_ModelReset{ModelReset: &harnessv1.ModelReset{}}
	case manager.EventToolCall:
		out.Kind = &harnessv1.RunEvent_ToolCall{ToolCall: &harnessv1.ToolCall{CallId: ev.CallID, Tool: ev.Tool, Input: ev.Input}}
	case manager.EventToolOutput:
		out.Kind = &harnessv1.RunEvent_ToolOutput{ToolOutput: &harnessv1.ToolOutput{CallId: ev.CallID, Output: ev.Output}}
	case manager.EventToolResult:
		out.Kind = &harnessv1.RunEvent_ToolResult{ToolResult: &harnessv1.ToolResult{CallId: ev.CallID, Tool: ev.Tool,
			Output: ev.Text, IsError: ev.IsError}}
	case manager.EventApprovalRequested:
		out.Kind = &harnessv1.RunEvent_ApprovalRequested{ApprovalRequested: &harnessv1.ApprovalRequested{Call: &harnessv1.PendingApproval{
			CallId: ev.CallID, Tool: ev.Tool, Input: ev.Input, Agent: ev.Agent}}}
	case manager.EventApprovalDecided:
		out.Kind = &harnessv1.RunEvent_ApprovalDecided{ApprovalDecided: &harnessv1.ApprovalDecided{CallId: ev.CallID,
			Approved: ev.Approved, Reason: ev.Text}}
	case manager.EventRunFinished:
		out.Kind = &harnessv1.RunEvent_RunFinished{RunFinished: &harnessv1.RunFinished{FinalOutput: ev.Text, Turns: int32(ev.Turn),
			Usage: &harnessv1.Usage{InputTokens: ev.Usage.InputTokens, OutputTokens: ev.Usage.OutputTokens}}}
	case manager.EventRunFailed:
		out.Kind = &harnessv1.RunEvent_RunFailed{RunFailed: &harnessv1.RunFailed{Error: ev.Text}}
	case manager.EventRunCanceled:
		out.Kind = &harnessv1.RunEvent_RunCanceled{RunCanceled: &harnessv1.RunCanceled{Reason: ev.Text}}
	case manager.EventRunResumed:
		out.Kind = &harnessv1.RunEvent_RunResumed{RunResumed: &harnessv1.RunResumed{Cause: ev.Text}}
	}
	return out
}

// decisionOf is an ApproveToolCallRequest's decision.
func decisionOf(r *harnessv1.ApproveToolCallRequest) manager.Decision {
	return manager.Decision{CallID: r.GetCallId(), Approved: r.GetApproved(), Reason: r.GetReason()}
}

func sandboxProto(sb manager.Sandbox) *harnessv1.Sandbox {
	out := &harnessv1.Sandbox{SandboxId: sb.ID, RunId: sb.RunID, Provider: sb.Provider, CreateTime: timestamppb.New(sb.Created),
		Status: harnessv1.SandboxStatus_SANDBOX_STATUS_STOPPED, ExpireTime: timeProto(sb.Expires), Labels: sb.Labels}
	switch sb.Status {
	case manager.SandboxRunning:
		out.Status = harnessv1.SandboxStatus_SANDBOX_STATUS_RUNNING
	case manager.SandboxPaused:
		out.Status, out.KeepMemory = harnessv1.SandboxStatus_SANDBOX_STATUS_PAUSED, sb.KeepMemory
	}
	if sb.IdleTimeout > 0 {
		out.IdleTimeout = durationpb.New(sb.IdleTimeout)
	}
	switch sb.OnIdle {
	case manager.OnIdleDelete:
		out.OnIdle = harnessv1.OnIdle_ON_IDLE_DELETE
	case manager.OnIdlePause:
		out.OnIdle = harnessv1.OnIdle_ON_IDLE_PAUSE
	}
	return out
}

// durationOf is a duration field (0 when unset).
func durationOf(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, "%v", err)
	}
	return d.AsDuration(), nil
}

// sandboxSpecOf is a CreateSandboxRequest's spec.
func sandboxSpecOf(r *harnessv1.CreateSandboxRequest) (manager.SandboxSpec, error) {
	ttl, err := durationOf("ttl", r.GetTtl())
	if err != nil {
		return manager.SandboxSpec{}, err
	}
	idle, err := durationOf("idle_timeout", r.GetIdleTimeout())
	if err != nil {
		return manager.SandboxSpec{}, err
	}
	var onIdle manager.OnIdle
	switch r.GetOnIdle() {
	case harnessv1.OnIdle_ON_IDLE_UNSPECIFIED:
	case harnessv1.OnIdle_ON_IDLE_DELETE:
		onIdle = manager.OnIdleDelete
	case harnessv1.OnIdle_ON_IDLE_PAUSE:
		onIdle = manager.OnIdlePause
	default:
		return manager.SandboxSpec{}, invalid("on_idle", "unknown idle policy %d", r.GetOnIdle())
	}
	return manager.SandboxSpec{Manifest: r.GetManifest(), TTL: ttl, IdleTimeout: idle, Labels: r.GetLabels(),
		FromSnapshot: r.GetFromSnapshot(), OnIdle: onIdle}, nil
}

// sandboxStatusOf is a SandboxStatus filter ("" for unspecified).
func sandboxStatusOf(st harnessv1.SandboxStatus) (manager.SandboxStatus, error) {
	switch st {
	case harnessv1.SandboxStatus_SANDBOX_STATUS_UNSPECIFIED:
		return "", nil
	case harnessv1.SandboxStatus_SANDBOX_STATUS_RUNNING:
		return manager.SandboxRunning, nil
	case harnessv1.SandboxStatus_SANDBOX_STATUS_STOPPED:
		return manager.SandboxStopped, nil
	case harnessv1.SandboxStatus_SANDBOX_STATUS_PAUSED:
		return manager.SandboxPaused, nil
	}
	return "", invalid("status", "unknown sandbox status %d", st)
}

func listSandboxesOptionsOf(r *harnessv1.ListSandboxesRequest) (manager.ListSandboxesOptions, error) {
	st, err := sandboxStatusOf(r.GetStatus())
	if err != nil {
		return manager.ListSandboxesOptions{}, err
	}
	return manager.ListSandboxesOptions{RunID: r.GetRunId(), Labels: r.GetLabels(), Status: st,
		PageSize: int(r.GetPageSize()), PageToken: r.GetPageToken()}, nil
}

// commandOf is a command request's spec (RunCommand, Exec, StartProcess:
// the same fields).
func commandOf(command string, argv []string, cwd string, env map[string]string, user string, timeout *durationpb.Duration) (manager.CommandSpec, error) {
	d, err := durationOf("timeout", timeout)
	if err != nil {
		return manager.CommandSpec{}, err
	}
	return manager.CommandSpec{Command: command, Argv: argv, Cwd: cwd, Env: env, User: user, Timeout: d}, nil
}

// textOrBytes puts output in the text field when it is valid UTF-8, else
// in the bytes field: never both.
func textOrBytes(b []byte) (string, []byte) {
	if utf8.Valid(b) {
		return string(b), nil
	}
	return "", b
}

func runCommandProto(r *manager.CommandResult) *harnessv1.RunCommandResponse {
	out := &harnessv1.RunCommandResponse{ExitCode: int32(r.Exit.ExitCode), Signal: r.Exit.Signal, TimedOut: r.Exit.TimedOut,
		DroppedBytes: r.Dropped}
	out.Stdout, out.StdoutBytes = textOrBytes(r.Stdout)
	out.Stderr, out.StderrBytes = textOrBytes(r.Stderr)
	return out
}

func outputStreamProto(s manager.OutputStream) harnessv1.OutputStream {
	if s == manager.Stderr {
		return harnessv1.OutputStream_OUTPUT_STREAM_STDERR
	}
	return harnessv1.OutputStream_OUTPUT_STREAM_STDOUT
}

func outputProto(c manager.OutputChunk) *harnessv1.ExecOutput {
	return &harnessv1.ExecOutput{Stream: outputStreamProto(c.Stream), Data: c.Data}
}

func exitedProto(e *manager.ProcessExit) *harnessv1.ExecExited {
	if e == nil {
		return nil
	}
	return &harnessv1.ExecExited{ExitCode: int32(e.ExitCode), Signal: e.Signal, TimedOut: e.TimedOut, DroppedBytes: e.Dropped}
}

// execProtos are an Exec event's messages: started, each chunk, exited.
func execProtos(ev manager.ExecEvent) []*harnessv1.ExecResponse {
	var out []*harnessv1.ExecResponse
	if ev.ProcessID != "" {
		out = append(out, &harnessv1.ExecResponse{Kind: &harnessv1.ExecResponse_Started{Started: &harnessv1.ExecStarted{ProcessId: ev.ProcessID}}})
	}
	for _, c := range ev.Output {
		out = append(out, &harnessv1.ExecResponse{Kind: &harnessv1.ExecResponse_Output{Output: outputProto(c)}})
	}
	if ev.Exit != nil {
		out = append(out, &harnessv1.ExecResponse{Kind: &harnessv1.ExecResponse_Exited{Exited: exitedProto(ev.Exit)}})
	}
	return out
}

func processProto(p manager.Process) *harnessv1.Process {
	out := &harnessv1.Process{ProcessId: p.ID, Argv: p.Argv, Cwd: p.Cwd, User: p.User, StartTime: timeProto(p.Started),
		State: harnessv1.ProcessState_PROCESS_STATE_EXITED}
	if p.Running {
		out.State = harnessv1.ProcessState_PROCESS_STATE_RUNNING
	}
	if e := p.Exit; e != nil {
		out.ExitCode, out.Signal, out.TimedOut, out.ExitTime = int32(e.ExitCode), e.Signal, e.TimedOut, timeProto(e.At)
	}
	return out
}

func processOutputProto(o *manager.ProcessOutput) *harnessv1.ReadProcessOutputResponse {
	out := &harnessv1.ReadProcessOutputResponse{NextCursor: o.NextCursor, DroppedBytes: o.Dropped, Exited: exitedProto(o.Exit)}
	for _, c := range o.Output {
		out.Output = append(out.Output, outputProto(c))
	}
	return out
}

var patchKinds = map[string]harnessv1.PatchChangeKind{
	"created": harnessv1.PatchChangeKind_PATCH_CHANGE_KIND_CREATED,
	"updated": harnessv1.PatchChangeKind_PATCH_CHANGE_KIND_UPDATED,
	"moved":   harnessv1.PatchChangeKind_PATCH_CHANGE_KIND_MOVED,
	"deleted": harnessv1.PatchChangeKind_PATCH_CHANGE_KIND_DELETED,
}

func patchResultProto(r *manager.PatchResult) *harnessv1.ApplyPatchResponse {
	out := &harnessv1.ApplyPatchResponse{}
	for _, c := range r.Changes {
		out.Changes = append(out.Changes, &harnessv1.PatchChange{Kind: patchKinds[c.Kind], Path: c.Path, NewPath: c.NewPath})
	}
	if rj := r.Rejection; rj != nil {
		out.Rejection = &harnessv1.PatchRejection{Path: rj.Path, Message: rj.Message, ExpectedLines: rj.ExpectedLines,
			ClosestLine: int32(rj.ClosestLine), ClosestLines: rj.ClosestLines}
	}
	return out
}

func fileTypeProto(t manager.FileType) harnessv1.FileType {
	switch t {
	case manager.FileRegular:
		return harnessv1.FileType_FILE_TYPE_FILE
	case manager.FileDirectory:
		return harnessv1.FileType_FILE_TYPE_DIRECTORY
	case manager.FileSymlink:
		return harnessv1.FileType_FILE_TYPE_SYMLINK
	}
	return harnessv1.FileType_FILE_TYPE_OTHER
}

func fileEntryProto(e manager.FileEntry) *harnessv1.FileEntry {
	return &harnessv1.FileEntry{Name: e.Name, Path: e.Path, Type: fileTypeProto(e.Type), Size: e.Size, Mode: e.Mode,
		ModifyTime: timeProto(e.Modified)}
}

func terminalOptionsOf(st *harnessv1.TerminalStart) manager.TerminalOptions {
	return manager.TerminalOptions{Command: st.GetCommand(), Cols: st.GetCols(), Rows: st.GetRows()}
}

func terminalSizeOf(sz *harnessv1.TerminalSize) *manager.TerminalSize {
	if sz == nil {
		return nil
	}
	return &manager.TerminalSize{Cols: sz.GetCols(), Rows: sz.GetRows()}
}

func terminalExitProto(e manager.TerminalExit) *harnessv1.TerminalExited {
	return &harnessv1.TerminalExited{ExitCode: e.ExitCode, Signal: e.Signal}
}

// exposedPortProto is an exposed port with its preview URL (url makes it
// from the token).
func exposedPortProto(p manager.ExposedPort, url func(token string) string) *harnessv1.ExposedPort {
	return &harnessv1.ExposedPort{SandboxId: p.SandboxID, Port: uint32(p.Port), Url: url(p.Token),
		CreateTime: timestamppb.New(p.Created), ExpireTime: timestamppb.New(p.Expires)}
}
