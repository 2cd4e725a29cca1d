package manager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
)

// TestServeWithoutModelRunsAreOff: a manager without a model (Config.Model
// nil) starts, even over a store holding a run it cannot continue (left as
// it is, for a manager with a model); every call that would start or
// continue a run is a failed precondition saying why, and the rest works.
func TestServeWithoutModelRunsAreOff(t *testing.T) {
	dir, err := os.MkdirTemp("", "bh-mgr-") // short: unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	prov, err := local.New(local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close() })
	st, err := bolt.Open(filepath.Join(dir, "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now().UTC().Truncate(time.Microsecond)
	pending := &store.Run{ID: "run-000000000000000000000001", Tenant: "acme", Status: "RUN_STATUS_PENDING", Created: now, Updated: now,
		Spec: []byte(`{"input": "left for later"}`)}
	if err := st.CreateRun(ctx, pending); err != nil {
		t.Fatal(err)
	}

	m, err := manager.New(ctx, manager.Config{Store: st, Compute: compute.NewClient(prov, compute.ClientOptions{Log: log}),
		DefaultModel: "none", Log: log})
	if err != nil {
		t.Fatalf("a manager without a model: %v", err)
	}
	defer func() {
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	off := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, manager.ErrNoModel) || !errors.Is(err, errkind.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want ErrNoModel (failed precondition)", what, err)
			return
		}
		for _, w := range []string{"no model key", "OPENAI_API_KEY", "--replay"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", what, err, w)
			}
		}
	}
	_, err = m.StartRun(ctx, "acme", manager.RunSpec{Input: "hello"})
	off("StartRun", err)
	_, err = m.Resume(ctx, "acme", pending.ID)
	off("Resume", err)
	_, err = m.ResumeFromState(ctx, "acme", []byte(`{}`), manager.RunSpec{})
	off("ResumeFromState", err)
	_, err = m.Approve(ctx, "acme", pending.ID, "c1")
	off("Approve", err)

	// The recovered run was left as it was; it can be read and canceled.
	if r, err := m.GetRun(ctx, "acme", pending.ID); err != nil || r.Status != manager.StatusPending {
		t.Errorf("the stored run: %+v %v", r, err)
	}
	if runs, _, err := m.ListRuns(ctx, "acme", manager.ListRunsOptions{}); err != nil || len(runs) != 1 {
		t.Errorf("ListRuns: %v %v", runs, err)
	}
	if sbs, err := m.ListSandboxes(ctx, "acme", ""); err != nil || len(sbs) != 0 {
		t.Errorf("ListSandboxes: %v %v", sbs, err)
	}
	if r, err := m.Cancel(ctx, "acme", pending.ID, "no model"); err != nil || r.Status != manager.StatusCanceled {
		t.Errorf("cancel: %+v %v", r, err)
	}
}
