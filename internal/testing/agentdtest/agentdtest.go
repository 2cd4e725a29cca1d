// Package agentdtest starts an in-process sandbox daemon served over real
// gRPC on a unix socket, for tests of the packages that talk to one
// (materializer, compute sessions) without building the binary.
package agentdtest

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// Token is the bearer token the test daemons accept.
const Token = "agentdtest-token"

// Daemon is a running test daemon.
type Daemon struct {
	Client    *agentclient.Client
	Socket    string
	Workspace string
	Config    agentd.Config
}

// Start runs a daemon whose workspace is a fresh temporary directory;
// mutate may adjust its configuration. Everything stops when the test ends.
func Start(t testing.TB, mutate func(*agentd.Config)) *Daemon {
	t.Helper()
	dir := t.TempDir()
	cfg := agentd.DefaultConfig()
	cfg.WorkspaceRoot = filepath.Join(dir, "ws")
	cfg.ReapAll = false // the test process is shared; reap only our children
	if mutate != nil {
		mutate(&cfg)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	d, err := agentd.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(d, []byte(Token), false, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "agentd.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.GRPC.Serve(l) }()
	client, err := agentclient.Dial(agentclient.Options{Address: "unix://" + socket, Token: Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return &Daemon{Client: client, Socket: socket, Workspace: cfg.WorkspaceRoot, Config: cfg}
}
