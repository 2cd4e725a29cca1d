package cli

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// execute runs the command line with a fresh state directory and returns
// the exit code, stdout and stderr.
func execute(t *testing.T, state string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Execute(t.Context(), append([]string{"--state-dir", state}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

// TestErrorLinesSayThingsOnce: the error line names the command once
// (Execute prefixes its path; the command adds no "cp:" or "snapshot rm:"
// of its own), and a YAML syntax error points at the line the fault is on.
func TestErrorLinesSayThingsOnce(t *testing.T) {
	state := t.TempDir()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("root: /workspace\nentries:\n  a.txt:\n    type: file\n   content: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string // the whole stderr line
	}{
		{[]string{"sandbox", "cp", "a:x", "b:y"}, "harness sandbox cp: both a:x and b:y are sandbox paths; copy through a local path"},
		{[]string{"sandbox", "cp", "x", "y"}, "harness sandbox cp: neither x nor y is a sandbox path (ID:PATH)"},
		{[]string{"sandbox", "snapshot", "rm", "nope"}, "harness sandbox snapshot rm: no snapshot nope in the store"},
		{[]string{"sandbox", "create", "--isolation", "none", "--manifest", bad},
			"harness sandbox create: " + bad + ": manifest: invalid YAML: did not find expected key (line 5)"},
		{[]string{"run", "--manifest", bad, "x"}, "harness run: " + bad + ": manifest: invalid YAML: did not find expected key (line 5)"},
		{[]string{"run", "--resume", filepath.Join(dir, "none.json")}, "harness run: --resume: open " + filepath.Join(dir, "none.json") + ": no such file or directory"},
	}
	for _, c := range cases {
		code, _, errs := execute(t, state, c.args...)
		if code == 0 || strings.TrimSpace(errs) != c.want {
			t.Errorf("%v: exit %d, stderr\n  %q\nwant\n  %q", c.args, code, strings.TrimSpace(errs), c.want)
		}
	}
}

// TestNoLibraryFieldsInErrors: without an API key, harness run names the
// variable to set, not the library's Config.APIKey.
func TestNoLibraryFieldsInErrors(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	code, _, errs := execute(t, t.TempDir(), "run", "x")
	if code == 0 || strings.Contains(errs, "Config.") || !strings.Contains(errs, "set OPENAI_API_KEY") || strings.Count(errs, "OPENAI_API_KEY") != 1 {
		t.Errorf("run without a key: exit %d, %q", code, errs)
	}
}

func TestUserMessage(t *testing.T) {
	cases := []struct{ path, msg, want string }{
		{"harness sandbox cp", "cp: stat /x: no such file", "stat /x: no such file"},
		{"harness sandbox snapshot rm", "snapshot rm: no snapshot x", "no snapshot x"},
		{"harness run", "m.yaml: manifest: manifest: invalid", "m.yaml: manifest: invalid"},
		{"harness run", "turn 2: model:\n  refused", "turn 2: model: refused"},
		{"harness sandbox create", "entry x: host sources need a trusted base directory (materializer.Options.BaseDir)",
			"entry x: host sources need a trusted base directory (--base-dir, or --manifest: host sources are read below its directory)"},
		{"harness sandbox create", "mount m (s3://b) holds more than 5 bytes (the limit, mount.Config.MaxBytes); nothing was written",
			"mount m (s3://b) holds more than 5 bytes (the limit, --mount-max-bytes); nothing was written"},
		{"harness sandbox cp", "x: x", "x: x"}, // the message itself is kept
	}
	for _, c := range cases {
		if got := userMessage(c.path, c.msg); got != c.want {
			t.Errorf("userMessage(%q, %q) = %q, want %q", c.path, c.msg, got, c.want)
		}
	}
}

// TestLibraryWordsStillSaid: every library text libraryWords translates is
// still in some library's source, so that the table follows when a message
// changes.
func TestLibraryWordsStillSaid(t *testing.T) {
	var src strings.Builder
	root := repoFile(t, "pkg")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		src.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(libraryWords); i += 2 {
		if !strings.Contains(src.String(), libraryWords[i]) {
			t.Errorf("no library says %q any more: update libraryWords", libraryWords[i])
		}
	}
}
