package skills_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/skills"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func TestDiscoverFromDirectory(t *testing.T) {
	s := load(t, skills.Options{Dir: sampleDir(t)})
	got := s.Bundles()
	want := []skills.Bundle{
		{Name: "pdf-tools", Description: "Extract text and tables from PDF files, and fill PDF forms.",
			Path:  ".agents/skills/pdf-tools",
			Files: []string{"SKILL.md", "assets/template.txt", "references/.keep-note", "references/forms.md", "scripts/extract.sh"}},
		{Name: "release-notes", Description: "Write release notes from a git log.", Path: ".agents/skills/release-notes",
			Files: []string{"SKILL.md", "examples/one.md"}},
	}
	for i := range got {
		if got[i].Size <= 0 {
			t.Errorf("%s: size %d", got[i].Name, got[i].Size)
		}
		got[i].Size = 0
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("bundles:\n got %+v\nwant %+v", got, want)
	}
	if s.Name() != "skills" {
		t.Errorf("name %q", s.Name())
	}
	// Without a session there is nothing to stage into: no tools, no text.
	c := s.Clone()
	if c.Tools(capability.Env{}) != nil || c.Instructions(capability.Env{}) != "" {
		t.Error("tools or instructions without a session")
	}
}

// wantLazyIndex is the whole lazy-mode fragment for sampleDir.
const wantLazyIndex = "## Skills\n" +
	"Skills are packaged instructions for particular kinds of work. Each skill is a directory whose `SKILL.md` says when and how to use it, sometimes with scripts, references or assets next to it. The list gives each skill's name, what it is for, and its directory (relative to the workspace root).\n" +
	"### Available skills\n" +
	"- pdf-tools: Extract text and tables from PDF files, and fill PDF forms. (file: .agents/skills/pdf-tools)\n" +
	"- release-notes: Write release notes from a git log. (file: .agents/skills/release-notes)\n" +
	"### Lazy loading\n" +
	"- The skills above are indexed but not yet in the workspace: their directories appear when you load them.\n" +
	"- Before using a skill, call `load_skill` with its name. It copies that one skill into its directory and returns the instructions of its `SKILL.md`; call it once for each skill you need.\n" +
	"- Loading a skill that is already in the workspace changes nothing and returns its instructions again.\n" +
	"### How to use skills\n" +
	"- Use a skill when the user names it, or when the task clearly matches its description. If several apply, use the smallest set that covers the task and say in one line which ones you use and why.\n" +
	"- To use a skill, load it with `load_skill` and follow the instructions it returns; they are also in `SKILL.md` in the skill's directory.\n" +
	"- Paths in a skill's instructions (`scripts/`, `references/`, `assets/`) are relative to the skill's directory, not to your working directory.\n" +
	"- Open other files of a skill only when its instructions point to them and the task needs them. Run a skill's scripts rather than retyping them, and reuse its templates and assets.\n" +
	"- Leave skill directories as they are unless the task is to change a skill: keep your inputs, outputs and scratch files in your working directory.\n" +
	"- If a skill is missing, cannot be read, or does not fit the task, say so briefly and continue with the best alternative."

// wantEagerIndex is the eager-mode fragment with a custom staging path.
const wantEagerIndex = "## Skills\n" +
	"Skills are packaged instructions for particular kinds of work. Each skill is a directory whose `SKILL.md` says when and how to use it, sometimes with scripts, references or assets next to it. The list gives each skill's name, what it is for, and its directory (relative to the workspace root).\n" +
	"### Available skills\n" +
	"- pdf-tools: Extract text and tables from PDF files, and fill PDF forms. (file: tools/skills/pdf-tools)\n" +
	"- release-notes: Write release notes from a git log. (file: tools/skills/release-notes)\n" +
	"### How to use skills\n" +
	"- Use a skill when the user names it, or when the task clearly matches its description. If several apply, use the smallest set that covers the task and say in one line which ones you use and why.\n" +
	"- To use a skill, read its `SKILL.md` first, and only as much of it as you need to follow it.\n" +
	"- Paths in a skill's instructions (`scripts/`, `references/`, `assets/`) are relative to the skill's directory, not to your working directory.\n" +
	"- Open other files of a skill only when its instructions point to them and the task needs them. Run a skill's scripts rather than retyping them, and reuse its templates and assets.\n" +
	"- Leave skill directories as they are unless the task is to change a skill: keep your inputs, outputs and scratch files in your working directory.\n" +
	"- If a skill is missing, cannot be read, or does not fit the task, say so briefly and continue with the best alternative."

func TestIndexText(t *testing.T) {
	dir := sampleDir(t)
	env := capability.Env{HasSession: true}
	lazy := load(t, skills.Options{Dir: dir}).Clone()
	if got := lazy.Instructions(env); got != wantLazyIndex {
		t.Errorf("lazy index:\n%s\n--- want ---\n%s", got, wantLazyIndex)
	}
	if tools := lazy.Tools(env); len(tools) != 1 || tools[0].Definition().Name != "load_skill" {
		t.Errorf("lazy tools: %v", tools)
	}
	eager := load(t, skills.Options{Dir: dir, Mode: skills.Eager, Path: "tools/skills"}).Clone()
	if got := eager.Instructions(env); got != wantEagerIndex {
		t.Errorf("eager index:\n%s\n--- want ---\n%s", got, wantEagerIndex)
	}
	if tools := eager.Tools(env); len(tools) != 0 {
		t.Errorf("eager mode has tools: %v", tools)
	}
}

func TestLoadSkillDefinition(t *testing.T) {
	s := load(t, skills.Options{Dir: sampleDir(t)})
	def := s.Clone().Tools(capability.Env{HasSession: true})[0].Definition()
	if def.Name != "load_skill" || !def.Strict || !strings.Contains(def.Description, "skill") {
		t.Errorf("definition %+v", def)
	}
	want := `{"type":"object","properties":{"skill_name":{"type":"string","description":"The name of one skill from the list of available skills."}},"required":["skill_name"],"additionalProperties":false}`
	if string(def.Parameters) != want {
		t.Errorf("schema %s", def.Parameters)
	}
}

func TestValidation(t *testing.T) {
	ok := skillMD("good", "Fine.", "body\n")
	cases := []struct {
		name  string
		files map[string]string
		opts  func(*skills.Options)
		setup func(t *testing.T, dir string)
		want  string // substring of the error
	}{
		{name: "no SKILL.md", files: map[string]string{"good/SKILL.md": ok, "other/notes.md": "x"},
			want: `bundle "other" in directory `},
		{name: "no SKILL.md message", files: map[string]string{"other/notes.md": "x"}, want: ": has no SKILL.md"},
		{name: "no frontmatter", files: map[string]string{"good/SKILL.md": "# Good\n"}, want: `bundle "good"`},
		{name: "no frontmatter message", files: map[string]string{"good/SKILL.md": "# Good\n"}, want: "SKILL.md: must start with a YAML frontmatter block"},
		{name: "unclosed frontmatter", files: map[string]string{"good/SKILL.md": "---\nname: good\ndescription: x\n"}, want: `no closing "---" line`},
		{name: "bad yaml", files: map[string]string{"good/SKILL.md": "---\nname: good\ndescription: [oops\n---\n"}, want: "not valid YAML"},
		{name: "no name", files: map[string]string{"good/SKILL.md": "---\ndescription: x\n---\n"}, want: `the frontmatter has no "name"`},
		{name: "no description", files: map[string]string{"good/SKILL.md": "---\nname: good\n---\n"}, want: `the frontmatter has no "description"`},
		{name: "empty description", files: map[string]string{"good/SKILL.md": skillMD("good", `"  "`, "")}, want: "the description is empty"},
		{name: "description not a string", files: map[string]string{"good/SKILL.md": "---\nname: good\ndescription: [a, b]\n---\n"}, want: `"description" must be a string`},
		{name: "long description", files: map[string]string{"good/SKILL.md": skillMD("good", strings.Repeat("x", 1025), "")}, want: "longer than 1024 bytes"},
		{name: "bad name", files: map[string]string{"Good_Skill/SKILL.md": skillMD("Good_Skill", "x", "")}, want: `name "Good_Skill" is not a valid skill name`},
		{name: "name mismatch", files: map[string]string{"good/SKILL.md": skillMD("other", "x", "")}, want: `names the skill "other"; the name must match the bundle's directory name`},
		{name: "not utf-8", files: map[string]string{"good/SKILL.md": "---\nname: good\ndescription: \xff\n---\n"}, want: "not valid UTF-8"},
		{name: "large SKILL.md", files: map[string]string{"good/SKILL.md": ok + strings.Repeat("x", 100)},
			opts: func(o *skills.Options) { o.MaxSkillFileBytes = 64 }, want: "SKILL.md is larger than 64 bytes"},
		{name: "large bundle", files: map[string]string{"good/SKILL.md": ok, "good/data.bin": strings.Repeat("x", 200)},
			opts: func(o *skills.Options) { o.MaxBundleBytes = 150 }, want: `bundle "good" in directory`},
		{name: "large bundle message", files: map[string]string{"good/SKILL.md": ok, "good/data.bin": strings.Repeat("x", 200)},
			opts: func(o *skills.Options) { o.MaxBundleBytes = 150 }, want: "its files together are larger than 150 bytes"},
		{name: "too many files", files: map[string]string{"good/SKILL.md": ok, "good/a": "", "good/b": ""},
			opts: func(o *skills.Options) { o.MaxBundleFiles = 2 }, want: "has more than 2 files"},
		{name: "total", files: map[string]string{"good/SKILL.md": ok, "more/SKILL.md": skillMD("more", "y", strings.Repeat("z", 100))},
			opts: func(o *skills.Options) { o.MaxTotalBytes = 100 }, want: "the skills together are larger than 100 bytes"},
		{name: "symlink in bundle", files: map[string]string{"good/SKILL.md": ok, "outside.txt": "secret"},
			setup: func(t *testing.T, dir string) { symlink(t, "../outside.txt", filepath.Join(dir, "good", "link.txt")) },
			want:  `"link.txt" is a symbolic link`},
		{name: "symlinked bundle", files: map[string]string{"real/SKILL.md": skillMD("real", "x", "")},
			setup: func(t *testing.T, dir string) { symlink(t, "real", filepath.Join(dir, "alias")) },
			want:  `bundle "alias" in directory`},
		{name: "symlinked SKILL.md", files: map[string]string{"good/body.md": ok},
			setup: func(t *testing.T, dir string) { symlink(t, "body.md", filepath.Join(dir, "good", "SKILL.md")) },
			want:  `"SKILL.md" is a symbolic link`},
		{name: "empty directory", files: map[string]string{"README.md": "x"}, want: "no skill bundles in directory"},
		{name: "no source", opts: func(o *skills.Options) { o.Dir = "" }, want: "no source"},
		{name: "bad path", files: map[string]string{"good/SKILL.md": ok},
			opts: func(o *skills.Options) { o.Path = "../skills" }, want: `staging path "../skills"`},
		{name: "absolute path", files: map[string]string{"good/SKILL.md": ok},
			opts: func(o *skills.Options) { o.Path = "/skills" }, want: "must be relative"},
		{name: "missing directory", opts: func(o *skills.Options) { o.Dir += "/nope" }, want: "opening the skills directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tc.files)
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			opts := skills.Options{Dir: dir}
			if tc.opts != nil {
				tc.opts(&opts)
			}
			_, err := skills.New(opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestBundleErrorIsTyped(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"good/SKILL.md": "---\nname: good\n---\n"})
	_, err := skills.New(skills.Options{Dir: dir})
	var be *skills.BundleError
	if !errors.As(err, &be) || be.Bundle != "good" || be.Source != "directory "+dir {
		t.Fatalf("error %#v", err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestGitSource(t *testing.T) {
	files := map[string]string{"README.md": "# repo\n"}
	for k, v := range sampleFiles() {
		files["skills/"+k] = v
	}
	repo := gitRepo(t, files)
	tmp := t.TempDir()
	fetcher := materializer.GitCLI{URL: func(*manifest.GitRepo) string { return repo }}
	git := &manifest.GitRepo{Repo: "acme/skills", Ref: "v1", Subpath: "skills"}
	s := load(t, skills.Options{Git: git, Fetcher: fetcher, TempDir: tmp})
	var names []string
	for _, b := range s.Bundles() {
		names = append(names, b.Name)
	}
	if !reflect.DeepEqual(names, []string{"pdf-tools", "release-notes"}) {
		t.Errorf("bundles %v", names)
	}
	if got := s.Clone().Instructions(capability.Env{HasSession: true}); got != wantLazyIndex {
		t.Errorf("index from git:\n%s", got)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("checkout left behind: %v", left)
	}

	t.Run("combined with a directory", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"lint/SKILL.md": skillMD("lint", "Lint the code.", "")})
		s := load(t, skills.Options{Dir: dir, Git: git, Fetcher: fetcher, TempDir: tmp})
		if n := len(s.Bundles()); n != 3 {
			t.Errorf("%d bundles", n)
		}
	})
	t.Run("duplicate across sources", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"pdf-tools/SKILL.md": skillMD("pdf-tools", "Mine.", "")})
		_, err := skills.Load(ctxT(t), skills.Options{Dir: dir, Git: git, Fetcher: fetcher, TempDir: tmp})
		want := `skills: two bundles are named "pdf-tools" (in directory ` + dir + ` and in git github.com/acme/skills@v1:skills)`
		if err == nil || err.Error() != want {
			t.Fatalf("error %v\nwant %s", err, want)
		}
	})
	t.Run("resolved token", func(t *testing.T) {
		g := *git
		tok := manifest.Secret("SKILLS_TOKEN").WithValue("ghp_notreal")
		g.Token = &tok
		load(t, skills.Options{Git: &g, Fetcher: fetcher, TempDir: tmp})
	})
	for _, tc := range []struct {
		name string
		edit func(g *manifest.GitRepo)
		want string
	}{
		{"unresolved token", func(g *manifest.GitRepo) { tok := manifest.Secret("SKILLS_TOKEN"); g.Token = &tok },
			"the token secret:SKILLS_TOKEN is not resolved"},
		{"unknown ref", func(g *manifest.GitRepo) { g.Ref = "v9" }, "skills: fetching git github.com/acme/skills@v9:skills: git fetch"},
		{"bad ref", func(g *manifest.GitRepo) { g.Ref = "--upload-pack=x" }, "ref: not a valid git ref"},
		{"escaping subpath", func(g *manifest.GitRepo) { g.Subpath = "../etc" }, "subpath:"},
		{"missing subpath", func(g *manifest.GitRepo) { g.Subpath = "nope" }, "skills: git github.com/acme/skills@v1:nope: subpath:"},
		{"no bundles at the top", func(g *manifest.GitRepo) { g.Subpath = "" }, `bundle "skills" in git github.com/acme/skills@v1: has no SKILL.md`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := *git
			tc.edit(&g)
			_, err := skills.Load(ctxT(t), skills.Options{Git: &g, Fetcher: fetcher, TempDir: tmp})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "ghp_") {
				t.Fatalf("error shows a token: %v", err)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("checkout left behind: %v", left)
			}
		})
	}
}
