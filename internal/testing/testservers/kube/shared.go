package kubeserver

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// shared is the one cluster of a test binary (Shared), started by the
// first test that asks and stopped by Run when the tests end.
var shared struct {
	mu      sync.Mutex
	inMain  bool
	tried   bool
	cluster *Cluster
	err     error
}

// Run runs the package's tests (m.Run), then stops the shared cluster if a
// test started one, and returns m.Run's code. A package whose tests call
// Shared has `func TestMain(m *testing.M) { os.Exit(kubeserver.Run(m)) }`.
func Run(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster != nil {
		shared.cluster.Stop()
		shared.cluster = nil
	}
	return code
}

// Shared returns the test binary's one cluster, starting it on the first
// call (tests share it: each should work in its own Namespace). The
// package's TestMain must call Run, which stops it. A cluster that failed
// to start fails every test that asks; a machine without the parts
// (Needs) skips them through testenv.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	testenv.Require(t, Needs()...)
	requireTimeForBuild(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		t.Fatal("kubeserver: Shared needs the package's TestMain to call kubeserver.Run(m), which stops the cluster")
	}
	if !shared.tried {
		shared.tried = true
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout+5*time.Minute)
		defer cancel()
		logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		c, err := New(ctx, Options{Logf: logf})
		if err != nil {
			if c != nil {
				c.dumpLogs(logf)
				c.Stop()
			}
			shared.err = err
		} else {
			shared.cluster = c
		}
	}
	if shared.err != nil {
		t.Fatalf("kubeserver: the shared cluster did not start: %v", shared.err)
	}
	c := shared.cluster
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs(t.Logf)
		}
	})
	return c
}
