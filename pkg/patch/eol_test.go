package patch

import (
	"testing"
)

// TestLineEndingsByteExact pins, byte for byte, what an update does to line
// endings: a line the patch does not change keeps its bytes (its own ending,
// or none for a last line that had none), lines the patch adds take the
// file's first ending, and a last line without an ending gains one only when
// lines come to follow it.
func TestLineEndingsByteExact(t *testing.T) {
	tests := []struct {
		name string
		file string
		body []string // lines after "*** Update File: f"
		want string
	}{
		// A last line without a newline that the patch leaves alone.
		{"LF: untouched last line keeps no newline", "a\nb\nc", []string{"-a", "+A"}, "A\nb\nc"},
		{"LF: untouched last line as trailing context", "a\nb", []string{" a", "+x", " b"}, "a\nx\nb"},
		{"LF: context at end of file keeps no newline", "a\nb\nc", []string{"-b", "+B", " c", "*** End of File"}, "a\nB\nc"},
		{"LF: context keeps the file's own bytes", "a\nb  ", []string{" a", "+x", " b"}, "a\nx\nb  "},
		{"LF: insertion before the last line", "a\nb", []string{"@@ a", "+x"}, "a\nx\nb"},
		{"LF: deleting the line before the last", "a\nb", []string{"-a"}, "b"},
		{"BOM: untouched last line keeps no newline", "\ufeffa\nb", []string{"-a", "+A"}, "\ufeffA\nb"},

		// The last line is touched: replaced, or lines are added after it.
		{"LF: replaced last line ends with a newline", "a\nb", []string{" a", "-b", "+B"}, "a\nB\n"},
		{"LF: only line replaced", "only", []string{"-only", "+ONLY"}, "ONLY\n"},
		{"LF: deleted last line leaves the previous ending", "a\nb", []string{" a", "-b"}, "a\n"},
		{"LF: insertion at the end gives the old last line an ending", "a\nb", []string{"@@", "+c"}, "a\nb\nc\n"},
		{"LF: insertion after the last line as anchor", "a\nb", []string{"@@ b", "+c"}, "a\nb\nc\n"},
		{"LF: added lines after last-line context", "a\nb", []string{" b", "+c"}, "a\nb\nc\n"},
		{"no ending anywhere: LF is used", "a", []string{"@@", "+b"}, "a\nb\n"},

		// CRLF files stay CRLF.
		{"CRLF: untouched last line keeps no ending", "a\r\nb\r\nc", []string{"-b", "+B1", "+B2"}, "a\r\nB1\r\nB2\r\nc"},
		{"CRLF: insertion before the last line", "a\r\nb", []string{"@@ a", "+x"}, "a\r\nx\r\nb"},
		{"CRLF: replaced last line ends with CRLF", "a\r\nb", []string{"-b", "+B"}, "a\r\nB\r\n"},
		{"CRLF: insertion at the end", "a\r\nb", []string{"@@", "+c", "+d"}, "a\r\nb\r\nc\r\nd\r\n"},
		{"CRLF: with final ending, every line CRLF", "a\r\nb\r\n", []string{" a", "+x", "-b", "+B"}, "a\r\nx\r\nB\r\n"},

		// Mixed endings: each kept line keeps its own, added lines take the first one seen.
		{"mixed: first ending CRLF", "a\r\nb\nc\rd", []string{" b", "-c", "+C"}, "a\r\nb\nC\r\nd"},
		{"mixed: first ending lone CR", "a\rb\r\nc\n", []string{" b", "+x"}, "a\rb\r\nx\rc\n"},
		{"mixed: first ending LF, last line replaced", "a\nb\r\nc", []string{"-c", "+C"}, "a\nb\r\nC\n"},
		{"mixed: insertion at the end after lone CR", "a\r\nb\rc", []string{"@@", "+d"}, "a\r\nb\rc\r\nd\r\n"},
		{"mixed: fixture 024 without a final ending", "one\r\ntwo\rthree\nfour", []string{" one", " two", "-three", "+THREE", " four"}, "one\r\ntwo\rTHREE\r\nfour"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := envelope(append([]string{"*** Update File: f"}, tt.body...)...)
			got, _, err := applyText(t, map[string]string{"f": tt.file}, text, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got["f"] != tt.want {
				t.Errorf("f = %q, want %q", got["f"], tt.want)
			}
		})
	}
}

// TestFixture014MissingNewline applies the patch of the reference scenario
// 014_update_file_appends_trailing_newline (it replaces the file's only line)
// to the input its name describes, a file without a final newline, as well
// as to the vendored input, which has one: both give the fixture's expected
// bytes, because the patch touches the last line.
func TestFixture014MissingNewline(t *testing.T) {
	const (
		patchText = "*** Begin Patch\n*** Update File: no_newline.txt\n@@\n-no newline at end\n+first line\n+second line\n*** End Patch\n"
		want      = "first line\nsecond line\n"
	)
	for _, input := range []string{"no newline at end", "no newline at end\n"} {
		got, _, err := applyText(t, map[string]string{"no_newline.txt": input}, patchText, Options{})
		if err != nil {
			t.Fatalf("input %q: %v", input, err)
		}
		if got["no_newline.txt"] != want {
			t.Errorf("input %q: got %q, want %q", input, got["no_newline.txt"], want)
		}
	}
}

// TestOperationsFormKeepsMissingNewline checks the per-file operation form
// (the hosted tool's update_file diff) follows the same rules.
func TestOperationsFormKeepsMissingNewline(t *testing.T) {
	p, err := FromOperations([]Operation{{Type: OperationUpdateFile, Path: "f", Diff: "@@\n-a\n+A\n"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	changes, err := Plan(newMemTree(map[string]string{"f": "a\r\nb"}), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || string(changes[0].Content) != "A\r\nb" {
		t.Fatalf("changes = %+v, want one with content %q", changes, "A\r\nb")
	}
}
