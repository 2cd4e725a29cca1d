package local

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/egresstest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// TestEgressHTTPClientsInBubblewrap: in a bubblewrap sandbox, wget and
// curl reach an allowed name through the egress proxy (plain HTTP and a
// CONNECT tunnel) and fail on a refused one showing the proxy's 403 and
// reason: the host's clients in a sandbox over the host's root, and GNU
// wget in one over the sandbox root file system (`make rootfs`, whose
// busybox shell would otherwise run its own wget applet, which dies of
// SIGSEGV on -T and cannot tunnel https).
func TestEgressHTTPClientsInBubblewrap(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	t.Run("host root", func(t *testing.T) {
		var clients []string
		for _, c := range []string{"wget", "curl"} {
			if _, err := exec.LookPath(c); err == nil {
				clients = append(clients, c)
			}
		}
		if len(clients) == 0 {
			testenv.Skip(t, "neither wget nor curl on this host (`apt-get install wget curl`)")
		}
		srv := egresstest.StartServers(t)
		p, err := New(Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: agentdBin, Isolation: IsolationBubblewrap, Egress: srv.Options()}, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		checkClients(t, compute.NewClient(p, compute.ClientOptions{Log: zap.NewNop()}), srv, clients...)
	})
	t.Run("sandbox rootfs", func(t *testing.T) {
		rootfs := agentdtest.RootFS(t)
		srv := egresstest.StartServers(t)
		c := rootBwrapClient(t, testenv.SearchableTempDir(t), nil, Config{RootFS: rootfs, Egress: srv.Options()})
		checkClients(t, c, srv, "wget")
	})
}

// checkClients runs the HTTP clients' checks in a fresh sandbox of c, as
// the agent's commands run: a shell command line.
func checkClients(t *testing.T, c *compute.Client, srv *egresstest.Servers, clients ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := createStarted(ctx, t, c, nil)
	srv.CheckHTTPClients(t, func(cmd string) (string, int) {
		t.Helper()
		out, errOut, code := run(ctx, t, s, "", cmd)
		return out + errOut, code
	}, clients...)
}
