package skills_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/skills"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// loadTool returns the load_skill tool of a fresh clone (a new run).
func loadTool(t *testing.T, s *skills.Skills) tool.Tool {
	t.Helper()
	tools := s.Clone().Tools(capability.Env{HasSession: true})
	if len(tools) != 1 {
		t.Fatalf("%d tools", len(tools))
	}
	return tools[0]
}

// callLoad calls the tool and fails the test on a harness error.
func callLoad(t *testing.T, tl tool.Tool, d *agentdtest.Daemon, input string) tool.Result {
	t.Helper()
	res, err := tl.Call(context.Background(), tool.Context{Agent: d.Client, CallID: "call_1", Log: zaptest.NewLogger(t)}, input)
	if err != nil {
		t.Fatalf("load_skill: harness error: %v", err)
	}
	return res
}

func decode(t *testing.T, res tool.Result) skills.LoadResult {
	t.Helper()
	if res.IsError {
		t.Fatalf("load_skill failed: %s", res.Output)
	}
	var out skills.LoadResult
	if err := json.Unmarshal([]byte(res.Output), &out); err != nil {
		t.Fatalf("output %q: %v", res.Output, err)
	}
	return out
}

func TestLoadSkillStagesBundle(t *testing.T) {
	d := agentdtest.Start(t, nil)
	s := load(t, skills.Options{Dir: sampleDir(t)})
	tl := loadTool(t, s)
	skillDir := filepath.Join(d.Workspace, ".agents", "skills", "pdf-tools")

	// Nothing is staged before the model asks.
	if _, err := os.Stat(filepath.Join(d.Workspace, ".agents")); !os.IsNotExist(err) {
		t.Fatalf(".agents exists before load_skill: %v", err)
	}
	res := callLoad(t, tl, d, `{"skill_name":"pdf-tools"}`)
	got := decode(t, res)
	want := skills.LoadResult{Status: "loaded", SkillName: "pdf-tools", Path: ".agents/skills/pdf-tools",
		Files:        []string{"SKILL.md", "assets/template.txt", "references/.keep-note", "references/forms.md", "scripts/extract.sh"},
		Instructions: "# PDF tools\n\nRun `scripts/extract.sh <file>`; see references/forms.md for forms.\n"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("result:\n got %+v\nwant %+v", got, want)
	}
	if !strings.HasPrefix(res.Output, `{"status":"loaded","skill_name":"pdf-tools","path":".agents/skills/pdf-tools",`) {
		t.Errorf("output shape: %s", res.Output)
	}
	for rel, content := range sampleFiles() {
		if !strings.HasPrefix(rel, "pdf-tools/") {
			continue
		}
		p := filepath.Join(d.Workspace, ".agents", "skills", filepath.FromSlash(rel))
		data, err := os.ReadFile(p)
		if err != nil || string(data) != content {
			t.Errorf("%s: %q %v", rel, data, err)
		}
	}
	for rel, mode := range map[string]fs.FileMode{"scripts/extract.sh": 0o755, "SKILL.md": 0o644, "references/forms.md": 0o644} {
		fi, err := os.Stat(filepath.Join(skillDir, filepath.FromSlash(rel)))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v %v; want %v", rel, fi.Mode().Perm(), err, mode)
		}
	}
	// Only the requested skill was staged.
	if _, err := os.Stat(filepath.Join(d.Workspace, ".agents", "skills", "release-notes")); !os.IsNotExist(err) {
		t.Errorf("release-notes staged too: %v", err)
	}

	// A second load, in this run or in a later one on the same workspace,
	// finds the skill there and rewrites nothing (edits in the workspace
	// survive).
	must(t, os.WriteFile(filepath.Join(skillDir, "SKILL.md"), []byte("edited"), 0o644))
	must(t, os.Remove(filepath.Join(skillDir, "assets", "template.txt")))
	for _, tl := range []tool.Tool{tl, loadTool(t, s)} {
		got := decode(t, callLoad(t, tl, d, `{"skill_name":"pdf-tools"}`))
		if got.Status != "already_loaded" || got.Path != ".agents/skills/pdf-tools" || got.Instructions != want.Instructions {
			t.Errorf("second load: %+v", got)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(skillDir, "SKILL.md")); string(data) != "edited" {
		t.Errorf("SKILL.md rewritten: %q", data)
	}
	if _, err := os.Stat(filepath.Join(skillDir, "assets", "template.txt")); !os.IsNotExist(err) {
		t.Errorf("template rewritten: %v", err)
	}
}

func TestLoadSkillCompletesInterruptedLoad(t *testing.T) {
	d := agentdtest.Start(t, nil)
	s := load(t, skills.Options{Dir: sampleDir(t)})
	// A resource was written, SKILL.md (always written last) was not.
	dir := filepath.Join(d.Workspace, ".agents", "skills", "release-notes", "examples")
	must(t, os.MkdirAll(dir, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "one.md"), []byte("partial"), 0o644))
	got := decode(t, callLoad(t, loadTool(t, s), d, `{"skill_name": "release-notes"}`))
	if got.Status != "loaded" {
		t.Errorf("status %q", got.Status)
	}
	for rel, want := range map[string]string{"examples/one.md": "- fixed a bug\n", "SKILL.md": sampleFiles()["release-notes/SKILL.md"]} {
		data, err := os.ReadFile(filepath.Join(d.Workspace, ".agents", "skills", "release-notes", filepath.FromSlash(rel)))
		if err != nil || string(data) != want {
			t.Errorf("%s: %q %v", rel, data, err)
		}
	}
}

func TestLoadSkillErrors(t *testing.T) {
	d := agentdtest.Start(t, nil)
	s := load(t, skills.Options{Dir: sampleDir(t)})
	tl := loadTool(t, s)
	for input, want := range map[string]string{
		`{"skill_name":"pdf"}`:    `load_skill: there is no skill named "pdf"; the available skills are: pdf-tools, release-notes`,
		`{"skill_name":"../etc"}`: `load_skill: there is no skill named "../etc"; the available skills are: pdf-tools, release-notes`,
		`{"skill_name":""}`:       `load_skill: there is no skill named ""; the available skills are: pdf-tools, release-notes`,
		`pdf-tools`:               `load_skill: the arguments must be a JSON object {"skill_name": "<name>"}: `,
	} {
		res := callLoad(t, tl, d, input)
		if !res.IsError || !strings.HasPrefix(res.Output, want) {
			t.Errorf("%s: %+v; want an error starting %q", input, res, want)
		}
	}
	if entries, _ := os.ReadDir(d.Workspace); len(entries) != 0 {
		t.Errorf("failed loads wrote %v", entries)
	}

	// A file where the skills directory should be: the model is told, the
	// run goes on.
	must(t, os.WriteFile(filepath.Join(d.Workspace, ".agents"), []byte("x"), 0o644))
	res := callLoad(t, tl, d, `{"skill_name":"pdf-tools"}`)
	if !res.IsError || !strings.HasPrefix(res.Output, `load_skill: could not stage skill "pdf-tools" in .agents/skills/pdf-tools: `) {
		t.Errorf("blocked path: %+v", res)
	}

	// Without a sandbox the call is a harness error.
	if _, err := tl.Call(context.Background(), tool.Context{Log: zaptest.NewLogger(t)}, `{"skill_name":"pdf-tools"}`); err == nil {
		t.Error("no error without a sandbox")
	}
}

func TestEagerManifest(t *testing.T) {
	s := load(t, skills.Options{Dir: sampleDir(t), Mode: skills.Eager})
	in := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md": {Type: manifest.TypeFile, Content: []byte("do it")},
		".agents": {Type: manifest.TypeDir, Children: map[string]*manifest.Entry{"notes.md": {Type: manifest.TypeFile}}},
	}}
	before := in.Clone()
	out, err := s.Clone().ProcessManifest(in)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, before) {
		t.Error("ProcessManifest modified its input")
	}
	if err := out.Validate(); err != nil {
		t.Fatalf("result does not validate: %v", err)
	}
	var paths []string
	must(t, out.Walk(func(p string, e *manifest.Entry) error {
		if !strings.HasPrefix(p, ".agents/skills/") {
			return nil
		}
		if e.Type.IsHostSource() || e.Src != "" {
			t.Errorf("%s: host source in the manifest", p)
		}
		paths = append(paths, p+" "+string(e.Type)+" "+e.EffectivePermissions().String())
		return nil
	}))
	want := []string{
		".agents/skills/pdf-tools dir drwxr-xr-x",
		".agents/skills/pdf-tools/SKILL.md file -rw-r--r--",
		".agents/skills/pdf-tools/assets dir drwxr-xr-x",
		".agents/skills/pdf-tools/assets/template.txt file -rw-r--r--",
		".agents/skills/pdf-tools/references dir drwxr-xr-x",
		".agents/skills/pdf-tools/references/.keep-note file -rw-r--r--",
		".agents/skills/pdf-tools/references/forms.md file -rw-r--r--",
		".agents/skills/pdf-tools/scripts dir drwxr-xr-x",
		".agents/skills/pdf-tools/scripts/extract.sh file -rwxr-xr-x",
		".agents/skills/release-notes dir drwxr-xr-x",
		".agents/skills/release-notes/SKILL.md file -rw-r--r--",
		".agents/skills/release-notes/examples dir drwxr-xr-x",
		".agents/skills/release-notes/examples/one.md file -rw-r--r--",
	}
	if !reflect.DeepEqual(paths, want) {
		t.Errorf("entries:\n%s\nwant\n%s", strings.Join(paths, "\n"), strings.Join(want, "\n"))
	}
	if e := out.Lookup(".agents/skills/pdf-tools"); e == nil || e.Description != "Extract text and tables from PDF files, and fill PDF forms." {
		t.Errorf("skill dir entry %v", e)
	}
	if e := out.Lookup(".agents/skills/release-notes/SKILL.md"); e == nil || string(e.Content) != sampleFiles()["release-notes/SKILL.md"] {
		t.Errorf("SKILL.md entry %v", e)
	}

	// Materialized, the skills are in the workspace.
	d := agentdtest.Start(t, nil)
	if _, err := materializer.Apply(ctxT(t), d.Client, out, materializer.Options{}); err != nil {
		t.Fatal(err)
	}
	for rel, content := range sampleFiles() {
		if !strings.HasPrefix(rel, "pdf-tools/") && !strings.HasPrefix(rel, "release-notes/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(d.Workspace, ".agents", "skills", filepath.FromSlash(rel)))
		if err != nil || string(data) != content {
			t.Errorf("%s: %q %v", rel, data, err)
		}
	}
}

func TestManifestConflicts(t *testing.T) {
	dir := sampleDir(t)
	lazy := load(t, skills.Options{Dir: dir})
	eager := load(t, skills.Options{Dir: dir, Mode: skills.Eager})
	file := func(string) *manifest.Entry { return &manifest.Entry{Type: manifest.TypeFile} }
	for _, tc := range []struct {
		name    string
		entries map[string]*manifest.Entry
		lazyErr string // "" means accepted
		eager   string
	}{
		{"unrelated", map[string]*manifest.Entry{"src/main.go": file("")}, "", ""},
		{"parent dir", map[string]*manifest.Entry{".agents": {Type: manifest.TypeDir}}, "", ""},
		{"another skill", map[string]*manifest.Entry{".agents/skills/mine/SKILL.md": file("")},
			`skills: the manifest already has an entry at ".agents/skills/mine/SKILL.md", where skills are staged (.agents/skills)`, ""},
		{"same skill", map[string]*manifest.Entry{".agents/skills/pdf-tools": {Type: manifest.TypeDir}},
			`already has an entry at ".agents/skills/pdf-tools"`,
			`skills: the manifest already has an entry at ".agents/skills/pdf-tools", where skills are staged (.agents/skills/pdf-tools)`},
		{"file above", map[string]*manifest.Entry{".agents": file("")},
			`skills: the manifest's file entry ".agents" is above ".agents/skills", where skills are staged; only a dir entry may be there`,
			`the manifest's file entry ".agents" is above ".agents/skills/pdf-tools"`},
		{"copied tree above", map[string]*manifest.Entry{".agents": {Type: manifest.TypeLocalDir, Src: "agents"}},
			`local_dir entry ".agents" is above`, `local_dir entry ".agents" is above`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range []struct {
				s    *skills.Skills
				want string
			}{{lazy, tc.lazyErr}, {eager, tc.eager}} {
				m := &manifest.Manifest{Entries: tc.entries}
				out, err := c.s.Clone().ProcessManifest(m)
				switch {
				case c.want == "" && err != nil:
					t.Errorf("rejected: %v", err)
				case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
					t.Errorf("error %v; want %q", err, c.want)
				case err == nil && c.s == lazy && out != m:
					t.Error("lazy mode changed the manifest")
				}
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
