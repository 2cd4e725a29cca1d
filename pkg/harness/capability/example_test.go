package capability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Todo is a worked example of a custom capability: a todo list the agent
// keeps in its workspace. It shows each part of the interface:
//   - Tools: add_todo appends an item through the sandbox's daemon;
//   - Instructions: a fragment telling the model how to use it;
//   - ProcessManifest: the list file is part of the workspace from the start;
//   - RequestAdjuster: sampling parameters for the agent's model calls;
//   - Requirer: it works next to the filesystem capability.
type Todo struct {
	// Path of the list in the workspace.
	Path string
}

func (t Todo) Name() string                 { return "todo" }
func (t Todo) Clone() capability.Capability { return t } // no per-run state
func (t Todo) Requires() []string           { return []string{"filesystem"} }
func (t Todo) Instructions(capability.Env) string {
	return "Keep a todo list with add_todo; it lives in `" + t.Path + "`."
}

func (t Todo) ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error) {
	if m.Lookup(t.Path) != nil {
		return m, nil
	}
	out := m.Clone()
	if out.Entries == nil {
		out.Entries = map[string]*manifest.Entry{}
	}
	out.Entries[t.Path] = &manifest.Entry{Type: manifest.TypeFile, Content: []byte("# Todo\n"), Description: "the agent's todo list"}
	return out, nil
}

func (t Todo) AdjustRequest(req *model.Request) {
	temp := 0.2
	req.Settings.Temperature = &temp
}

func (t Todo) Tools(env capability.Env) []tool.Tool {
	if !env.HasSession {
		return nil
	}
	schema := json.RawMessage(`{"type":"object","properties":{"item":{"type":"string"}},"required":["item"],"additionalProperties":false}`)
	return []tool.Tool{tool.Func{
		Def: model.FunctionTool("add_todo", "Add an item to the todo list.", schema, true),
		Fn: func(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
			var args struct{ Item string }
			if err := json.Unmarshal([]byte(input), &args); err != nil || strings.TrimSpace(args.Item) == "" {
				return tool.Result{Output: `Call add_todo with {"item": "..."}.`, IsError: true}, nil
			}
			var cur strings.Builder
			if _, err := call.Agent.ReadFile(ctx, t.Path, compute.ReadFileOptions{User: call.RunAs}, &cur); err != nil {
				return tool.Result{}, fmt.Errorf("read %s: %w", t.Path, err)
			}
			next := cur.String() + "- [ ] " + strings.TrimSpace(args.Item) + "\n"
			if _, err := call.Agent.WriteFile(ctx, t.Path, compute.WriteFileOptions{User: call.RunAs}, strings.NewReader(next)); err != nil {
				return tool.Result{}, fmt.Errorf("write %s: %w", t.Path, err)
			}
			return tool.Result{Output: "added"}, nil
		},
	}}
}

var (
	_ capability.Capability      = Todo{}
	_ capability.Requirer        = Todo{}
	_ capability.RequestAdjuster = Todo{}
)

// An agent gets a custom capability next to the defaults it needs.
func Example() {
	agent := &harness.Agent{
		Name:         "planner",
		Instructions: "Plan the work before doing it.",
		Capabilities: append(harness.DefaultCapabilities(), Todo{Path: "TODO.md"}),
	}
	fmt.Println(agent.Name, len(agent.Capabilities))
	// Output: planner 4
}

func TestTodoCapabilityInARun(t *testing.T) {
	srv := replay.NewServer(
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "add_todo", `{"item":"write the tests"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("planned")}})
	t.Cleanup(srv.Close)
	m, err := model.NewOpenAI(model.Config{Model: "m", APIKey: "x", BaseURL: srv.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prov := agentdtest.NewProvider(t, nil)
	client := compute.NewClient(prov, compute.ClientOptions{})
	sess, err := client.Create(ctx, compute.CreateOptions{Manifest: func() *manifest.Manifest {
		m, _ := Todo{Path: "TODO.md"}.ProcessManifest(&manifest.Manifest{})
		return m
	}()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start(ctx); err != nil {
		t.Fatal(err)
	}
	agent := &harness.Agent{Name: "planner", Capabilities: append(harness.DefaultCapabilities(), Todo{Path: "TODO.md"})}
	res, err := (&harness.Runner{Model: m}).Run(ctx, agent, "plan", harness.RunConfig{Sandbox: &harness.SandboxConfig{Session: sess}})
	if err != nil || res.FinalOutput != "planned" {
		t.Fatalf("%v %v", res, err)
	}
	var b strings.Builder
	if _, err := sess.ReadFile(ctx, "TODO.md", compute.ReadFileOptions{}, &b); err != nil || b.String() != "# Todo\n- [ ] write the tests\n" {
		t.Fatalf("TODO.md = %q, %v", b.String(), err)
	}
	req := srv.Requests()[0]
	if fmt.Sprint(req.Body["temperature"]) != "0.2" || !strings.Contains(req.Instructions(), "Keep a todo list with add_todo") || req.Tool("add_todo") == nil {
		t.Errorf("request: temperature %v, tool %v, instructions:\n%s", req.Body["temperature"], req.Tool("add_todo") != nil, req.Instructions())
	}
	// Without the filesystem capability the run refuses to start.
	_, err = (&harness.Runner{Model: m}).Run(ctx, &harness.Agent{Name: "x", Capabilities: []capability.Capability{Todo{Path: "TODO.md"}}}, "plan",
		harness.RunConfig{Sandbox: &harness.SandboxConfig{Session: sess}})
	if err == nil || !strings.Contains(err.Error(), "requires capability filesystem") {
		t.Fatalf("missing requirement: %v", err)
	}
}
