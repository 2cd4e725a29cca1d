package patch

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// clearLines zeroes the patch-text line numbers, which differ between the
// two forms by design.
func clearLines(p *Patch) *Patch {
	for i := range p.Ops {
		p.Ops[i].Line = 0
		for j := range p.Ops[i].Hunks {
			p.Ops[i].Hunks[j].Line = 0
		}
	}
	return p
}

func TestOperationsMatchEnvelope(t *testing.T) {
	fromText := mustParse(t, envelope(
		"*** Add File: new.txt",
		"+one",
		"+two",
		"*** Update File: a.txt",
		"*** Move to: b.txt",
		"@@ anchor",
		" ctx",
		"-old",
		"+new",
		"*** End of File",
		"*** Delete File: gone.txt",
	))
	fromOps, err := FromOperations([]Operation{
		{Type: OperationCreateFile, Path: "new.txt", Diff: "+one\n+two\n"},
		{Type: OperationUpdateFile, Path: "a.txt", MoveTo: "b.txt", Diff: "@@ anchor\n ctx\n-old\n+new\n*** End of File\n"},
		{Type: OperationDeleteFile, Path: "gone.txt"},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := clearLines(fromText), clearLines(fromOps); !reflect.DeepEqual(a, b) {
		t.Fatalf("envelope form\n%+v\noperation form\n%+v", a, b)
	}
}

func TestOperationsDetails(t *testing.T) {
	p, err := FromOperations([]Operation{
		{Type: OperationCreateFile, Path: "crlf.txt", Diff: "+a\r\n+b"},
		{Type: OperationCreateFile, Path: "empty.txt"},
		{Type: OperationUpdateFile, Path: "u.txt", Diff: "*** Move to: v.txt\n-x\n+y"},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(p.Ops[0].Content); got != "a\nb\n" {
		t.Errorf("create content = %q", got)
	}
	if len(p.Ops[1].Content) != 0 {
		t.Errorf("empty create content = %q", p.Ops[1].Content)
	}
	if p.Ops[2].MoveTo != "v.txt" || len(p.Ops[2].Hunks) != 1 {
		t.Errorf("update = %+v", p.Ops[2])
	}
}

func TestOperationsErrors(t *testing.T) {
	tests := []struct {
		name string
		ops  []Operation
		want string
	}{
		{"none", nil, "no file operations"},
		{"unknown type", []Operation{{Type: "rename_file", Path: "a"}}, "unknown operation type 'rename_file'"},
		{"missing path", []Operation{{Type: OperationDeleteFile, Path: " "}}, "missing path"},
		{"create line without plus", []Operation{{Type: OperationCreateFile, Path: "a", Diff: "+x\ny\n"}}, "line 'y' of a create_file diff does not start with '+'"},
		{"delete with diff", []Operation{{Type: OperationDeleteFile, Path: "a", Diff: "-x"}}, "takes no diff"},
		{"move on create", []Operation{{Type: OperationCreateFile, Path: "a", MoveTo: "b", Diff: "+x"}}, "move_to is only allowed"},
		{"empty update", []Operation{{Type: OperationUpdateFile, Path: "a"}}, "Update File has no hunks"},
		{"header in update diff", []Operation{{Type: OperationUpdateFile, Path: "a", Diff: "-x\n*** Update File: b\n-y"}}, "without file headers"},
		{"bad update line", []Operation{{Type: OperationUpdateFile, Path: "a", Diff: "-x\n?y"}}, "line '?y' inside Update File"},
		{"move twice", []Operation{{Type: OperationUpdateFile, Path: "a", MoveTo: "b", Diff: "*** Move to: c\n-x"}}, "at most once"},
		{"second op fails", []Operation{{Type: OperationDeleteFile, Path: "a"}, {Type: OperationDeleteFile, Path: "b", Diff: "x"}}, "operation 2 (delete_file)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromOperations(tt.ops, Options{})
			if !errors.Is(err, errkind.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("message %q does not contain %q", err.Error(), tt.want)
			}
		})
	}
	_, err := FromOperations([]Operation{{Type: OperationCreateFile, Path: "a", Diff: strings.Repeat("+x\n", 100)}}, Options{MaxPatchBytes: 100})
	if !errors.Is(err, errkind.ErrResourceExhausted) {
		t.Errorf("oversized diff: err = %v", err)
	}
}

func TestParseOperationsJSON(t *testing.T) {
	op := `{"type":"update_file","path":"a.txt","diff":"@@\n-x\n+y\n","id":"ignored"}`
	for name, data := range map[string]string{
		"bare":      op,
		"array":     "[" + op + "]",
		"operation": `{"operation":` + op + `}`,
		"list":      ` {"operations":[` + op + `]} `,
	} {
		t.Run(name, func(t *testing.T) {
			p, err := ParseOperationsJSON([]byte(data), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Ops) != 1 || p.Ops[0].Path != "a.txt" || p.Ops[0].Kind != OpUpdate {
				t.Fatalf("ops = %+v", p.Ops)
			}
		})
	}
	for _, bad := range []string{``, `{`, `[]`, `{"operations":[]}`, `"x"`} {
		if _, err := ParseOperationsJSON([]byte(bad), Options{}); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("ParseOperationsJSON(%q) err = %v, want ErrInvalidArgument", bad, err)
		}
	}
}
