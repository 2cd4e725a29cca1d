package service

import (
	"fmt"
	"strings"
	"time"

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
		Input: r.GetInput(), MaxTurns: int(r.GetMaxTurns()), Workdir: r.GetWorkdir()}
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
		Status: harnessv1.SandboxStatus_SANDBOX_STATUS_STOPPED, ExpireTime: timeProto(sb.Expires)}
	if sb.Status == manager.SandboxRunning {
		out.Status = harnessv1.SandboxStatus_SANDBOX_STATUS_RUNNING
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
