package manager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

// newManager makes a manager over a bbolt store, local sandboxes and a
// scripted model whose agent runs one command, then answers "Done.".
func newManager(t *testing.T) *manager.Manager {
	t.Helper()
	dir, err := os.MkdirTemp("", "bh-mgr-") // short: unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	script := replay.NewServer()
	t.Cleanup(script.Close)
	script.SetFallback(func(req *replay.Request) replay.Turn {
		if len(req.InputOfType("function_call_output")) == 0 {
			args, _ := json.Marshal(map[string]string{"cmd": "echo hi > out.txt"})
			return replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", string(args))}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message("Done.")}}
	})
	prov, err := local.New(local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		infos, _ := prov.List(ctx)
		for _, i := range infos {
			_ = prov.Destroy(ctx, i.State)
		}
		_ = prov.Close()
	})
	st, err := bolt.Open(filepath.Join(dir, "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: "sk-test", BaseURL: script.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(context.Background(), manager.Config{Store: st, Compute: compute.NewClient(prov, compute.ClientOptions{Log: log}),
		Model: mdl, DefaultModel: "scripted", Log: log, SandboxRetention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return m
}

// TestGoAPI: a Go program drives a run through the manager alone, with
// no HTTP: input is checked as from the network, errors are errkind's,
// tenants are apart, and after Shutdown every call is refused.
func TestGoAPI(t *testing.T) {
	m := newManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Untrusted input is refused before anything is made.
	_, err := m.StartRun(ctx, "acme", manager.RunSpec{Input: "x", Manifest: "entries:\n  a:\n    type: local_file\n    src: /etc/passwd\n"})
	var fe *manager.FieldError
	if !errors.Is(err, errkind.ErrInvalidArgument) || !errors.As(err, &fe) || fe.Field != "manifest" {
		t.Fatalf("a manifest reading the host: %v", err)
	}
	if _, err := m.StartRun(ctx, "acme", manager.RunSpec{Input: "x", Agent: manager.AgentSpec{RunAs: "root"}}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("run as root: %v", err)
	}
	if _, err := m.StartRun(ctx, "", manager.RunSpec{Input: "x"}); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("no tenant: %v", err)
	}

	run, err := m.StartRun(ctx, "acme", manager.RunSpec{Input: "Write a file.",
		Manifest: "entries:\n  notes.md:\n    type: file\n    content: hello\n", Approvals: manager.ApprovalPolicy{RequireApproval: []string{"exec_command"}}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []manager.EventKind
	err = m.Events(ctx, "acme", run.ID, 0, manager.EventsOptions{}, func(ev manager.Event) error {
		kinds = append(kinds, ev.Kind)
		if ev.Kind == manager.EventApprovalRequested {
			if ev.CallID != "c1" || ev.Tool != "exec_command" {
				t.Errorf("approval requested: %+v", ev)
			}
			if _, err := m.GetRun(ctx, "evil", run.ID); !errors.Is(err, errkind.ErrNotFound) {
				t.Errorf("another tenant's run: %v", err)
			}
			if _, err := m.Approve(ctx, "evil", run.ID, "c1"); !errors.Is(err, errkind.ErrNotFound) {
				t.Errorf("another tenant approves: %v", err)
			}
			if _, err := m.Approve(ctx, "acme", run.ID, "c2"); !errors.Is(err, errkind.ErrNotFound) {
				t.Errorf("approving a call nobody waits for: %v", err)
			}
			if _, err := m.Approve(ctx, "acme", run.ID, "c1"); err != nil {
				t.Errorf("approve: %v", err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []manager.EventKind{manager.EventTurnStarted, manager.EventApprovalRequested, manager.EventApprovalDecided,
		manager.EventRunResumed, manager.EventToolResult, manager.EventRunFinished}
	i := 0
	for _, k := range kinds {
		if i < len(want) && k == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Errorf("events %v, want in order %v", kinds, want)
	}
	done, err := m.GetRun(ctx, "acme", run.ID)
	if err != nil || done.Status != manager.StatusSucceeded || done.FinalOutput != "Done." || done.SandboxID == "" {
		t.Fatalf("finished run: %+v %v", done, err)
	}
	if _, err := m.Cancel(ctx, "acme", run.ID, ""); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Errorf("canceling a finished run: %v", err)
	}

	// Its sandbox is kept: listed, its files readable.
	sbs, err := m.ListSandboxes(ctx, "acme", "")
	if err != nil || len(sbs) != 1 || sbs[0].ID != done.SandboxID || sbs[0].Expires.IsZero() {
		t.Fatalf("sandboxes: %+v %v", sbs, err)
	}
	entries, err := m.ListDir(ctx, "acme", done.SandboxID, "")
	if err != nil || !slices.ContainsFunc(entries, func(e manager.FileEntry) bool { return e.Name == "out.txt" && e.Type == manager.FileRegular }) {
		t.Fatalf("ListDir: %+v %v", entries, err)
	}
	var buf bytes.Buffer
	if err := m.ReadFile(ctx, "acme", done.SandboxID, "out.txt", 0, 0, &buf); err != nil || buf.String() != "hi\n" {
		t.Fatalf("ReadFile: %q %v", buf.String(), err)
	}
	if err := m.ReadFile(ctx, "acme", done.SandboxID, "../etc/passwd", 0, 0, &buf); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("a path out of the workspace: %v", err)
	}
	if _, err := m.ListDir(ctx, "evil", done.SandboxID, ""); !errors.Is(err, errkind.ErrNotFound) {
		t.Errorf("another tenant's sandbox: %v", err)
	}
	runs, next, err := m.ListRuns(ctx, "acme", manager.ListRunsOptions{Status: manager.StatusSucceeded})
	if err != nil || len(runs) != 1 || next != "" {
		t.Errorf("ListRuns: %v %q %v", runs, next, err)
	}
	if _, _, err := m.ListRuns(ctx, "acme", manager.ListRunsOptions{Status: "sleeping"}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("an unknown status: %v", err)
	}

	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if err := m.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetRun(ctx, "acme", run.ID); !errors.Is(err, errkind.ErrUnavailable) {
		t.Errorf("a call after Shutdown: %v", err)
	}
}
