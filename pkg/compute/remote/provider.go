package remote

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// Provider connects to one sandbox that something else started. It is safe
// for concurrent use; sessions over it share that sandbox.
type Provider struct {
	cfg Config
	ep  endpoint
	log *zap.Logger
}

var _ compute.Provider = (*Provider)(nil)

// New returns a remote provider. It validates the configuration and does no
// I/O: Launch connects.
func New(cfg Config, log *zap.Logger) (*Provider, error) {
	if log == nil {
		log = zap.NewNop()
	}
	ep, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	return &Provider{cfg: cfg, ep: ep, log: log.Named("remote")}, nil
}

// NewClient is compute.NewClient over a new remote provider.
func NewClient(cfg Config, opts compute.ClientOptions) (*compute.Client, error) {
	p, err := New(cfg, opts.Log)
	if err != nil {
		return nil, err
	}
	return compute.NewClient(p, opts), nil
}

// Name returns "remote".
func (p *Provider) Name() string { return ProviderName }

// providerState is what a session state records about a remote sandbox:
// where it is, never how to authenticate to it.
type providerState struct {
	Address string `json:"address"`
}

// Launch connects to the configured sandbox; it creates nothing. The
// sandbox's workspace counts as kept when the session replaces an earlier
// sandbox (spec.Prior), so Start can skip a restore by fingerprint.
func (p *Provider) Launch(ctx context.Context, spec compute.LaunchSpec) (compute.Sandbox, error) {
	if spec.Prior != nil {
		if _, err := p.check(spec.Prior); err != nil {
			return nil, err
		}
	}
	client, _, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	p.log.Info("connected to remote sandbox", zap.String("session", spec.SessionID), zap.String("address", p.ep.String()))
	return &sandbox{p: p, client: client, kept: spec.Prior != nil}, nil
}

// Reattach connects to the sandbox a session state names, which must be the
// configured one: the token is never sent to an address that came from a
// state. An unreachable sandbox is ErrUnavailable (retryable), never
// ErrNotFound: the provider cannot tell a gone sandbox from a network
// failure, and cannot launch a replacement anyway.
func (p *Provider) Reattach(ctx context.Context, _ compute.LaunchSpec, prior json.RawMessage) (compute.Sandbox, error) {
	if _, err := p.check(prior); err != nil {
		return nil, err
	}
	client, _, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	return &sandbox{p: p, client: client, kept: true}, nil
}

// Destroy forgets the sandbox: it keeps running, with its workspace, for
// whoever started it. A state of another address is an error.
func (p *Provider) Destroy(_ context.Context, prior json.RawMessage) error {
	_, err := p.check(prior)
	return err
}

// List returns the configured sandbox (Running when it answers a probe).
// The provider manages no other, and records no session or lifetime for it.
func (p *Provider) List(ctx context.Context) ([]compute.SandboxInfo, error) {
	st, err := json.Marshal(providerState{Address: p.ep.String()})
	if err != nil {
		return nil, err
	}
	return []compute.SandboxInfo{{Provider: ProviderName, ID: p.ep.String(), Running: p.healthy(ctx), State: st}}, nil
}

// check parses a provider state and refuses one that names another sandbox
// than the configured one.
func (p *Provider) check(prior json.RawMessage) (providerState, error) {
	var ps providerState
	if err := json.Unmarshal(prior, &ps); err != nil || ps.Address == "" {
		return ps, fmt.Errorf("%w: remote provider state: %v", compute.ErrInvalidArgument, err)
	}
	ep, err := parseAddress(ps.Address)
	if err != nil {
		return ps, err
	}
	if ep != p.ep {
		return ps, fmt.Errorf("%w: the session's sandbox is at %s but this remote provider is configured for %s (its token is only sent there)",
			compute.ErrFailedPrecondition, ep, p.ep)
	}
	return ps, nil
}

// sandbox is the remote sandbox as one session holds it.
type sandbox struct {
	p      *Provider
	client *agentclient.Client
	kept   bool

	closeOnce sync.Once
	closeErr  error
}

func (s *sandbox) Agent() *agentclient.Client { return s.client }

func (s *sandbox) State() (json.RawMessage, error) {
	return json.Marshal(providerState{Address: s.p.ep.String()})
}

func (s *sandbox) WorkspaceKept() bool { return s.kept }

// Touch records nothing: the remote sandbox's lifetime is its owner's.
func (s *sandbox) Touch(context.Context) error { return nil }

// Shutdown leaves the sandbox running: it belongs to whoever started it.
// Its processes keep running too (the provider cannot tell the session's
// from its owner's).
func (s *sandbox) Shutdown(context.Context) error { return nil }

// Close drops the connection. Idempotent.
func (s *sandbox) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.client.Close() })
	return s.closeErr
}
