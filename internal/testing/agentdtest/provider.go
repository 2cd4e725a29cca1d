package agentdtest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// Provider is a compute.Provider whose sandboxes are in-process daemons
// served over real gRPC (see Start): for tests of the harness that need
// sessions but not a sandbox binary. Sandboxes live until Destroy or the
// end of the test.
type Provider struct {
	t      testing.TB
	mutate func(*agentd.Config)

	mu        sync.Mutex
	sandboxes map[string]*Daemon // by session id
	Launched  int
	Destroyed int
}

var _ compute.Provider = (*Provider)(nil)

// NewProvider returns an in-process provider; mutate adjusts each daemon's
// configuration.
func NewProvider(t testing.TB, mutate func(*agentd.Config)) *Provider {
	return &Provider{t: t, mutate: mutate, sandboxes: map[string]*Daemon{}}
}

// Name returns "inprocess".
func (p *Provider) Name() string { return "inprocess" }

type inState struct {
	SessionID string `json:"session_id"`
}

// Launch starts an in-process daemon.
func (p *Provider) Launch(_ context.Context, spec compute.LaunchSpec) (compute.Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.sandboxes[spec.SessionID]; ok {
		return nil, fmt.Errorf("%w: session %s", compute.ErrAlreadyExists, spec.SessionID)
	}
	d := Start(p.t, p.mutate)
	p.sandboxes[spec.SessionID] = d
	p.Launched++
	return &sandbox{id: spec.SessionID, d: d}, nil
}

// Reattach returns the running daemon of the session.
func (p *Provider) Reattach(_ context.Context, _ compute.LaunchSpec, prior json.RawMessage) (compute.Sandbox, error) {
	var st inState
	if err := json.Unmarshal(prior, &st); err != nil {
		return nil, fmt.Errorf("%w: %v", compute.ErrInvalidArgument, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.sandboxes[st.SessionID]
	if !ok {
		return nil, fmt.Errorf("%w: session %s", compute.ErrNotFound, st.SessionID)
	}
	return &sandbox{id: st.SessionID, d: d, kept: true}, nil
}

// Destroy forgets the session's daemon (it stops with the test).
func (p *Provider) Destroy(_ context.Context, prior json.RawMessage) error {
	var st inState
	if err := json.Unmarshal(prior, &st); err != nil {
		return fmt.Errorf("%w: %v", compute.ErrInvalidArgument, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.sandboxes[st.SessionID]; ok {
		delete(p.sandboxes, st.SessionID)
		p.Destroyed++
	}
	return nil
}

// List returns the live sandboxes.
func (p *Provider) List(context.Context) ([]compute.SandboxInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []compute.SandboxInfo
	for id := range p.sandboxes {
		st, _ := json.Marshal(inState{SessionID: id})
		out = append(out, compute.SandboxInfo{Provider: p.Name(), SessionID: id, ID: id, Running: true, State: st})
	}
	return out, nil
}

// Live reports how many sandboxes are not destroyed.
func (p *Provider) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sandboxes)
}

type sandbox struct {
	id   string
	d    *Daemon
	kept bool
}

func (s *sandbox) Agent() *agentclient.Client      { return s.d.Client }
func (s *sandbox) State() (json.RawMessage, error) { return json.Marshal(inState{SessionID: s.id}) }
func (s *sandbox) WorkspaceKept() bool             { return s.kept }
func (s *sandbox) Touch(context.Context) error     { return nil }
func (s *sandbox) Shutdown(context.Context) error  { return nil }
func (s *sandbox) Close() error                    { return nil }

// Workspace returns the host directory of a live session's workspace.
func (p *Provider) Workspace(sessionID string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d, ok := p.sandboxes[sessionID]; ok {
		return d.Workspace
	}
	return ""
}
