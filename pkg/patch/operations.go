package patch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Operation types of the per-file operation form.
const (
	OperationCreateFile = "create_file"
	OperationUpdateFile = "update_file"
	OperationDeleteFile = "delete_file"
)

// Operation is one file operation in the per-file form used by the hosted
// Responses "apply_patch" tool and the Agents SDK's JSON fallback. Diff is a
// V4A body with no envelope and no file header: "+" lines for create_file,
// hunks for update_file, empty for delete_file.
type Operation struct {
	Type   string `json:"type"`
	Path   string `json:"path"`
	Diff   string `json:"diff,omitempty"`
	MoveTo string `json:"move_to,omitempty"`
}

// FromOperations turns a list of per-file operations into a Patch; the list
// is one patch, applied in order. A create_file diff must consist of "+"
// lines (each becomes a line of the file, ended by "\n"); an update_file diff
// follows the Update File rules of Parse; a delete_file has no diff.
// Line numbers in errors count lines of the operation's diff.
func FromOperations(ops []Operation, opts Options) (*Patch, error) {
	opts = opts.withDefaults()
	if len(ops) == 0 {
		return nil, syntaxError(0, nil, "no file operations given")
	}
	if len(ops) > opts.MaxOperations {
		return nil, limitError(OpNameParse, "", "%d file operations, more than the limit of %d", len(ops), opts.MaxOperations)
	}
	total := 0
	for _, o := range ops {
		total += len(o.Diff)
	}
	if total > opts.MaxPatchBytes {
		return nil, limitError(OpNameParse, "", "the diffs total %d bytes, more than the limit of %d", total, opts.MaxPatchBytes)
	}
	patch := &Patch{Ops: make([]FileOp, 0, len(ops))}
	for i, o := range ops {
		op, err := operationToFileOp(o, opts)
		if err != nil {
			err.Reason = fmt.Sprintf("operation %d (%s): %s", i+1, o.Type, err.Reason)
			return nil, err
		}
		patch.Ops = append(patch.Ops, op)
	}
	return patch, nil
}

// operationToFileOp parses one operation.
func operationToFileOp(o Operation, opts Options) (FileOp, *Error) {
	op := FileOp{Path: strings.TrimSpace(o.Path), MoveTo: strings.TrimSpace(o.MoveTo)}
	if msg := checkPath(op.Path); msg != "" {
		return op, syntaxError(0, &op, "%s", msg)
	}
	if !utf8.ValidString(o.Diff) || !utf8.ValidString(o.Path) || !utf8.ValidString(o.MoveTo) {
		return op, syntaxError(0, &op, "not valid UTF-8")
	}
	if op.MoveTo != "" && o.Type != OperationUpdateFile {
		return op, syntaxError(0, &op, "move_to is only allowed with %s", OperationUpdateFile)
	}
	if op.MoveTo != "" {
		if msg := checkPath(op.MoveTo); msg != "" {
			return op, syntaxError(0, &op, "move_to: %s", msg)
		}
	}
	lines := diffLines(o.Diff)
	switch o.Type {
	case OperationCreateFile:
		op.Kind = OpAdd
		var content strings.Builder
		for i, l := range lines {
			rest, ok := strings.CutPrefix(l, "+")
			if !ok {
				return op, syntaxError(i+1, &op, "line '%s' of a %s diff does not start with '+'; every line of a new file, blank ones too, needs a '+' prefix", printable(l), OperationCreateFile)
			}
			content.WriteString(rest)
			content.WriteByte('\n')
		}
		op.Content = []byte(content.String())
	case OperationDeleteFile:
		op.Kind = OpDelete
		if strings.TrimSpace(o.Diff) != "" {
			return op, syntaxError(0, &op, "a %s operation takes no diff", OperationDeleteFile)
		}
	case OperationUpdateFile:
		op.Kind = OpUpdate
		p := &bodyParser{opts: opts, state: stateUpdate, patch: Patch{Ops: []FileOp{op}}}
		for i, l := range lines {
			if isHeaderOrEnd(strings.TrimRightFunc(l, unicode.IsSpace)) {
				return op, syntaxError(i+1, &op, "line '%s': a %s diff holds the hunks of one file, without file headers or '%s'", printable(l), OperationUpdateFile, markerEnd)
			}
			if err := p.updateLine(i+1, l); err != nil {
				return op, asError(err)
			}
		}
		if err := p.closeOp(len(lines), "the end of the diff"); err != nil {
			return op, asError(err)
		}
		op = p.patch.Ops[0]
		op.Line = 0
	default:
		return op, syntaxError(0, &op, "unknown operation type '%s'; want %s, %s or %s", printable(o.Type), OperationCreateFile, OperationUpdateFile, OperationDeleteFile)
	}
	return op, nil
}

// diffLines splits a diff on "\n", dropping one "\r" per line and the empty
// element after a final newline.
func diffLines(diff string) []string {
	if diff == "" {
		return nil
	}
	lines := splitPatchLines(diff)
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// ParseOperationsJSON decodes per-file operations from JSON and parses them
// with FromOperations. It accepts a single operation object, an array of
// them, {"operation": {...}} and {"operations": [...]}; unknown fields are
// ignored.
func ParseOperationsJSON(data []byte, opts Options) (*Patch, error) {
	opts = opts.withDefaults()
	// The JSON envelope may add quoting to the diffs; allow some slack.
	if len(data) > 2*opts.MaxPatchBytes {
		return nil, limitError(OpNameParse, "", "the operations are %d bytes of JSON, more than twice the limit of %d", len(data), opts.MaxPatchBytes)
	}
	ops, err := decodeOperations(bytes.TrimSpace(data))
	if err != nil {
		return nil, syntaxError(0, nil, "operations JSON: %v", err)
	}
	return FromOperations(ops, opts)
}

// decodeOperations accepts the shapes ParseOperationsJSON documents.
func decodeOperations(data []byte) ([]Operation, error) {
	if len(data) > 0 && data[0] == '[' {
		var ops []Operation
		err := json.Unmarshal(data, &ops)
		return ops, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, err
	}
	if raw, ok := fields["operations"]; ok {
		var ops []Operation
		err := json.Unmarshal(raw, &ops)
		return ops, err
	}
	if raw, ok := fields["operation"]; ok {
		var op Operation
		err := json.Unmarshal(raw, &op)
		return []Operation{op}, err
	}
	var op Operation
	err := json.Unmarshal(data, &op)
	return []Operation{op}, err
}
