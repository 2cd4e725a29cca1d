package patch

import (
	"errors"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestMismatchErrorFields(t *testing.T) {
	file := "package a\n\nfunc A() {\n\tx := 1\n\ty := 2\n\treturn x + y\n}\n"
	text := envelope("*** Update File: a.go", "@@", " func A() {", "-\tx := 10", "+\tx := 3", " \ty := 2")
	_, _, err := applyText(t, map[string]string{"a.go": file}, text, Options{})
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want *Error", err)
	}
	if pe.Op != OpNameUpdate || pe.Path != "a.go" || pe.Line != 3 || pe.Hunk != 1 {
		t.Errorf("Op, Path, Line, Hunk = %q, %q, %d, %d", pe.Op, pe.Path, pe.Line, pe.Hunk)
	}
	if want := []string{"func A() {", "\tx := 10", "\ty := 2"}; strings.Join(pe.Context, "|") != strings.Join(want, "|") {
		t.Errorf("Context = %q, want %q", pe.Context, want)
	}
	r := pe.Closest
	if r == nil || r.StartLine != 3 || r.Agree != 2 || r.Compared != 3 || len(r.Lines) != 3 || r.Lines[1] != "\tx := 1" {
		t.Fatalf("Closest = %+v", r)
	}
	if pe.Err != errkind.ErrPatchRejected || pe.Cause != nil {
		t.Errorf("Err, Cause = %v, %v", pe.Err, pe.Cause)
	}
	msg := err.Error()
	for _, want := range []string{
		"patch rejected: line 3 (update a.go): hunk 1 does not match",
		"\n    \tx := 10\n",     // the failed context is quoted
		"starts at line 3",      // with the closest region's line number
		"\n     4 | \tx := 1\n", // and the file's current text, numbered
		"2 of 3 non-blank lines agree",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message does not contain %q:\n%s", want, msg)
		}
	}
}

func TestErrorMessageIsBounded(t *testing.T) {
	long := strings.Repeat("x", 5000)
	var body []string
	var file strings.Builder
	for i := range 100 {
		line := long + string(rune('a'+i%26))
		body = append(body, " "+line)
		file.WriteString(line + "\n")
	}
	body[99] = " not in the file"
	_, _, err := applyText(t, map[string]string{"f": file.String()}, envelope(append([]string{"*** Update File: f", "@@"}, body...)...), Options{})
	if err == nil {
		t.Fatal("expected a mismatch")
	}
	var pe *Error
	errors.As(err, &pe)
	if len(pe.Context) > maxErrorLines || pe.Closest == nil || len(pe.Closest.Lines) > maxErrorLines {
		t.Errorf("kept %d context lines and region %+v", len(pe.Context), pe.Closest)
	}
	if n := len(err.Error()); n > 3*(maxQuoteBytes+maxQuoteLineBytes)+1000 {
		t.Errorf("message is %d bytes", n)
	}
	if !strings.Contains(err.Error(), "more lines)") || !strings.Contains(err.Error(), "x ...") {
		t.Errorf("message does not show truncation:\n%s", err.Error())
	}
}

func TestErrorTextForms(t *testing.T) {
	tests := []struct {
		err  *Error
		want string
	}{
		{&Error{Op: OpNameParse, Line: 4, Reason: "bad", Err: errkind.ErrInvalidArgument}, "invalid patch: line 4: bad"},
		{&Error{Op: OpNameParse, Line: 4, Path: "p", Reason: "bad", Err: errkind.ErrInvalidArgument}, "invalid patch: line 4 (file p): bad"},
		{&Error{Op: OpNameDelete, Path: "p", Reason: "gone", Err: errkind.ErrPatchRejected, Cause: errkind.ErrNotFound}, "patch rejected: delete p: gone"},
		{&Error{Op: OpNameAdd, Path: "p", Reason: "big", Err: errkind.ErrResourceExhausted}, "patch exceeds a limit: add p: big"},
		{&Error{Op: OpNameUpdate, Path: "p", Reason: "cannot access the file", Err: errkind.ErrPatchRejected, Cause: errors.New("open /host/secret: denied")}, "patch rejected: update p: cannot access the file: the file could not be read"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestPrintable(t *testing.T) {
	if got := printable("a\tb\rc\x00"); got != `a	b\rc\x00` {
		t.Errorf("printable = %q", got)
	}
	s := strings.Repeat("é", maxQuoteLineBytes) // two bytes each
	got := printable(s)
	if !strings.HasSuffix(got, " ...") || len(got) > maxQuoteLineBytes+4 || !strings.HasPrefix(got, "éé") {
		t.Errorf("printable cut badly: %d bytes", len(got))
	}
	if strings.ContainsRune(got, '\uFFFD') {
		t.Error("printable split a rune")
	}
}
