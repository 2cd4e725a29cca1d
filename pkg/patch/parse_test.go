package patch

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// envelope wraps body lines in Begin/End markers.
func envelope(lines ...string) string {
	return "*** Begin Patch\n" + strings.Join(lines, "\n") + "\n*** End Patch\n"
}

func mustParse(t *testing.T, text string) *Patch {
	t.Helper()
	p, err := Parse(text, Options{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func TestParseOperations(t *testing.T) {
	p := mustParse(t, envelope(
		"*** Add File: new.txt",
		"+hello",
		"+",
		"*** Delete File: old.txt",
		"*** Update File: src/a.go",
		"*** Move to: src/b.go",
		"@@ func A() {",
		" \tx := 1",
		"-\ty := 2",
		"+\ty := 3",
	))
	want := []FileOp{
		{Kind: OpAdd, Path: "new.txt", Content: []byte("hello\n\n"), Line: 2},
		{Kind: OpDelete, Path: "old.txt", Line: 5},
		{Kind: OpUpdate, Path: "src/a.go", MoveTo: "src/b.go", Line: 6, Hunks: []Hunk{{
			Anchors: []string{"func A() {"},
			Lines:   []HunkLine{{LineContext, "\tx := 1"}, {LineDelete, "\ty := 2"}, {LineAdd, "\ty := 3"}},
			Line:    8,
		}}},
	}
	if !reflect.DeepEqual(p.Ops, want) {
		t.Fatalf("ops =\n%#v\nwant\n%#v", p.Ops, want)
	}
	if got := p.Paths(); !reflect.DeepEqual(got, []string{"new.txt", "old.txt", "src/a.go", "src/b.go"}) {
		t.Errorf("Paths = %q", got)
	}
}

func TestParseTolerances(t *testing.T) {
	upd := []string{"*** Update File: f.txt", "@@", "-a", "+b"}
	tests := []struct {
		name string
		text string
	}{
		{"padded begin and end", " *** Begin Patch \n" + strings.Join(upd, "\n") + "\n  *** End Patch  "},
		{"padded file header", "*** Begin Patch\n   *** Update File: f.txt   \n@@\n-a\n+b\n*** End Patch"},
		{"surrounding blank lines", "\n\n" + envelope(upd...) + "\n\n"},
		{"CRLF patch text", strings.ReplaceAll(envelope(upd...), "\n", "\r\n")},
		{"heredoc", "<<EOF\n" + envelope(upd...) + "EOF"},
		{"quoted heredoc", "<<'EOF'\n" + envelope(upd...) + "EOF"},
		{"double-quoted heredoc", "<<\"EOF\"\n" + envelope(upd...) + "EOF\n"},
		{"blank line after update header", envelope("*** Update File: f.txt", "", "@@", "-a", "+b")},
		{"blank lines between operations", envelope("", "*** Delete File: x", "", "*** Update File: f.txt", "@@", "-a", "+b")},
		{"trailing spaces after @@", envelope("*** Update File: f.txt", "@@   ", "-a", "+b")},
		{"unified range header taken as bare @@", envelope("*** Update File: f.txt", "@@ -1,2 +1,2 @@", "-a", "+b")},
		{"first hunk without @@", envelope("*** Update File: f.txt", "-a", "+b")},
	}
	want := []Hunk{{Lines: []HunkLine{{LineDelete, "a"}, {LineAdd, "b"}}}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, tt.text)
			op := p.Ops[len(p.Ops)-1]
			if op.Path != "f.txt" || op.Kind != OpUpdate {
				t.Fatalf("ops = %+v", p.Ops)
			}
			got := op.Hunks
			for i := range got {
				got[i].Line = 0
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("hunks = %+v, want %+v", got, want)
			}
		})
	}
}

func TestParseHunkStructure(t *testing.T) {
	p := mustParse(t, envelope(
		"*** Update File: f.py",
		"@@ class A:",
		"@@     def f(self):",
		"@@",
		"     x = 1",
		"",
		"-    y = 2",
		"+    y = 3",
		"*** End of File",
		"",
		"@@ def g():",
		"+    pass",
	))
	h := p.Ops[0].Hunks
	if len(h) != 2 {
		t.Fatalf("got %d hunks, want 2", len(h))
	}
	if want := []string{"class A:", "    def f(self):"}; !reflect.DeepEqual(h[0].Anchors, want) {
		t.Errorf("stacked anchors = %q, want %q", h[0].Anchors, want)
	}
	wantLines := []HunkLine{{LineContext, "    x = 1"}, {LineContext, ""}, {LineDelete, "    y = 2"}, {LineAdd, "    y = 3"}}
	if !reflect.DeepEqual(h[0].Lines, wantLines) {
		t.Errorf("lines = %q, want %q (an empty line inside a hunk is empty context)", h[0].Lines, wantLines)
	}
	if !h[0].EndOfFile || h[1].EndOfFile {
		t.Errorf("EndOfFile = %v, %v; want true, false", h[0].EndOfFile, h[1].EndOfFile)
	}
	if h[0].Line != 3 || h[1].Line != 12 {
		t.Errorf("hunk lines = %d, %d; want 3, 12", h[0].Line, h[1].Line)
	}
}

func TestParseKeepsLineContent(t *testing.T) {
	// Trailing whitespace of hunk and add lines is content, not markup.
	p := mustParse(t, envelope("*** Add File: a", "+x  \t", "*** Update File: b", "@@  lead", " c  ", "+d "))
	if got := string(p.Ops[0].Content); got != "x  \t\n" {
		t.Errorf("add content = %q", got)
	}
	h := p.Ops[1].Hunks[0]
	if h.Anchors[0] != " lead" || h.Lines[0].Text != "c  " || h.Lines[1].Text != "d " {
		t.Errorf("hunk = %+v", h)
	}
}

func TestParseEmptyAddFile(t *testing.T) {
	p := mustParse(t, envelope("*** Add File: empty.txt"))
	if p.Ops[0].Kind != OpAdd || len(p.Ops[0].Content) != 0 {
		t.Fatalf("op = %+v", p.Ops[0])
	}
}

func TestParseEnvironmentID(t *testing.T) {
	p := mustParse(t, envelope("*** Environment ID:  box-1 ", "*** Delete File: a"))
	if p.EnvironmentID != "box-1" {
		t.Errorf("EnvironmentID = %q", p.EnvironmentID)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name     string
		text     string
		wantLine int
		wantText string
	}{
		{"empty", "  \n ", 0, "the patch is empty"},
		{"missing begin", "*** Update File: a\n*** End Patch", 1, "first line must be '*** Begin Patch'"},
		{"missing end", "*** Begin Patch\n*** Delete File: a", 2, "last line must be '*** End Patch'"},
		{"only begin", "*** Begin Patch", 1, "last line must be"},
		{"no operations", "*** Begin Patch\n*** End Patch", 0, "no file operations"},
		{"heredoc with mismatched quotes", "<<\"EOF'\n" + envelope("*** Delete File: a") + "EOF", 1, "first line"},
		{"heredoc around a bad patch", "<<EOF\n*** Begin Patch\n*** Delete File: a\nEOF", 2, "last line must be"},
		{"invalid header", envelope("*** Frobnicate File: a"), 2, "'*** Frobnicate File: a' is not a file operation header"},
		{"header without space", envelope("*** Add File:a", "+x"), 2, "is not a file operation header"},
		{"missing path", envelope("*** Delete File: "), 2, "is not a file operation header"},
		{"blank path", envelope("*** Delete File:  \t"), 2, "is not a file operation header"},
		{"add line without plus", envelope("*** Add File: a", "+x", "y"), 4, "inside Add File does not start with '+'"},
		{"blank line in add", envelope("*** Add File: a", "+x", "", "+y"), 4, "does not start with '+'"},
		{"update without hunks", envelope("*** Update File: a", "*** Delete File: b"), 2, "Update File has no hunks"},
		{"update without hunks at end", envelope("*** Update File: a"), 2, "Update File has no hunks"},
		{"hunk without lines", envelope("*** Update File: a", "@@ x", "*** End Patch"), 4, "hunk 1 has '@@' but no context"},
		{"second hunk without lines", envelope("*** Update File: a", "-x", "@@"), 5, "hunk 2 has '@@'"},
		{"unexpected update line", envelope("*** Update File: a", "@@", "x"), 4, "inside Update File does not start with ' '"},
		{"move after hunk", envelope("*** Update File: a", "-x", "*** Move to: b"), 4, "must directly follow"},
		{"move twice", envelope("*** Update File: a", "*** Move to: b", "*** Move to: c", "-x"), 4, "must directly follow"},
		{"move without space", envelope("*** Update File: a", "*** Move to:b", "-x"), 3, "with a space after the colon"},
		{"move without path", envelope("*** Update File: a", "*** Move to: ", "-x"), 3, "missing path"},
		{"end of file before lines", envelope("*** Update File: a", "@@", "*** End of File"), 4, "must follow the lines of a hunk"},
		{"line after end of file", envelope("*** Update File: a", "-x", "*** End of File", "+y"), 5, "only a new '@@' hunk"},
		{"text after inner end", "*** Begin Patch\n*** Delete File: a\n*** End Patch\nmore\n*** End Patch", 4, "text after '*** End Patch'"},
		{"empty environment id", envelope("*** Environment ID: ", "*** Delete File: a"), 2, "needs a value"},
		{"two environment ids", envelope("*** Environment ID: a", "*** Environment ID: b", "*** Delete File: a"), 3, "more than once"},
		{"not utf-8", envelope("*** Add File: a", "+\xff"), 0, "not valid UTF-8"},
		{"NUL in path", envelope("*** Delete File: a\x00b"), 2, "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.text, Options{})
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if !errors.Is(err, errkind.ErrInvalidArgument) {
				t.Errorf("err does not wrap ErrInvalidArgument: %v", err)
			}
			if pe.Op != OpNameParse || pe.Line != tt.wantLine {
				t.Errorf("Op, Line = %q, %d; want parse, %d", pe.Op, pe.Line, tt.wantLine)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("message %q does not contain %q", err.Error(), tt.wantText)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	text := envelope("*** Delete File: a", "*** Delete File: b", "*** Delete File: c")
	_, err := Parse(text, Options{MaxOperations: 2})
	if !errors.Is(err, errkind.ErrResourceExhausted) {
		t.Errorf("3 ops with MaxOperations 2: err = %v", err)
	}
	_, err = Parse(text, Options{MaxPatchBytes: 20})
	if !errors.Is(err, errkind.ErrResourceExhausted) {
		t.Errorf("MaxPatchBytes 20: err = %v", err)
	}
	if _, err := Parse(text, Options{MaxOperations: 3}); err != nil {
		t.Errorf("3 ops with MaxOperations 3: %v", err)
	}
}

func TestIsUnifiedRange(t *testing.T) {
	for s, want := range map[string]bool{
		"-1,3 +1,4 @@":             true,
		"-12 +12 @@ func main() {": true,
		"-1,3 +1,4":                false,
		"-1, +1 @@":                false,
		"func main() {":            false,
		"- +1 @@":                  false,
	} {
		if got := isUnifiedRange(s); got != want {
			t.Errorf("isUnifiedRange(%q) = %v, want %v", s, got, want)
		}
	}
}
