package filesystem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// referenceGrammar is the Lark grammar of the Agents SDK sandbox's
// apply_patch tool (the Codex grammar with a mandatory change in an
// update), byte for byte.
const referenceGrammar = `start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
`

// golden compares got with testdata/name byte for byte (rewriting it
// under -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func tools(opts filesystem.Options) map[string]model.Tool {
	out := map[string]model.Tool{}
	for _, tl := range filesystem.New(opts).Tools(capability.Env{HasSession: true}) {
		out[tl.Definition().Name] = tl.Definition()
	}
	return out
}

func TestFreeformDefinition(t *testing.T) {
	def := tools(filesystem.Options{})["apply_patch"]
	if def.Kind != model.ToolCustom || def.Name != "apply_patch" || def.Parameters != nil || def.Strict {
		t.Fatalf("definition = %+v", def)
	}
	if def.Grammar == nil || def.Grammar.Syntax != "lark" {
		t.Fatalf("grammar = %+v", def.Grammar)
	}
	if def.Grammar.Definition != referenceGrammar || filesystem.ApplyPatchGrammar != referenceGrammar {
		t.Errorf("grammar differs from the reference:\n%s", def.Grammar.Definition)
	}
}

func TestJSONDefinition(t *testing.T) {
	def := tools(filesystem.Options{PatchFormat: filesystem.PatchJSON})["apply_patch"]
	if def.Kind != model.ToolFunction || def.Name != "apply_patch" || def.Grammar != nil || def.Strict {
		t.Fatalf("definition = %+v", def)
	}
	const want = `{"type":"object","properties":{"operations":{"type":"array","minItems":1,` +
		`"description":"File operations, applied in order and all together.",` +
		`"items":{"type":"object","properties":{` +
		`"type":{"type":"string","enum":["create_file","update_file","delete_file"],"description":"What to do with the file."},` +
		`"path":{"type":"string","minLength":1,"description":"The file, relative to the working directory."},` +
		`"diff":{"type":"string","description":"For create_file, the new file's lines each prefixed with '+'; for update_file, the hunks; omitted for delete_file."},` +
		`"move_to":{"type":"string","description":"For update_file only: the path the updated file is moved to."}},` +
		`"required":["type","path"],"additionalProperties":false}}},` +
		`"required":["operations"],"additionalProperties":false}`
	if string(def.Parameters) != want {
		t.Errorf("parameters:\n%s\nwant\n%s", def.Parameters, want)
	}
}

func TestViewImageDefinition(t *testing.T) {
	def := tools(filesystem.Options{})["view_image"]
	if def.Kind != model.ToolFunction || def.Name != "view_image" || def.Strict {
		t.Fatalf("definition = %+v", def)
	}
	const want = `{"type":"object","properties":{"path":{"type":"string","minLength":1,` +
		`"description":"The image file: relative to the working directory, or absolute inside the workspace."}},` +
		`"required":["path"],"additionalProperties":false}`
	if string(def.Parameters) != want {
		t.Errorf("parameters:\n%s\nwant\n%s", def.Parameters, want)
	}
}

// The tools exactly as the Responses API receives them, sent through the
// real model client to the scripted server, and a call the model makes
// there run through the tool.
func TestDefinitionsOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   filesystem.Options
		call   replay.Item
		golden string
	}{
		{"freeform", filesystem.Options{},
			replay.CustomToolCall("call_p", "apply_patch", "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"),
			"tools.freeform.json"},
		{"json", filesystem.Options{PatchFormat: filesystem.PatchJSON},
			replay.FunctionCall("call_p", "apply_patch", `{"operations":[{"type":"create_file","path":"hello.txt","diff":"+hello\n"}]}`),
			"tools.json.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := replay.NewServer(replay.Turn{Items: []replay.Item{tc.call}})
			t.Cleanup(srv.Close)
			m, err := model.NewOpenAI(model.Config{Model: "gpt-test", APIKey: "sk-test", BaseURL: srv.URL(),
				Retry: model.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			s := newSandbox(t, tc.opts)
			var defs []model.Tool
			for _, name := range []string{"apply_patch", "view_image"} {
				defs = append(defs, s.tools[name].Definition())
			}
			res, err := model.Respond(context.Background(), m, &model.Request{Input: []model.Item{model.UserMessage("hi")}, Tools: defs})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Err(); err != nil {
				t.Fatal(err)
			}
			var wire bytes.Buffer
			enc := json.NewEncoder(&wire)
			enc.SetEscapeHTML(false)
			enc.SetIndent("", "  ")
			if err := enc.Encode(srv.Requests()[0].Tools()); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, wire.Bytes())

			calls := res.ToolCalls()
			if len(calls) != 1 {
				t.Fatalf("calls = %+v", calls)
			}
			input := calls[0].Input
			if calls[0].Kind == model.ItemFunctionCall {
				input = calls[0].Arguments
			}
			out := s.call("apply_patch", "", input)
			if out.IsError || out.Output != "Created hello.txt" || s.read("hello.txt") != "hello\n" {
				t.Fatalf("result %+v, file %q", out, s.read("hello.txt"))
			}
		})
	}
}

func TestInstructions(t *testing.T) {
	for _, tc := range []struct {
		opts   filesystem.Options
		golden string
	}{
		{filesystem.Options{}, "instructions.freeform.txt"},
		{filesystem.Options{PatchFormat: filesystem.PatchJSON}, "instructions.json.txt"},
	} {
		got := filesystem.New(tc.opts).Instructions(capability.Env{HasSession: true})
		golden(t, tc.golden, []byte(got))
	}
}

func TestCapability(t *testing.T) {
	c := filesystem.New(filesystem.Options{})
	if c.Name() != "filesystem" {
		t.Errorf("name = %q", c.Name())
	}
	clone := c.Clone()
	if clone == c {
		t.Error("Clone returned the same value")
	}
	var names []string
	for _, tl := range clone.Tools(capability.Env{HasSession: true}) {
		names = append(names, tl.Definition().Name)
	}
	if len(names) != 2 || names[0] != "apply_patch" || names[1] != "view_image" {
		t.Errorf("tools = %v", names)
	}
	if got := clone.Tools(capability.Env{}); len(got) != 0 {
		t.Errorf("tools without a session = %d", len(got))
	}
	if got := clone.Instructions(capability.Env{}); got != "" {
		t.Errorf("instructions without a session = %q", got)
	}
	if m, err := clone.ProcessManifest(nil); m != nil || err != nil {
		t.Errorf("ProcessManifest(nil) = %v, %v", m, err)
	}
}
