package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// RunStateVersion is the version of the RunState format this package writes.
const RunStateVersion = 1

// RunState is a run stopped between turns, typically for approvals: the
// conversation, the agent whose turn it is, the tool calls waiting for a
// decision, and the state of every runner-owned sandbox session (persisted
// before the state was made, so a resume in another process finds the
// workspace either alive or in its snapshot). It is plain JSON and holds no
// token or credential.
type RunState struct {
	Version int `json:"version"`
	// Agent is the key of the agent whose turn it is (see AgentKeys).
	Agent string `json:"agent"`
	// Turn is the number of model calls made so far.
	Turn  int          `json:"turn"`
	Items []model.Item `json:"items"`
	Usage model.Usage  `json:"usage"`
	// Pending are the tool calls of the last model response that wait for
	// a decision, in the response's order.
	Pending []*PendingCall `json:"pending,omitempty"`
	// Sessions are the runner-owned sandbox sessions by agent key.
	Sessions map[string]*compute.State `json:"sessions,omitempty"`
}

// PendingCall is a tool call waiting for approval.
type PendingCall struct {
	Call  ToolCall `json:"call"`
	Agent string   `json:"agent"`
	// Decision is nil until Approve or Reject.
	Decision *Decision `json:"decision,omitempty"`
}

// Decision is the caller's answer to a pending call.
type Decision struct {
	Approved bool `json:"approved"`
	// Message is shown to the model when the call is rejected.
	Message string `json:"message,omitempty"`
}

// Errors of run states.
var (
	// ErrUnknownCall: no pending call has that id.
	ErrUnknownCall = errors.New("no pending tool call with that id")
	// ErrUndecided: a run was resumed with calls still waiting for a decision.
	ErrUndecided = errors.New("tool calls are still waiting for a decision")
)

// Approve lets the pending call run when the run resumes.
func (s *RunState) Approve(callID string) error {
	p := s.pending(callID)
	if p == nil {
		return fmt.Errorf("approve %s: %w", callID, ErrUnknownCall)
	}
	p.Decision = &Decision{Approved: true}
	return nil
}

// Reject refuses the pending call; the model sees message (or a default)
// as the call's output when the run resumes.
func (s *RunState) Reject(callID, message string) error {
	p := s.pending(callID)
	if p == nil {
		return fmt.Errorf("reject %s: %w", callID, ErrUnknownCall)
	}
	p.Decision = &Decision{Approved: false, Message: message}
	return nil
}

func (s *RunState) pending(callID string) *PendingCall {
	for _, p := range s.Pending {
		if p.Call.ID == callID {
			return p
		}
	}
	return nil
}

// Undecided returns the pending calls without a decision.
func (s *RunState) Undecided() []*PendingCall {
	var out []*PendingCall
	for _, p := range s.Pending {
		if p.Decision == nil {
			out = append(out, p)
		}
	}
	return out
}

// Encode returns the state as JSON.
func (s *RunState) Encode() ([]byte, error) { return json.Marshal(s) }

// DecodeRunState parses a RunState strictly (unknown fields and other
// versions are errors).
func DecodeRunState(data []byte) (*RunState, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s RunState
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("run state: %w", err)
	}
	if s.Version != RunStateVersion {
		return nil, fmt.Errorf("run state version %d; this harness reads version %d", s.Version, RunStateVersion)
	}
	if s.Agent == "" {
		return nil, errors.New("run state without an agent")
	}
	return &s, nil
}
