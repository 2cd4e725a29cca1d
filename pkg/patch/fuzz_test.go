package patch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzSeedPatches are small patches exercising each part of the format.
var fuzzSeedPatches = []string{
	envelope("*** Add File: new.txt", "+hello", "+"),
	envelope("*** Update File: a.txt", "@@ two", "-three", "+THREE", " four", "*** End of File"),
	envelope("*** Update File: a.txt", "*** Move to: dir/c.txt", "", "@@", "+x", "@@ one", "@@ two", "+y"),
	envelope("*** Delete File: dir/b.txt", "*** Add File: dir/b.txt/c", "+z"),
	envelope("*** Update File: a.txt", "-one", "+1", "", "@@ -1,2 +1,2 @@", " four", "+five"),
	"<<'EOF'\n" + envelope("*** Update File: dir/b.txt", "-b1", "+“b1”") + "EOF",
}

// patchFileSet returns the set of paths a parsed patch names.
func patchFileSet(p *Patch) map[string]bool {
	set := map[string]bool{}
	for _, path := range p.Paths() {
		set[path] = true
	}
	return set
}

// addScenarioSeeds adds the shared scenarios' patches (and first input file)
// to the corpus when they are present.
func addScenarioSeeds(f *testing.F, add func(patch, file string)) {
	dirs, _ := filepath.Glob(filepath.Join(scenariosDir, "*", "patch.txt"))
	for _, patchFile := range dirs {
		text, err := os.ReadFile(patchFile)
		if err != nil {
			continue
		}
		file := "one\ntwo\nthree\nfour\n"
		inputs, _ := filepath.Glob(filepath.Join(filepath.Dir(patchFile), "input", "*"))
		for _, in := range inputs {
			if b, err := os.ReadFile(in); err == nil {
				file = string(b)
				break
			}
		}
		add(string(text), file)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeedPatches {
		f.Add(s)
	}
	addScenarioSeeds(f, func(patch, _ string) { f.Add(patch) })
	f.Fuzz(func(t *testing.T, text string) {
		p, err := Parse(text, Options{})
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Err == nil || p != nil {
				t.Fatalf("Parse error is not a proper *Error: %#v", err)
			}
			_ = err.Error()
			return
		}
		if len(p.Ops) == 0 {
			t.Fatal("Parse succeeded with no operations")
		}
		for _, op := range p.Ops {
			for _, path := range []string{op.Path, op.MoveTo} {
				if path != "" && !strings.Contains(text, path) {
					t.Fatalf("path %q does not appear in the patch", path)
				}
			}
			if op.Path == "" || !utf8.Valid(op.Content) {
				t.Fatalf("bad op %+v", op)
			}
			if op.Kind == OpUpdate {
				if len(op.Hunks) == 0 {
					t.Fatal("update without hunks")
				}
				for _, h := range op.Hunks {
					if len(h.Lines) == 0 {
						t.Fatal("hunk without lines")
					}
				}
			}
		}
		if _, err := Plan(newMemTree(nil), p, Options{}); err == nil && hasUpdate(p) {
			t.Fatal("an update planned against an empty tree")
		}
	})
}

func hasUpdate(p *Patch) bool {
	for _, op := range p.Ops {
		if op.Kind == OpUpdate {
			return true
		}
	}
	return false
}

func FuzzApply(f *testing.F) {
	const file = "one\ntwo\r\nthree\rfour"
	for _, s := range fuzzSeedPatches {
		f.Add(s, file)
	}
	addScenarioSeeds(f, func(patch, file string) { f.Add(patch, file) })
	f.Fuzz(func(t *testing.T, text, content string) {
		src := newMemTree(map[string]string{"a.txt": content, "dir/b.txt": "b1\nb2\n"}, "dir/sub")
		before := src.clone()
		p, err := Parse(text, Options{MaxScanLines: 1 << 20})
		if err != nil {
			return
		}
		changes, err := Plan(src, p, Options{MaxScanLines: 1 << 20})
		if d := src.diff(before); d != "" {
			t.Fatalf("Plan changed its Source:\n%s", d)
		}
		if err != nil {
			if changes != nil {
				t.Fatal("a failed Plan returned changes")
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Err == nil {
				t.Fatalf("Plan error is not a proper *Error: %#v", err)
			}
			if pe.Path != "" && !patchFileSet(p)[pe.Path] {
				t.Fatalf("error names path %q, which the patch does not", pe.Path)
			}
			_ = err.Error()
			return
		}
		if len(changes) != len(p.Ops) {
			t.Fatalf("%d changes for %d operations", len(changes), len(p.Ops))
		}
		paths := patchFileSet(p)
		for i, c := range changes {
			op := p.Ops[i]
			if c.Kind != op.Kind || c.Path != op.Path || (c.MoveTo != "" && c.MoveTo != op.MoveTo) {
				t.Fatalf("change %+v does not follow operation %+v", c, op)
			}
			if !paths[c.Path] || (c.MoveTo != "" && !paths[c.MoveTo]) {
				t.Fatalf("change names a path the patch does not: %+v", c)
			}
			if !utf8.Valid(c.Content) {
				t.Fatalf("change %s has invalid UTF-8 content", c.Path)
			}
			if orig, ok := before.files[c.Path]; ok && c.Kind == OpUpdate && namedOnce(p, c.Path) {
				checkEndings(t, c.Path, string(orig), string(c.Content))
			}
		}
		// A successful plan always commits: nothing is left to fail.
		if err := src.clone().commit(changes); err != nil {
			t.Fatalf("commit of a successful plan failed: %v", err)
		}
	})
}

// namedOnce reports whether path is named by exactly one operation of p, so
// that its content before that operation is the Source's.
func namedOnce(p *Patch, path string) bool {
	n := 0
	for _, op := range p.Ops {
		if op.Path == path {
			n++
		}
		if op.MoveTo == path {
			n++
		}
	}
	return n == 1
}

// checkEndings checks the line-ending promises of an update from orig to
// got: the result lacks a final line ending only when orig did and its last
// line is orig's last line, kept; and a file whose every "\n" belongs to a
// "\r\n" keeps it that way.
func checkEndings(t *testing.T, path, orig, got string) {
	t.Helper()
	if got != "" && !strings.ContainsAny(got[len(got)-1:], "\r\n") {
		lastLine := func(s string) string {
			return strings.TrimPrefix(s[strings.LastIndexAny(s, "\r\n")+1:], utf8BOM)
		}
		if orig == "" || strings.ContainsAny(orig[len(orig)-1:], "\r\n") || lastLine(got) != lastLine(orig) {
			t.Fatalf("updated %s has no final line ending, but its last line is not the original's unending last line:\norig %q\ngot  %q", path, orig, got)
		}
	}
	if strings.Contains(orig, "\n") && !hasBareLF(orig) && hasBareLF(got) {
		t.Fatalf("updated %s gained a bare LF in a CRLF file:\norig %q\ngot  %q", path, orig, got)
	}
}

// hasBareLF reports whether s has a "\n" not preceded by "\r".
func hasBareLF(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' && (i == 0 || s[i-1] != '\r') {
			return true
		}
	}
	return false
}
