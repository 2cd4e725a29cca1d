package manager

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// The event log's stored form. Each event is kept as the binary form of
// the wire contract's RunEvent message, the format of the logs earlier
// versions wrote (and a compact, versioned encoding of its own): this file
// is the only place the manager touches the contract's types, and only to
// read and write its store. Transports convert Events to the wire
// themselves (package service's convert.go).

// encodeEvent is ev's stored form.
func encodeEvent(ev *Event) ([]byte, error) {
	out := &harnessv1.RunEvent{Sequence: ev.Sequence, RunId: ev.RunID, Time: timestamppb.New(ev.Time), Agent: ev.Agent}
	switch ev.Kind {
	case EventTurnStarted:
		out.Kind = &harnessv1.RunEvent_TurnStarted{TurnStarted: &harnessv1.TurnStarted{Turn: int32(ev.Turn)}}
	case EventModelText:
		out.Kind = &harnessv1.RunEvent_ModelText{ModelText: &harnessv1.ModelText{Text: ev.Text}}
	case EventModelReset:
		out.Kind = &harnessv1.RunEvent_ModelReset{ModelReset: &harnessv1.ModelReset{}}
	case EventToolCall:
		out.Kind = &harnessv1.RunEvent_ToolCall{ToolCall: &harnessv1.ToolCall{CallId: ev.CallID, Tool: ev.Tool, Input: ev.Input}}
	case EventToolOutput:
		out.Kind = &harnessv1.RunEvent_ToolOutput{ToolOutput: &harnessv1.ToolOutput{CallId: ev.CallID, Output: ev.Output}}
	case EventToolResult:
		out.Kind = &harnessv1.RunEvent_ToolResult{ToolResult: &harnessv1.ToolResult{CallId: ev.CallID, Tool: ev.Tool,
			Output: ev.Text, IsError: ev.IsError}}
	case EventApprovalRequested:
		out.Kind = &harnessv1.RunEvent_ApprovalRequested{ApprovalRequested: &harnessv1.ApprovalRequested{Call: &harnessv1.PendingApproval{
			CallId: ev.CallID, Tool: ev.Tool, Input: ev.Input, Agent: ev.Agent}}}
	case EventApprovalDecided:
		out.Kind = &harnessv1.RunEvent_ApprovalDecided{ApprovalDecided: &harnessv1.ApprovalDecided{CallId: ev.CallID,
			Approved: ev.Approved, Reason: ev.Text}}
	case EventRunFinished:
		out.Kind = &harnessv1.RunEvent_RunFinished{RunFinished: &harnessv1.RunFinished{FinalOutput: ev.Text, Turns: int32(ev.Turn),
			Usage: &harnessv1.Usage{InputTokens: ev.Usage.InputTokens, OutputTokens: ev.Usage.OutputTokens}}}
	case EventRunFailed:
		out.Kind = &harnessv1.RunEvent_RunFailed{RunFailed: &harnessv1.RunFailed{Error: ev.Text}}
	case EventRunCanceled:
		out.Kind = &harnessv1.RunEvent_RunCanceled{RunCanceled: &harnessv1.RunCanceled{Reason: ev.Text}}
	case EventRunResumed:
		out.Kind = &harnessv1.RunEvent_RunResumed{RunResumed: &harnessv1.RunResumed{Cause: ev.Text}}
	default:
		return nil, fmt.Errorf("event of unknown kind %q", ev.Kind)
	}
	return proto.Marshal(out)
}

// decodeEvent reads a stored event.
func decodeEvent(data []byte) (Event, error) {
	in := &harnessv1.RunEvent{}
	if err := proto.Unmarshal(data, in); err != nil {
		return Event{}, err
	}
	ev := Event{Sequence: in.GetSequence(), RunID: in.GetRunId(), Agent: in.GetAgent()}
	if in.GetTime() != nil {
		ev.Time = in.GetTime().AsTime()
	}
	switch k := in.GetKind().(type) {
	case *harnessv1.RunEvent_TurnStarted:
		ev.Kind, ev.Turn = EventTurnStarted, int(k.TurnStarted.GetTurn())
	case *harnessv1.RunEvent_ModelText:
		ev.Kind, ev.Text = EventModelText, k.ModelText.GetText()
	case *harnessv1.RunEvent_ModelReset:
		ev.Kind = EventModelReset
	case *harnessv1.RunEvent_ToolCall:
		c := k.ToolCall
		ev.Kind, ev.CallID, ev.Tool, ev.Input = EventToolCall, c.GetCallId(), c.GetTool(), c.GetInput()
	case *harnessv1.RunEvent_ToolOutput:
		ev.Kind, ev.CallID, ev.Output = EventToolOutput, k.ToolOutput.GetCallId(), k.ToolOutput.GetOutput()
	case *harnessv1.RunEvent_ToolResult:
		r := k.ToolResult
		ev.Kind, ev.CallID, ev.Tool, ev.Text, ev.IsError = EventToolResult, r.GetCallId(), r.GetTool(), r.GetOutput(), r.GetIsError()
	case *harnessv1.RunEvent_ApprovalRequested:
		c := k.ApprovalRequested.GetCall()
		ev.Kind, ev.CallID, ev.Tool, ev.Input = EventApprovalRequested, c.GetCallId(), c.GetTool(), c.GetInput()
		if a := c.GetAgent(); a != "" {
			ev.Agent = a
		}
	case *harnessv1.RunEvent_ApprovalDecided:
		d := k.ApprovalDecided
		ev.Kind, ev.CallID, ev.Approved, ev.Text = EventApprovalDecided, d.GetCallId(), d.GetApproved(), d.GetReason()
	case *harnessv1.RunEvent_RunFinished:
		f := k.RunFinished
		ev.Kind, ev.Text, ev.Turn = EventRunFinished, f.GetFinalOutput(), int(f.GetTurns())
		ev.Usage = Usage{InputTokens: f.GetUsage().GetInputTokens(), OutputTokens: f.GetUsage().GetOutputTokens()}
	case *harnessv1.RunEvent_RunFailed:
		ev.Kind, ev.Text = EventRunFailed, k.RunFailed.GetError()
	case *harnessv1.RunEvent_RunCanceled:
		ev.Kind, ev.Text = EventRunCanceled, k.RunCanceled.GetReason()
	case *harnessv1.RunEvent_RunResumed:
		ev.Kind, ev.Text = EventRunResumed, k.RunResumed.GetCause()
	default:
		return Event{}, fmt.Errorf("event %d of no known kind", in.GetSequence())
	}
	return ev, nil
}
