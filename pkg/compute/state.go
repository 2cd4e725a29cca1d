package compute

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// StateVersion is the version of the State format this package writes.
const StateVersion = 1

// State finds a session again, in this process or another: which provider
// runs it, where, what its workspace was made from, and which snapshot holds
// it. It is plain JSON and safe to store anywhere: the manifest is redacted
// (host paths and grants removed, secrets kept as references) and there is
// never a token or credential; a resumed session gets a fresh connection
// through the provider.
type State struct {
	Version   int    `json:"version"`
	Provider  string `json:"provider"`
	SessionID string `json:"session_id"`
	// Manifest is the redacted manifest the workspace was made from.
	Manifest *manifest.Manifest `json:"manifest,omitempty"`
	// SnapshotID names the workspace's snapshot in the client's store.
	SnapshotID string `json:"snapshot_id,omitempty"`
	// Fingerprint is the workspace's fingerprint when it was last persisted.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Started is set once the workspace was materialized or restored.
	Started bool `json:"started"`
	// SkipPaths are left out of snapshots besides the ephemeral entries.
	SkipPaths []string `json:"skip_paths,omitempty"`
	Lifetime  Lifetime `json:"lifetime"`
	// Paused is set when Session.Pause checkpointed the sandbox: Resume
	// restores it with its memory and processes (the provider state says
	// where its checkpoint is). A harness that predates pausing refuses
	// the state rather than rebuilding the sandbox without its memory.
	Paused bool `json:"paused,omitempty"`
	// ProviderState finds the sandbox (container id, directory, address).
	ProviderState json.RawMessage `json:"provider_state,omitempty"`
}

// Encode returns the state as JSON.
func (s *State) Encode() ([]byte, error) {
	return json.Marshal(s)
}

// DecodeState parses a State strictly: unknown fields and other versions
// are errors, so a state from a newer harness is never half-understood.
func DecodeState(data []byte) (*State, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s State
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: session state: %v", ErrInvalidArgument, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: session state: data after the JSON object", ErrInvalidArgument)
	}
	switch {
	case s.Version != StateVersion:
		return nil, fmt.Errorf("%w: session state version %d; this harness reads version %d", ErrInvalidArgument, s.Version, StateVersion)
	case s.Provider == "" || s.SessionID == "":
		return nil, fmt.Errorf("%w: session state without provider or session id", ErrInvalidArgument)
	}
	return &s, nil
}
