package skills_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/skills"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// runWith runs an agent with the skills capability against a scripted
// model and an in-process sandbox that is kept after the run; it returns
// the model's requests and the workspace directory.
func runWith(t *testing.T, s capability.Capability, workdir string, turns ...replay.Turn) ([]*replay.Request, string) {
	t.Helper()
	srv := replay.NewServer(turns...)
	t.Cleanup(srv.Close)
	m, err := model.NewOpenAI(model.Config{Model: "test-model", APIKey: "sk-test", BaseURL: srv.URL(),
		Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	prov := agentdtest.NewProvider(t, nil)
	client := compute.NewClient(prov, compute.ClientOptions{Log: zaptest.NewLogger(t)})
	a := &harness.Agent{Name: "writer", Instructions: "Write release notes.", Capabilities: []capability.Capability{s}}
	r := &harness.Runner{Model: m, Log: zaptest.NewLogger(t)}
	res, err := r.Run(ctxT(t), a, "write the release notes",
		harness.RunConfig{Sandbox: &harness.SandboxConfig{Client: client, Workdir: workdir, KeepSession: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalOutput != "Done." || res.SessionState == nil {
		t.Fatalf("result %q, state %v", res.FinalOutput, res.SessionState)
	}
	return srv.Requests(), prov.Workspace(res.SessionState.SessionID)
}

func TestRunLoadsSkillLazily(t *testing.T) {
	s, err := skills.New(skills.Options{Dir: sampleDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	reqs, ws := runWith(t, s, "repo",
		replay.Turn{Items: []replay.Item{replay.FunctionCall("call_1", "load_skill", `{"skill_name":"release-notes"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("Done.")}},
	)
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	if ins := reqs[0].Instructions(); !strings.Contains(ins, "# Sandbox capability instructions\n\n"+wantLazyIndex) {
		t.Errorf("instructions lack the index:\n%s", ins)
	}
	if reqs[0].Tool("load_skill") == nil {
		t.Errorf("tools %v", reqs[0].Tools())
	}
	outs := reqs[1].InputOfType("function_call_output")
	if len(outs) != 1 {
		t.Fatalf("outputs %v", outs)
	}
	var got skills.LoadResult
	if err := json.Unmarshal([]byte(outs[0]["output"].(string)), &got); err != nil {
		t.Fatal(err)
	}
	// With a working directory the path is absolute.
	if got.Status != "loaded" || got.Path != "/workspace/.agents/skills/release-notes" || got.Instructions != "Group changes by kind.\n" {
		t.Errorf("load_skill output %+v", got)
	}
	data, err := os.ReadFile(filepath.Join(ws, ".agents", "skills", "release-notes", "examples", "one.md"))
	if err != nil || string(data) != "- fixed a bug\n" {
		t.Errorf("staged resource: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(ws, ".agents", "skills", "pdf-tools")); !os.IsNotExist(err) {
		t.Errorf("an unloaded skill is in the workspace: %v", err)
	}
}

func TestRunStagesSkillsEagerly(t *testing.T) {
	s, err := skills.New(skills.Options{Dir: sampleDir(t), Mode: skills.Eager})
	if err != nil {
		t.Fatal(err)
	}
	reqs, ws := runWith(t, s, "", replay.Turn{Items: []replay.Item{replay.Message("Done.")}})
	ins := reqs[0].Instructions()
	if !strings.Contains(ins, "- pdf-tools: Extract text and tables from PDF files, and fill PDF forms. (file: .agents/skills/pdf-tools)") ||
		strings.Contains(ins, "load_skill") {
		t.Errorf("instructions:\n%s", ins)
	}
	// The workspace tree shown to the model has the skills with their
	// descriptions.
	if !strings.Contains(ins, "Extract text and tables from PDF files, and fill PDF forms.\n") {
		t.Errorf("tree lacks the skill description:\n%s", ins)
	}
	if reqs[0].Tool("load_skill") != nil {
		t.Error("load_skill offered in eager mode")
	}
	for _, rel := range []string{"pdf-tools/SKILL.md", "pdf-tools/scripts/extract.sh", "release-notes/examples/one.md"} {
		data, err := os.ReadFile(filepath.Join(ws, ".agents", "skills", filepath.FromSlash(rel)))
		if err != nil || string(data) != sampleFiles()[rel] {
			t.Errorf("%s: %q %v", rel, data, err)
		}
	}
}
