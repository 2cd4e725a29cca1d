package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// fileTools are tools writing and reading workspace files through the daemon.
func fileTools() []tool.Tool {
	schema := []byte(`{"type":"object","properties":{"path":{"type":"string"},"text":{"type":"string"}},"required":["path"]}`)
	return []tool.Tool{
		tool.Func{Def: model.FunctionTool("put", "Write a file.", schema, false),
			Fn: func(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
				var a struct{ Path, Text string }
				_ = json.Unmarshal([]byte(input), &a)
				if _, err := call.Agent.WriteFile(ctx, a.Path, compute.WriteFileOptions{CreateParents: true, User: call.RunAs}, strings.NewReader(a.Text)); err != nil {
					return tool.Result{Output: err.Error(), IsError: true}, nil
				}
				return tool.Result{Output: "wrote " + a.Path}, nil
			}},
		tool.Func{Def: model.FunctionTool("get", "Read a file.", schema, false),
			Fn: func(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
				var a struct{ Path string }
				_ = json.Unmarshal([]byte(input), &a)
				var b bytes.Buffer
				if _, err := call.Agent.ReadFile(ctx, a.Path, compute.ReadFileOptions{}, &b); err != nil {
					return tool.Result{Output: err.Error(), IsError: true}, nil
				}
				return tool.Result{Output: b.String()}, nil
			}},
	}
}

func outputsOf(r *replay.Request) map[string]string {
	out := map[string]string{}
	for _, o := range r.InputOfType("function_call_output") {
		s, _ := o["output"].(string)
		out[o["call_id"].(string)] = s
	}
	return out
}

func TestApprovalStopsAndResumesInAnotherProcess(t *testing.T) {
	srv, m := testModel(t,
		replay.Turn{Items: []replay.Item{
			replay.FunctionCall("c1", "put", `{"path":"pre.txt","text":"before approval"}`),
			replay.FunctionCall("c2", "put", `{"path":"risky.txt","text":"approved"}`)}},
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c3", "get", `{"path":"pre.txt"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("all done")}},
	)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	prov, client := sandboxClient(t, store)
	newAgent := func() *Agent {
		return &Agent{Name: "ops", Tools: fileTools(), Capabilities: []capability.Capability{},
			Approvals: map[string]ApprovalPolicy{"put": func(_ context.Context, c ToolCall) (bool, error) {
				return strings.Contains(c.Input, "risky"), nil
			}}}
	}
	res, err := (&Runner{Model: m}).Run(ctxT(t), newAgent(), "go", RunConfig{Sandbox: &SandboxConfig{Client: client}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Interruptions) != 1 || res.Interruptions[0].Call.ID != "c2" || res.State == nil {
		t.Fatalf("interruptions %v state %v", res.Interruptions, res.State)
	}
	// The session was persisted and left running for the resume.
	st := res.State
	if prov.Live() != 1 || st.Sessions["ops"] == nil || st.Sessions["ops"].Fingerprint == "" {
		t.Fatalf("session after interruption: live %d state %+v", prov.Live(), st.Sessions)
	}
	data, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox is lost meanwhile: the resume rebuilds it from its snapshot.
	if err := prov.Destroy(ctxT(t), st.Sessions["ops"].ProviderState); err != nil {
		t.Fatal(err)
	}

	// "Another process": a decoded state, a new agent value and runner.
	st2, err := DecodeRunState(data)
	if err != nil {
		t.Fatal(err)
	}
	// Resuming without a decision stops again without calling the model.
	res, err = (&Runner{Model: m}).Resume(ctxT(t), newAgent(), st2, RunConfig{Sandbox: &SandboxConfig{Client: client}})
	if err != nil || len(res.Interruptions) != 1 || len(srv.Requests()) != 1 {
		t.Fatalf("undecided resume: %v, %v, %d requests", res.Interruptions, err, len(srv.Requests()))
	}
	st2 = res.State
	if err := st2.Approve("nope"); !errors.Is(err, ErrUnknownCall) {
		t.Fatalf("approve unknown: %v", err)
	}
	if err := st2.Approve("c2"); err != nil {
		t.Fatal(err)
	}
	res, err = (&Runner{Model: m}).Resume(ctxT(t), newAgent(), st2, RunConfig{Sandbox: &SandboxConfig{Client: client}})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalOutput != "all done" || res.Turns != 3 {
		t.Fatalf("final %q after %d turns", res.FinalOutput, res.Turns)
	}
	reqs := srv.Requests()
	if got := outputsOf(reqs[1]); got["c1"] != "wrote pre.txt" || got["c2"] != "wrote risky.txt" {
		t.Fatalf("outputs sent after approval: %v", got)
	}
	if got := outputsOf(reqs[2]); got["c3"] != "before approval" {
		t.Fatalf("the rebuilt sandbox lost pre.txt: %v", got)
	}
	if prov.Live() != 0 {
		t.Fatalf("the finished run left %d sandboxes", prov.Live())
	}
}

func TestRejectionIsShownToTheModel(t *testing.T) {
	srv, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", `{"cmd":"rm -rf /data"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("understood")}})
	exec := tool.Func{Def: model.FunctionTool("exec_command", "run", []byte(`{"type":"object"}`), false),
		Fn: func(context.Context, tool.Context, string) (tool.Result, error) {
			t.Error("a rejected call ran")
			return tool.Result{}, nil
		}}
	a := &Agent{Name: "a", Tools: []tool.Tool{exec},
		Approvals: map[string]ApprovalPolicy{"exec_command": CommandsOutside(regexp.MustCompile(`go test .*`), regexp.MustCompile(`ls( .*)?`))}}
	res, err := (&Runner{Model: m}).Run(ctxT(t), a, "x", RunConfig{})
	if err != nil || len(res.Interruptions) != 1 {
		t.Fatalf("%v %v", res, err)
	}
	if err := res.State.Reject("c1", "Deleting /data is not allowed."); err != nil {
		t.Fatal(err)
	}
	res, err = (&Runner{Model: m}).Resume(ctxT(t), a, res.State, RunConfig{})
	if err != nil || res.FinalOutput != "understood" {
		t.Fatalf("%v %v", res, err)
	}
	if got := outputsOf(srv.Requests()[1])["c1"]; got != "Deleting /data is not allowed." {
		t.Fatalf("rejection output %q", got)
	}
	// The policy lets matching commands through.
	need, _ := CommandsOutside(regexp.MustCompile(`go test .*`))(context.Background(), ToolCall{Input: `{"cmd":"go test ./..."}`})
	needEvil, _ := CommandsOutside(regexp.MustCompile(`go test .*`))(context.Background(), ToolCall{Input: `{"cmd":"go test ./...; rm -rf /"}`})
	if need || !needEvil {
		t.Fatalf("policy: %v %v", need, needEvil)
	}
}

func TestRunStateDecoding(t *testing.T) {
	for _, bad := range []string{`{}`, `{"version":2,"agent":"a"}`, `{"version":1}`, `{"version":1,"agent":"a","extra":1}`, `not json`} {
		if _, err := DecodeRunState([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestHandoffToASandboxAgent(t *testing.T) {
	srv, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("h1", "transfer_to_coder", `{}`)}},
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "put", `{"path":"out.txt","text":"code"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("coded")}})
	prov, client := sandboxClient(t, nil)
	coder := &Agent{Name: "coder", Instructions: "You write code.", HandoffDescription: "For coding tasks.", Tools: fileTools(),
		Capabilities: []capability.Capability{}}
	triage := &Agent{Name: "triage", Instructions: "Route the task.", NoSandbox: true, Handoffs: []*Agent{coder}}
	res, err := (&Runner{Model: m}).Run(ctxT(t), triage, "write code", RunConfig{Sandbox: &SandboxConfig{Client: client}})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalOutput != "coded" || res.Agent != "coder" {
		t.Fatalf("final %q by %q", res.FinalOutput, res.Agent)
	}
	reqs := srv.Requests()
	if reqs[0].Instructions() != "Route the task." || reqs[0].Tool("transfer_to_coder") == nil || reqs[0].Tool("put") != nil {
		t.Errorf("triage request: %q tools %v", reqs[0].Instructions(), reqs[0].Tools())
	}
	if !strings.Contains(reqs[1].Instructions(), "# Agent instructions\n\nYou write code.") || reqs[1].Tool("put") == nil {
		t.Errorf("coder request: %q", reqs[1].Instructions())
	}
	if got := outputsOf(reqs[1])["h1"]; got != `{"assistant": "coder"}` {
		t.Errorf("handoff output %q", got)
	}
	// Only the sandbox agent got a session, and the runner cleaned it up.
	if prov.Launched != 1 || prov.Live() != 0 {
		t.Errorf("sessions: launched %d live %d", prov.Launched, prov.Live())
	}
}

func TestAgentKeysAreStableWithDuplicateNames(t *testing.T) {
	w1, w2 := &Agent{Name: "worker"}, &Agent{Name: "worker"}
	lead := &Agent{Name: "lead", Handoffs: []*Agent{w1, w2}}
	w1.Handoffs = []*Agent{lead}
	keys := AgentKeys(lead)
	if keys[lead] != "lead" || keys[w1] != "worker" || keys[w2] != "worker#2" || len(keys) != 3 {
		t.Fatalf("keys %v", keys)
	}
}

func TestAgentAsToolSharingTheSession(t *testing.T) {
	testenv.Require(t, testenv.Root) // running tools as another account needs a root daemon
	srv, m := testModel(t,
		replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "explorer", `{"input":"look around"}`)}},                // coordinator
		replay.Turn{Items: []replay.Item{replay.FunctionCall("e1", "put", `{"path":"notes/explorer.txt","text":"seen"}`)}}, // explorer
		replay.Turn{Items: []replay.Item{replay.Message("explored: 1 file")}},                                              // explorer
		replay.Turn{Items: []replay.Item{replay.Message("done")}})                                                          // coordinator
	prov, client := sandboxClient(t, nil)
	r := &Runner{Model: m}
	explorer := &Agent{Name: "explorer", Instructions: "Explore.", Tools: fileTools(), Capabilities: []capability.Capability{}}
	coordinator := &Agent{Name: "coordinator", Capabilities: []capability.Capability{},
		Tools:           []tool.Tool{explorer.AsTool(AsToolOptions{Runner: r, ShareSession: true, RunAs: "nobody", MaxTurns: 5})},
		DefaultManifest: &manifest.Manifest{Entries: map[string]*manifest.Entry{"notes": {Type: manifest.TypeDir, Permissions: permsOf(0o777)}}}}
	var ws string
	res, err := r.Run(ctxT(t), coordinator, "coordinate", RunConfig{Sandbox: &SandboxConfig{Client: client,
		OnSession: func(_ context.Context, s *compute.Session) error { ws = prov.Workspace(s.ID()); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalOutput != "done" {
		t.Fatalf("final %q", res.FinalOutput)
	}
	if got := outputsOf(srv.Requests()[3])["c1"]; got != "explored: 1 file" {
		t.Fatalf("agent tool output %q", got)
	}
	fi, err := os.Stat(filepath.Join(ws, "notes", "explorer.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
		t.Errorf("the explorer wrote as uid %d, want nobody (65534)", uid)
	}
	// One session for both; the nested run did not tear it down early.
	if prov.Launched != 1 {
		t.Errorf("launched %d sessions", prov.Launched)
	}
}

func permsOf(m os.FileMode) *manifest.Permissions {
	p := manifest.PermissionsFromMode(m)
	return &p
}
