package skills_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/skills"
)

// skillMD returns a SKILL.md with the given frontmatter name and
// description and body.
func skillMD(name, description, body string) string {
	return "---\nname: " + name + "\ndescription: " + description + "\n---\n\n" + body
}

// writeFiles writes files (slash paths relative to dir) with mode 0644,
// or 0755 for paths ending in ".sh".
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if filepath.Ext(rel) == ".sh" {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
}

// sampleFiles are two bundles (pdf-tools with resources, and
// release-notes), a README and a hidden directory that are not bundles.
func sampleFiles() map[string]string {
	return map[string]string{
		"pdf-tools/SKILL.md":              "---\nname: pdf-tools\ndescription: >\n  Extract text and tables from PDF files,\n  and fill PDF forms.\nlicense: MIT\n---\n\n# PDF tools\n\nRun `scripts/extract.sh <file>`; see references/forms.md for forms.\n",
		"pdf-tools/scripts/extract.sh":    "#!/bin/sh\necho extracting \"$1\"\n",
		"pdf-tools/references/forms.md":   "# Forms\n",
		"pdf-tools/assets/template.txt":   "TEMPLATE\n",
		"release-notes/SKILL.md":          skillMD("release-notes", `"Write release notes from a git log."`, "Group changes by kind.\n"),
		"README.md":                       "# Our skills\n",
		".github/workflows/ci.yml":        "on: push\n",
		".hidden-bundle/SKILL.md":         "not a bundle",
		"release-notes/examples/one.md":   "- fixed a bug\n",
		"pdf-tools/references/.keep-note": "",
	}
}

// sampleDir writes sampleFiles into a temporary directory.
func sampleDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, sampleFiles())
	return dir
}

// load builds the capability or fails the test.
func load(t *testing.T, opts skills.Options) *skills.Skills {
	t.Helper()
	s, err := skills.Load(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// gitRepo makes a local repository whose files are files, tagged v1, and
// returns its path.
func gitRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	testenv.Require(t, testenv.Git)
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	run("init", "--quiet", "--initial-branch=main")
	writeFiles(t, dir, files)
	run("add", ".")
	run("commit", "--quiet", "-m", "skills")
	run("tag", "v1")
	return dir
}
