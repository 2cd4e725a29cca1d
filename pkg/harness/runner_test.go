package harness

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// testModel returns an openai-go model against a scripted server.
func testModel(t *testing.T, turns ...replay.Turn) (*replay.Server, model.Model) {
	t.Helper()
	srv := replay.NewServer(turns...)
	t.Cleanup(srv.Close)
	m, err := model.NewOpenAI(model.Config{Model: "test-model", APIKey: "sk-test", BaseURL: srv.URL(),
		Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, m
}

// writeCap is a capability with one tool, write_note, that writes a file
// in the sandbox through the daemon; it counts its clones.
type writeCap struct {
	clones *atomic.Int32
	closed *atomic.Int32
}

func (c writeCap) Name() string { return "notes" }
func (c writeCap) Clone() capability.Capability {
	c.clones.Add(1)
	return c
}
func (c writeCap) Instructions(capability.Env) string { return "Use write_note to leave notes." }
func (c writeCap) ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error) {
	out := m.Clone()
	if out.Entries == nil {
		out.Entries = map[string]*manifest.Entry{}
	}
	out.Entries["notes"] = &manifest.Entry{Type: manifest.TypeDir, Description: "your notes"}
	return out, nil
}
func (c writeCap) Close() error { c.closed.Add(1); return nil }
func (c writeCap) Tools(capability.Env) []tool.Tool {
	return []tool.Tool{tool.Func{
		Def: model.FunctionTool("write_note", "Write a note.", []byte(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`), true),
		Fn: func(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
			if _, err := call.Agent.WriteFile(ctx, "notes/note.txt", compute.WriteFileOptions{CreateParents: true}, strings.NewReader(input)); err != nil {
				return tool.Result{Output: err.Error(), IsError: true}, nil
			}
			return tool.Result{Output: "saved"}, nil
		},
	}}
}

func newWriteCap() writeCap { return writeCap{clones: new(atomic.Int32), closed: new(atomic.Int32)} }

func sandboxClient(t *testing.T, store snapshot.Store) (*agentdtest.Provider, *compute.Client) {
	p := agentdtest.NewProvider(t, nil)
	return p, compute.NewClient(p, compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t)})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestRunWithToolAndFreshSession(t *testing.T) {
	srv, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("call_1", "write_note", `{"text":"hello"}`)}, Usage: replay.Usage{InputTokens: 10, OutputTokens: 5}},
		replay.Turn{Items: []replay.Item{replay.Message("Done: wrote the note.")}, Usage: replay.Usage{InputTokens: 20, OutputTokens: 7}},
	)
	prov, client := sandboxClient(t, nil)
	wc := newWriteCap()
	a := &Agent{Name: "writer", Instructions: "Write what you are told.", Capabilities: []capability.Capability{wc},
		DefaultManifest: &manifest.Manifest{Entries: map[string]*manifest.Entry{"task.md": {Type: manifest.TypeFile, Content: []byte("t")}}}}
	r := &Runner{Model: m, Log: zaptest.NewLogger(t)}
	res, err := r.Run(ctxT(t), a, "write hello", RunConfig{Sandbox: &SandboxConfig{Client: client}})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalOutput != "Done: wrote the note." || res.Turns != 2 {
		t.Fatalf("result: %q after %d turns", res.FinalOutput, res.Turns)
	}
	if res.Usage.InputTokens != 30 || res.Usage.OutputTokens != 12 {
		t.Errorf("usage %+v", res.Usage)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	outs := reqs[1].InputOfType("function_call_output")
	if len(outs) != 1 || outs[0]["call_id"] != "call_1" || outs[0]["output"] != "saved" {
		t.Errorf("second request's tool output: %v", outs)
	}
	// The runner created the session and cleaned it up; the capability was
	// cloned for the run and closed after it.
	if prov.Launched != 1 || prov.Destroyed != 1 || prov.Live() != 0 {
		t.Errorf("sessions: launched %d destroyed %d live %d", prov.Launched, prov.Destroyed, prov.Live())
	}
	if wc.clones.Load() != 1 || wc.closed.Load() != 1 {
		t.Errorf("capability clones %d closes %d", wc.clones.Load(), wc.closed.Load())
	}
	if res.SessionState == nil || !res.SessionState.Started {
		t.Errorf("session state %+v", res.SessionState)
	}
}

func TestInstructionOrder(t *testing.T) {
	srv, m := testModel(t, replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	_, client := sandboxClient(t, nil)
	a := &Agent{Name: "a", Instructions: "AGENT-SPECIFIC", Capabilities: []capability.Capability{newWriteCap()}}
	r := &Runner{Model: m}
	if _, err := r.Run(ctxT(t), a, "hi", RunConfig{Sandbox: &SandboxConfig{Client: client, Workdir: "repo"}}); err != nil {
		t.Fatal(err)
	}
	ins := srv.Requests()[0].Instructions()
	order := []string{BasePrompt[:40], "# Agent instructions\n\nAGENT-SPECIFIC", "# Sandbox capability instructions\n\nUse write_note",
		"# Filesystem\n", "the working directory is `/workspace/repo`", "/workspace\n└── notes/  # /workspace/notes — your notes"}
	last := -1
	for _, want := range order {
		i := strings.Index(ins, want)
		if i < 0 || i < last {
			t.Fatalf("instructions lack %q in order:\n%s", want, ins)
		}
		last = i
	}
	// Without a sandbox, only the agent's own instructions are sent.
	srv.Enqueue(replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	if _, err := r.Run(ctxT(t), a, "hi", RunConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Requests()[1].Instructions(); got != "AGENT-SPECIFIC" {
		t.Errorf("instructions without sandbox: %q", got)
	}
	// An override replaces the base prompt.
	override := "CUSTOM BASE"
	a.BaseInstructions = &override
	srv.Enqueue(replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	if _, err := r.Run(ctxT(t), a, "hi", RunConfig{Sandbox: &SandboxConfig{Client: client}}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Requests()[2].Instructions(); !strings.HasPrefix(got, "CUSTOM BASE\n\n# Agent instructions") {
		t.Errorf("override: %q", got[:60])
	}
}

func TestInjectedSessionIsNotTornDown(t *testing.T) {
	_, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "write_note", `{"text":"x"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	prov, client := sandboxClient(t, nil)
	ctx := ctxT(t)
	sess, err := client.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start(ctx); err != nil {
		t.Fatal(err)
	}
	a := &Agent{Name: "a", Capabilities: []capability.Capability{newWriteCap()}}
	if _, err := (&Runner{Model: m}).Run(ctx, a, "go", RunConfig{Sandbox: &SandboxConfig{Session: sess}}); err != nil {
		t.Fatal(err)
	}
	if prov.Destroyed != 0 || prov.Live() != 1 {
		t.Fatalf("the injected session was torn down: destroyed %d live %d", prov.Destroyed, prov.Live())
	}
	var b bytes.Buffer
	if _, err := sess.ReadFile(ctx, "notes/note.txt", compute.ReadFileOptions{}, &b); err != nil || !strings.Contains(b.String(), "x") {
		t.Fatalf("the tool did not use the injected session: %q %v", b.String(), err)
	}
}

func TestResumeFromSessionState(t *testing.T) {
	_, m := testModel(t, replay.Turn{Items: []replay.Item{replay.Message("first")}}, replay.Turn{Items: []replay.Item{replay.Message("second")}})
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	prov, client := sandboxClient(t, store)
	a := &Agent{Name: "a", Capabilities: []capability.Capability{}}
	r := &Runner{Model: m}
	res, err := r.Run(ctxT(t), a, "one", RunConfig{Sandbox: &SandboxConfig{Client: client, KeepSession: true}})
	if err != nil {
		t.Fatal(err)
	}
	if prov.Live() != 1 || res.SessionState == nil {
		t.Fatalf("KeepSession: live %d state %v", prov.Live(), res.SessionState)
	}
	if _, err := r.Run(ctxT(t), a, "two", RunConfig{Sandbox: &SandboxConfig{Client: client, SessionState: res.SessionState}}); err != nil {
		t.Fatal(err)
	}
	// The second run reattached the same sandbox (no new launch) and, owning
	// it, deleted it.
	if prov.Launched != 1 || prov.Live() != 0 {
		t.Fatalf("resume: launched %d live %d", prov.Launched, prov.Live())
	}
	if ok, _ := store.Exists(ctxT(t), res.SessionState.SnapshotID); !ok {
		t.Error("no snapshot persisted")
	}
}

func TestCleanupOnFailureAndCancellation(t *testing.T) {
	t.Run("model error", func(t *testing.T) {
		_, m := testModel(t, replay.Fail(400))
		prov, client := sandboxClient(t, nil)
		_, err := (&Runner{Model: m}).Run(ctxT(t), &Agent{Name: "a", Capabilities: []capability.Capability{}}, "x",
			RunConfig{Sandbox: &SandboxConfig{Client: client}})
		if err == nil || !strings.Contains(err.Error(), "400") {
			t.Fatalf("error %v", err)
		}
		if prov.Launched != 1 || prov.Live() != 0 {
			t.Fatalf("launched %d live %d", prov.Launched, prov.Live())
		}
	})
	t.Run("cancelled during a tool", func(t *testing.T) {
		_, m := testModel(t, replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "block", `{}`)}})
		prov, client := sandboxClient(t, nil)
		ctx, cancel := context.WithCancel(ctxT(t))
		block := tool.Func{Def: model.FunctionTool("block", "blocks", []byte(`{"type":"object","properties":{}}`), false),
			Fn: func(ctx context.Context, _ tool.Context, _ string) (tool.Result, error) {
				cancel()
				<-ctx.Done()
				return tool.Result{}, ctx.Err()
			}}
		_, err := (&Runner{Model: m}).Run(ctx, &Agent{Name: "a", Tools: []tool.Tool{block}, Capabilities: []capability.Capability{}}, "x",
			RunConfig{Sandbox: &SandboxConfig{Client: client}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v", err)
		}
		if prov.Live() != 0 {
			t.Fatalf("the cancelled run left its session: live %d", prov.Live())
		}
	})
	t.Run("cleanup error is reported", func(t *testing.T) {
		_, m := testModel(t, replay.Turn{Items: []replay.Item{replay.Message("ok")}})
		_, client := sandboxClient(t, failingStore{})
		_, err := (&Runner{Model: m}).Run(ctxT(t), &Agent{Name: "a", Capabilities: []capability.Capability{}}, "x",
			RunConfig{Sandbox: &SandboxConfig{Client: client}})
		if err == nil || !strings.Contains(err.Error(), "sandbox cleanup") || !strings.Contains(err.Error(), "store is broken") {
			t.Fatalf("error %v", err)
		}
	})
}

// failingStore fails every Put.
type failingStore struct{ snapshot.Noop }

func (failingStore) Put(_ context.Context, _ string, r io.Reader) (snapshot.Info, error) {
	_, _ = io.Copy(io.Discard, r)
	return snapshot.Info{}, errors.New("store is broken")
}

func TestAgentCannotRunTwiceAtOnce(t *testing.T) {
	_, m := testModel(t, replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "block", `{}`)}}, replay.Turn{Items: []replay.Item{replay.Message("ok")}})
	started, release := make(chan struct{}), make(chan struct{})
	block := tool.Func{Def: model.FunctionTool("block", "blocks", []byte(`{"type":"object","properties":{}}`), false),
		Fn: func(context.Context, tool.Context, string) (tool.Result, error) {
			close(started)
			<-release
			return tool.Result{Output: "done"}, nil
		}}
	a := &Agent{Name: "busy", Tools: []tool.Tool{block}}
	r := &Runner{Model: m}
	done := make(chan error, 1)
	go func() { _, err := r.Run(ctxT(t), a, "x", RunConfig{}); done <- err }()
	<-started
	if _, err := r.Run(ctxT(t), a, "y", RunConfig{}); !errors.Is(err, ErrAgentInUse) {
		t.Fatalf("second run: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Free again once the first run ended.
	_, m2 := testModel(t, replay.Turn{Items: []replay.Item{replay.Message("again")}})
	a.Model = m2
	if _, err := r.Run(ctxT(t), a, "z", RunConfig{}); err != nil {
		t.Fatal(err)
	}
}

func TestMaxTurnsAndUnknownTool(t *testing.T) {
	srv, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "nope", `{}`)}},
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c2", "nope", `{}`)}})
	_, err := (&Runner{Model: m}).Run(ctxT(t), &Agent{Name: "a"}, "x", RunConfig{MaxTurns: 2})
	if !errors.Is(err, ErrMaxTurns) {
		t.Fatalf("error %v", err)
	}
	outs := srv.Requests()[1].InputOfType("function_call_output")
	if len(outs) != 1 || outs[0]["output"] != `There is no tool named "nope".` {
		t.Fatalf("unknown tool output: %v", outs)
	}
}

func TestRunStreamedEvents(t *testing.T) {
	_, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.CustomToolCall("c1", "echo", "raw input")}},
		replay.Turn{Items: []replay.Item{replay.Message("final answer")}})
	echo := tool.Func{Def: model.CustomTool("echo", "echoes", nil),
		Fn: func(_ context.Context, call tool.Context, input string) (tool.Result, error) {
			call.Emit(tool.Progress{CallID: call.CallID, Output: []byte("progress")})
			return tool.Result{Output: "echo: " + input}, nil
		}}
	s := (&Runner{Model: m}).RunStreamed(ctxT(t), &Agent{Name: "a", Tools: []tool.Tool{echo}}, "x", RunConfig{})
	var kinds []string
	var text strings.Builder
	for ev := range s.Events() {
		if len(kinds) == 0 || kinds[len(kinds)-1] != string(ev.Kind) {
			kinds = append(kinds, string(ev.Kind))
		}
		if ev.Kind == EventTextDelta {
			text.WriteString(ev.Text)
		}
		if ev.Kind == EventToolResult && ev.Result.Output != "echo: raw input" {
			t.Errorf("tool result %+v", ev.Result)
		}
	}
	res, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	want := "turn_started tool_call tool_output tool_result turn_started text_delta final_output"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("events %s\nwant   %s", got, want)
	}
	if text.String() != "final answer" || res.FinalOutput != "final answer" {
		t.Errorf("text %q final %q", text.String(), res.FinalOutput)
	}
}

func TestStructuredOutputMustBeJSON(t *testing.T) {
	_, m := testModel(t, replay.Turn{Items: []replay.Item{replay.Message("not json")}})
	a := &Agent{Name: "a", Output: &model.OutputSchema{Name: "r", Schema: []byte(`{"type":"object"}`)}}
	if _, err := (&Runner{Model: m}).Run(ctxT(t), a, "x", RunConfig{}); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("error %v", err)
	}
}

func TestRunAsIsDeclared(t *testing.T) {
	m := withRunAs(&manifest.Manifest{}, "analyst")
	if len(m.Users) != 1 || m.Users[0].Name != "analyst" || m.RunAs != "analyst" {
		t.Fatalf("%+v", m)
	}
	declared := &manifest.Manifest{Users: []manifest.User{{Name: "analyst"}}}
	if withRunAs(declared, "analyst") != declared || withRunAs(declared, "root") != declared {
		t.Fatal("declared user changed the manifest")
	}
}
