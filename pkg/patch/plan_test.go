package patch

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// applyText plans text against files and commits the result to a copy,
// returning the resulting files and the changes.
func applyText(t *testing.T, files map[string]string, text string, opts Options) (map[string]string, []Change, error) {
	t.Helper()
	src := newMemTree(files)
	p, err := Parse(text, opts)
	if err != nil {
		return nil, nil, err
	}
	changes, err := Plan(src, p, opts)
	if err != nil {
		if changes != nil {
			t.Fatalf("Plan returned %d changes with error %v", len(changes), err)
		}
		return nil, nil, err
	}
	tree := src.clone()
	if err := tree.commit(changes); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range tree.files {
		out[k] = string(v)
	}
	return out, changes, nil
}

func TestUpdateSemantics(t *testing.T) {
	tests := []struct {
		name string
		file string
		body []string // lines after "*** Update File: f"
		want string
	}{
		{"replace", "a\nb\nc\n", []string{"@@", " a", "-b", "+B"}, "a\nB\nc\n"},
		{"insertion goes after its anchor", "a\nb\nc\n", []string{"@@ a", "+x"}, "a\nx\nb\nc\n"},
		{"insertion after the last stacked anchor", "f\n x\ng\n x\n", []string{"@@ g", "@@  x", "+y"}, "f\n x\ng\n x\ny\n"},
		{"insertion without anchor goes at the end", "a\nb\n", []string{"@@", "+x", "+y"}, "a\nb\nx\ny\n"},
		{"anchored insertion marked end of file goes at the end", "a\nb\n", []string{"@@ a", "+x", "*** End of File"}, "a\nb\nx\n"},
		{"insertion at end before a removal hunk", "a\nb\nc\n", []string{"@@", "+tail", "@@", "-b"}, "a\nc\ntail\n"},
		{"stacked anchors pick the right block", "class A:\n  def f():\n    x = 1\nclass B:\n  def f():\n    x = 1\n",
			[]string{"@@ class B:", "@@   def f():", "-    x = 1", "+    x = 2"}, "class A:\n  def f():\n    x = 1\nclass B:\n  def f():\n    x = 2\n"},
		{"anchor then hunk after it", "x = 1\ndef f():\n    x = 1\n", []string{"@@ def f():", "-    x = 1", "+    x = 2"}, "x = 1\ndef f():\n    x = 2\n"},
		{"two hunks in order", "1\n2\n3\n4\n5\n", []string{"@@", "-2", "+two", "@@", "-4", "+four"}, "1\ntwo\n3\nfour\n5\n"},
		{"end of file hunk", "x\na\nx\n", []string{"@@", "-x", "+y", "*** End of File"}, "x\na\ny\n"},
		{"deletion only", "a\nb\nc\n", []string{" a", "-b", " c"}, "a\nc\n"},
		{"delete every line", "a\nb\n", []string{"-a", "-b"}, ""},
		{"context keeps the file's whitespace", "  a  \nb\n", []string{" a", "-b", "+B"}, "  a  \nB\n"},
		{"curly quotes in file, straight in patch", "s = “x”\nt\n", []string{` s = "x"`, "-t", "+u"}, "s = “x”\nu\n"},
		{"untouched last line keeps its missing newline", "a\nb", []string{"-a", "+A"}, "A\nb"},
		{"CRLF kept, new lines take CRLF", "a\r\nb\r\nc\r\n", []string{"-a", "+A", "+A2", " b"}, "A\r\nA2\r\nb\r\nc\r\n"},
		{"lone CR kept", "a\rb\r", []string{" a", "-b", "+B"}, "a\rB\r"},
		{"mixed endings: untouched lines keep theirs", "1\n2\r\n3\r4", []string{"-3", "+three"}, "1\n2\r\nthree\n4"},
		{"byte order mark kept and ignored for matching", "\ufeffa\nb\n", []string{"-a", "+A"}, "\ufeffA\nb\n"},
		{"trailing blank context line not in file", "a\nb\n", []string{" a", "-b", "+B", ""}, "a\nB\n"},
		{"trailing blank context before added lines", "a\nb\n", []string{" b", "", "+c"}, "a\nb\n\nc\n"},
		{"blank context that exists is matched", "a\n\nb\n", []string{" a", "", "-b"}, "a\n\n"},
		{"unified range header is ignored", "a\nb\n", []string{"@@ -1,2 +1,2 @@", "-b", "+c"}, "a\nc\n"},
		{"empty file gets an insertion", "", []string{"@@", "+x"}, "x\n"},
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

func TestUpdateRejections(t *testing.T) {
	tests := []struct {
		name string
		file string
		body []string
		want string // in the message
	}{
		{"missing context", "a\nb\n", []string{"-c"}, "hunk 1 does not match"},
		{"anchor not found", "a\nb\n", []string{"@@ z", "-a"}, "anchor '@@ z' of hunk 1 is not a line of the file"},
		{"stacked anchors out of order", "A\nB\nx\n", []string{"@@ B", "@@ A", "-x"}, "anchor '@@ A' of hunk 1 occurs only at line 1"},
		{"hunks out of order", "1\n2\n3\n", []string{"@@", "-3", "@@", "-1"}, "hunk 2 matches only at line 1"},
		{"end of file hunk not at the end", "a\nb\n", []string{"-a", "*** End of File"}, "not the last lines of the file"},
		{"empty file", "", []string{"-a"}, "the file is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := envelope(append([]string{"*** Update File: f"}, tt.body...)...)
			_, _, err := applyText(t, map[string]string{"f": tt.file}, text, Options{})
			var pe *Error
			if !errors.As(err, &pe) || !errors.Is(err, errkind.ErrPatchRejected) {
				t.Fatalf("err = %v, want *Error wrapping ErrPatchRejected", err)
			}
			if pe.Op != OpNameUpdate || pe.Path != "f" || pe.Hunk == 0 {
				t.Errorf("Op, Path, Hunk = %q, %q, %d", pe.Op, pe.Path, pe.Hunk)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("message %q does not contain %q", err.Error(), tt.want)
			}
		})
	}
}

func TestRefusesNonUTF8(t *testing.T) {
	for _, content := range []string{"caf\xe9\n", "\xff\xfeh\x00i\x00\n"} {
		_, _, err := applyText(t, map[string]string{"f": content}, envelope("*** Update File: f", "@@", "+x"), Options{})
		if !errors.Is(err, errkind.ErrPatchRejected) || !strings.Contains(err.Error(), "not valid UTF-8") {
			t.Errorf("content %q: err = %v, want a UTF-8 rejection", content, err)
		}
	}
	// Deleting or replacing such a file is fine.
	got, _, err := applyText(t, map[string]string{"f": "\xff"}, envelope("*** Delete File: f", "*** Add File: f", "+ok"), Options{})
	if err != nil || got["f"] != "ok\n" {
		t.Errorf("delete+add of a binary file: %q, %v", got["f"], err)
	}
}

func TestOperationsCompose(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		body  []string
		want  map[string]string
	}{
		{"add then update", nil,
			[]string{"*** Add File: f", "+a", "+b", "*** Update File: f", "-a", "+A"},
			map[string]string{"f": "A\nb\n"}},
		{"update twice", map[string]string{"f": "a\nb\n"},
			[]string{"*** Update File: f", "-a", "+A", "*** Update File: f", "-b", "+B"},
			map[string]string{"f": "A\nB\n"}},
		{"delete then add", map[string]string{"f": "old\n"},
			[]string{"*** Delete File: f", "*** Add File: f", "+new"},
			map[string]string{"f": "new\n"}},
		{"add then delete", nil,
			[]string{"*** Add File: f", "+x", "*** Delete File: f"},
			map[string]string{}},
		{"move then update destination", map[string]string{"a": "1\n"},
			[]string{"*** Update File: a", "*** Move to: b", "-1", "+2", "*** Update File: b", "-2", "+3"},
			map[string]string{"b": "3\n"}},
		{"move onto itself keeps the file", map[string]string{"f": "1\n"},
			[]string{"*** Update File: f", "*** Move to: ./f", "-1", "+2"},
			map[string]string{"f": "2\n"}},
		{"delete a file, then create a directory in its place", map[string]string{"d": "file\n"},
			[]string{"*** Delete File: d", "*** Add File: d/x", "+x"},
			map[string]string{"d/x": "x\n"}},
		{"paths that clean to the same file", map[string]string{"a/b": "1\n"},
			[]string{"*** Update File: a//b", "-1", "+2", "*** Update File: ./a/b", "-2", "+3"},
			map[string]string{"a/b": "3\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := applyText(t, tt.files, envelope(tt.body...), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("files = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestPlanRejections(t *testing.T) {
	files := map[string]string{"f": "1\n", "dir/x": "x\n"}
	tests := []struct {
		name  string
		body  []string
		cause error
		want  string
	}{
		{"update missing file", []string{"*** Update File: nope", "-1"}, errkind.ErrNotFound, "update nope: the file to update does not exist"},
		{"delete missing file", []string{"*** Delete File: nope"}, errkind.ErrNotFound, "delete nope: the file to delete does not exist"},
		{"delete twice", []string{"*** Delete File: f", "*** Delete File: f"}, errkind.ErrNotFound, "already deleted"},
		{"update after move away", []string{"*** Update File: f", "*** Move to: g", "-1", "+2", "*** Update File: f", "-2"}, errkind.ErrNotFound, "already deleted or moved away"},
		{"delete directory", []string{"*** Delete File: dir"}, errkind.ErrIsDirectory, "is a directory"},
		{"update directory", []string{"*** Update File: dir", "-x"}, errkind.ErrIsDirectory, "is a directory"},
		{"add over directory", []string{"*** Add File: dir", "+x"}, errkind.ErrIsDirectory, "a directory exists"},
		{"move onto directory", []string{"*** Update File: f", "*** Move to: dir", "-1", "+2"}, errkind.ErrIsDirectory, "move dir: a directory exists"},
		{"add below a file", []string{"*** Add File: f/g", "+x"}, errkind.ErrNotDirectory, "parent 'f' is a file"},
		{"add below a file added earlier", []string{"*** Add File: n", "+x", "*** Add File: n/m/o", "+y"}, errkind.ErrNotDirectory, "parent 'n' is a file"},
		{"add where a directory was implied", []string{"*** Add File: n/m", "+x", "*** Add File: n", "+y"}, errkind.ErrIsDirectory, "a directory exists"},
		{"failure after successes", []string{"*** Add File: new", "+x", "*** Delete File: f", "*** Update File: nope", "-1"}, errkind.ErrNotFound, "update nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := applyText(t, files, envelope(tt.body...), Options{})
			if !errors.Is(err, errkind.ErrPatchRejected) || !errors.Is(err, tt.cause) {
				t.Fatalf("err = %v, want ErrPatchRejected and %v", err, tt.cause)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("message %q does not contain %q", err.Error(), tt.want)
			}
		})
	}
}

// failingSource fails every call with a daemon-style error whose text holds
// a host path.
type failingSource struct{ err error }

func (s failingSource) ReadFile(string) ([]byte, error)   { return nil, s.err }
func (s failingSource) Exists(string) (bool, bool, error) { return false, false, s.err }

func TestSourceErrorsPassThrough(t *testing.T) {
	hostErr := &errkind.PathError{Op: "resolve", Path: "/var/lib/bulkhead/ws/../../etc/passwd", Err: errkind.ErrPathEscape}
	p := mustParse(t, envelope("*** Update File: ../../etc/passwd", "-root"))
	_, err := Plan(failingSource{hostErr}, p, Options{})
	if !errors.Is(err, errkind.ErrPathEscape) || !errors.Is(err, errkind.ErrPatchRejected) {
		t.Fatalf("err = %v, want ErrPathEscape and ErrPatchRejected", err)
	}
	var pe *Error
	if !errors.As(err, &pe) || pe.Cause != hostErr {
		t.Fatalf("Cause = %v, want the Source's error", pe)
	}
	msg := err.Error()
	if strings.Contains(msg, "/var/lib") || !strings.Contains(msg, "path escapes the workspace") {
		t.Errorf("message %q must name the sentinel and not the host path", msg)
	}

	// Not-found errors from the Source are a missing file, not a failure.
	_, err = Plan(failingSource{errkind.ErrNotFound}, mustParse(t, envelope("*** Delete File: x")), Options{})
	if !errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("not-found Source: err = %v", err)
	}
}

func TestPlanLimits(t *testing.T) {
	big := strings.Repeat("line\n", 1000)
	tests := []struct {
		name string
		opts Options
		body []string
	}{
		{"file to read too big", Options{MaxFileBytes: 100}, []string{"*** Update File: big", "@@", "+x"}},
		{"file produced too big", Options{MaxFileBytes: 5000}, []string{"*** Update File: big", "@@", "+more than five thousand bytes"}},
		{"total too big", Options{MaxTotalBytes: 9000}, []string{"*** Update File: big", "-line", "+LINE"}},
		{"scan budget", Options{MaxScanLines: 1500}, []string{"*** Update File: big", "-nothing like this"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := applyText(t, map[string]string{"big": big}, envelope(tt.body...), tt.opts)
			if !errors.Is(err, errkind.ErrResourceExhausted) {
				t.Fatalf("err = %v, want ErrResourceExhausted", err)
			}
		})
	}
}

func TestPlanValidatesHandBuiltPatches(t *testing.T) {
	src := newMemTree(nil)
	for name, p := range map[string]*Patch{
		"nil":          nil,
		"empty":        {},
		"no path":      {Ops: []FileOp{{Kind: OpDelete}}},
		"unknown kind": {Ops: []FileOp{{Kind: 9, Path: "a"}}},
		"no hunks":     {Ops: []FileOp{{Kind: OpUpdate, Path: "a"}}},
		"empty hunk":   {Ops: []FileOp{{Kind: OpUpdate, Path: "a", Hunks: []Hunk{{}}}}},
	} {
		if _, err := Plan(src, p, Options{}); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestChanges(t *testing.T) {
	_, changes, err := applyText(t, map[string]string{"old": "1\n", "gone": "x\n", "u": "a\n"}, envelope(
		"*** Add File: new", "+n",
		"*** Update File: u", "-a", "+b",
		"*** Update File: old", "*** Move to: moved/new", "-1", "+2",
		"*** Delete File: gone",
	), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{Kind: OpAdd, Path: "new", Content: []byte("n\n")},
		{Kind: OpUpdate, Path: "u", Content: []byte("b\n")},
		{Kind: OpUpdate, Path: "old", MoveTo: "moved/new", Content: []byte("2\n")},
		{Kind: OpDelete, Path: "gone"},
	}
	if !reflect.DeepEqual(changes, want) {
		t.Fatalf("changes = %+v, want %+v", changes, want)
	}
	var summaries []string
	for _, c := range changes {
		summaries = append(summaries, c.Summary())
	}
	if got := strings.Join(summaries, "|"); got != "Created new|Updated u|Moved old to moved/new|Deleted gone" {
		t.Errorf("summaries = %s", got)
	}
}

func TestChangeContentIsNotShared(t *testing.T) {
	p := mustParse(t, envelope("*** Add File: a", "+x"))
	changes, err := Plan(newMemTree(nil), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	changes[0].Content[0] = 'y'
	if string(p.Ops[0].Content) != "x\n" {
		t.Errorf("changing a Change's Content changed the Patch")
	}
}
