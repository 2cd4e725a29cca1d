package docker

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// sandbox is one live container as a Session sees it.
type sandbox struct {
	p      *Provider
	client *agentclient.Client
	state  State
	dir    privateDir
	kept   bool

	closeOnce sync.Once
	closeErr  error
}

var _ compute.Sandbox = (*sandbox)(nil)

// Agent is the connected daemon client.
func (s *sandbox) Agent() *agentclient.Client { return s.client }

// State finds the container again; it holds no token.
func (s *sandbox) State() (json.RawMessage, error) { return s.state.encode() }

// WorkspaceKept is true after Reattach, or after Launch with a Prior whose
// workspace volume was still there.
func (s *sandbox) WorkspaceKept() bool { return s.kept }

// Touch records activity now (the mtime of the private directory's
// last-active file: a label cannot change).
func (s *sandbox) Touch(context.Context) error { return s.dir.touch() }

// Shutdown stops the container (SIGTERM: the daemon ends its processes and
// drains; SIGKILL after StopTimeout). The container, its directory and its
// volume stay for Reattach or Destroy.
func (s *sandbox) Shutdown(ctx context.Context) error { return s.p.stop(ctx, s.state.ContainerID) }

// Close closes the gRPC connection and leaves the container as it is.
func (s *sandbox) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.client.Close() })
	return s.closeErr
}
