package kubernetes

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/computetest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// TestProviderConformance runs the suite every provider passes, end to end
// through the real API server, reaching the daemon through a port-forward
// (from outside the cluster) and by Pod IP (as from inside it). Clients
// made by successive NewClient calls are separate providers: separate
// harness processes, sharing only the API server.
func TestProviderConformance(t *testing.T) {
	for _, mode := range []Connect{ConnectPortForward, ConnectPodIP} {
		t.Run(string(mode), func(t *testing.T) {
			e := newKubeEnv(t, nil)
			computetest.Run(t, computetest.Env{
				NewClient: func(t *testing.T, store snapshot.Store) *compute.Client {
					return e.client(t, e.provider(t, e.config(mode)), store)
				},
				Users:  true,
				Leaked: e.leaked,
			})
		})
	}
}

// TestExecRelay reaches the daemon through the exec subresource (the way
// for gVisor/Kata RuntimeClasses, where port-forward fails): a session
// runs commands, reads files, and a second harness reattaches.
func TestExecRelay(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	store := newStore(t)
	c := e.client(t, e.provider(t, e.config(ConnectExec)), store)
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Delete(context.Background(), s); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo hello from $(id -un); head -c 300000 /dev/zero | wc -c"}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := string(res.Stdout); !strings.Contains(out, "hello from sandbox") || !strings.Contains(out, "300000") {
		t.Fatalf("exec over the relay: %q %q", out, res.Stderr)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Release()
	s2, err := e.client(t, e.provider(t, e.config(ConnectExec)), store).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	s = s2
	if _, err := s2.Agent().Exec(ctx, compute.ProcessSpec{Command: "true"}, compute.ExecOptions{}, nil); err != nil {
		t.Fatal(err)
	}
}
