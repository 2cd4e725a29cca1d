package filesystem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/patch"
)

// ApplyPatchToolName is the name of the patch tool.
const ApplyPatchToolName = "apply_patch"

// ApplyPatchGrammar is the Lark grammar that constrains the freeform
// apply_patch input: the V4A envelope as the OpenAI Agents SDK sends it
// (an Update File needs at least one change line).
const ApplyPatchGrammar = `start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
`

// applyPatchFreeformDescription tells the model how to write a patch.
const applyPatchFreeformDescription = "Creates, edits, renames and deletes files in the sandbox workspace with a patch. " +
	"This is a freeform tool: send the patch text itself, never wrapped in JSON.\n" +
	"\n" +
	"A patch starts with the line `*** Begin Patch` and ends with the line `*** End Patch`. " +
	"In between come one or more file operations:\n" +
	"- `*** Add File: <path>` creates a file (or replaces an existing one). Every following line is a line of the new file, prefixed with `+`, blank lines too.\n" +
	"- `*** Delete File: <path>` removes a file. Nothing follows it.\n" +
	"- `*** Update File: <path>` changes a file. It may be followed by `*** Move to: <new path>` to rename the file, then comes at least one hunk.\n" +
	"\n" +
	"A hunk begins with a line `@@`, optionally followed by a space and the text of a line of the file that locates the change, " +
	"such as the enclosing class or function (`@@ def handle(request):`); several `@@ ...` lines in a row narrow the location step by step. " +
	"Each following line starts with one character: a space for a context line that stays as it is, `-` for a line to remove, `+` for a line to add. " +
	"Give about three lines of unchanged context before and after each change, copied exactly from the current file, " +
	"and do not repeat context lines between neighbouring hunks. Hunks of one file must follow the order of the file. " +
	"A hunk whose lines end the file may be closed with `*** End of File`.\n" +
	"\n" +
	"Paths are relative to the working directory and must stay inside the workspace. " +
	"The patch is applied completely or not at all: when any part does not match, no file is changed and the error names the file and the lines that did not match.\n" +
	"\n" +
	"Example:\n" +
	"*** Begin Patch\n" +
	"*** Add File: docs/usage.md\n" +
	"+# Usage\n" +
	"+\n" +
	"+Run `make test`.\n" +
	"*** Update File: app/greeting.py\n" +
	"@@ def greet(name):\n" +
	"     if not name:\n" +
	"-        return \"Hello\"\n" +
	"+        return \"Hello, stranger\"\n" +
	"     return f\"Hello, {name}\"\n" +
	"*** Delete File: app/legacy.py\n" +
	"*** End Patch"

// applyPatchJSONDescription is the description of the function-tool form.
const applyPatchJSONDescription = "Creates, edits, renames and deletes files in the sandbox workspace. " +
	"Give a list of file operations; they are applied together, completely or not at all: when any part does not match, no file is changed " +
	"and the error names the file and the lines that did not match.\n" +
	"- `create_file`: `diff` holds the lines of the new file, each prefixed with `+` (blank lines too). An existing file is replaced.\n" +
	"- `update_file`: `diff` holds one or more hunks. A hunk begins with a line `@@`, optionally followed by a space and the text of a line of the file " +
	"that locates the change (such as the enclosing function); each following line starts with a space (context, kept), `-` (removed) or `+` (added). " +
	"Give about three lines of context around each change, copied exactly from the current file, in file order. Set `move_to` to rename the file.\n" +
	"- `delete_file`: removes the file; no `diff`.\n" +
	"Paths are relative to the working directory and must stay inside the workspace."

// applyPatchJSONSchema is the parameter schema of the function-tool form.
const applyPatchJSONSchema = `{"type":"object","properties":{"operations":{"type":"array","minItems":1,` +
	`"description":"File operations, applied in order and all together.",` +
	`"items":{"type":"object","properties":{` +
	`"type":{"type":"string","enum":["create_file","update_file","delete_file"],"description":"What to do with the file."},` +
	`"path":{"type":"string","minLength":1,"description":"The file, relative to the working directory."},` +
	`"diff":{"type":"string","description":"For create_file, the new file's lines each prefixed with '+'; for update_file, the hunks; omitted for delete_file."},` +
	`"move_to":{"type":"string","description":"For update_file only: the path the updated file is moved to."}},` +
	`"required":["type","path"],"additionalProperties":false}}},` +
	`"required":["operations"],"additionalProperties":false}`

// applyPatchTool is the apply_patch tool.
type applyPatchTool struct {
	format PatchFormat
}

// Definition returns the custom tool with the V4A grammar, or the function
// tool of the JSON form.
func (t *applyPatchTool) Definition() model.Tool {
	if t.format == PatchJSON {
		return model.FunctionTool(ApplyPatchToolName, applyPatchJSONDescription, json.RawMessage(applyPatchJSONSchema), false)
	}
	return model.CustomTool(ApplyPatchToolName, applyPatchFreeformDescription,
		&model.Grammar{Syntax: "lark", Definition: ApplyPatchGrammar})
}

// Call applies the patch through the daemon. input is the patch text (the
// freeform form; JSON operations are accepted there too, as the reference
// does) or the function call's JSON arguments.
func (t *applyPatchTool) Call(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	if call.Agent == nil {
		return tool.Result{}, errors.New("apply_patch: the run has no sandbox")
	}
	opts := agentclient.ApplyPatchOptions{Cwd: call.Workdir, User: call.RunAs}
	var apply func() (*agentclient.PatchResult, error)
	trimmed := strings.TrimSpace(input)
	if t.format == PatchJSON || strings.HasPrefix(trimmed, "{") || strings.HasPrefix(trimmed, "[") {
		ops, err := decodeOperations([]byte(trimmed))
		if err != nil {
			return failure("apply_patch verification failed: the arguments are not valid operations JSON: " + err.Error() + "\n" + nothingChanged), nil
		}
		if _, err := patch.FromOperations(ops, patch.Options{}); isMalformed(err) {
			return failure("apply_patch verification failed: " + err.Error() + "\n" + nothingChanged), nil
		}
		apply = func() (*agentclient.PatchResult, error) {
			return call.Agent.ApplyOperations(ctx, toAgentOperations(ops), opts)
		}
	} else {
		// A malformed patch is answered here, precisely and without a
		// round trip; the daemon checks it again and is the one applying it.
		if _, err := patch.Parse(input, patch.Options{}); isMalformed(err) {
			return failure("apply_patch verification failed: " + err.Error() + "\n" + nothingChanged), nil
		}
		apply = func() (*agentclient.PatchResult, error) { return call.Agent.ApplyPatch(ctx, input, opts) }
	}

	resp, err := apply()
	if err != nil {
		msg, ok := patchFailure(err, call.Workdir)
		if !ok {
			return tool.Result{}, fmt.Errorf("apply_patch: %w", err)
		}
		call.Log.Debug("apply_patch rejected", zap.String("call_id", call.CallID),
			zap.String("path", rejectedPath(err)), zap.String("class", errorClass(err)))
		return failure(msg), nil
	}
	call.Log.Debug("apply_patch applied", zap.String("call_id", call.CallID), zap.Int("changes", len(resp.Changes)))
	return tool.Result{Output: successSummary(resp.Changes)}, nil
}

// nothingChanged ends every rejection message.
const nothingChanged = "No file was changed: the patch applies completely or not at all. Correct it and send it again."

// failure is a result the model should react to.
func failure(msg string) tool.Result { return tool.Result{Output: msg, IsError: true} }

// isMalformed reports whether a local pre-check found the patch malformed.
// Other pre-check failures (a size limit) are left to the daemon, whose
// limits are the ones that count.
func isMalformed(err error) bool {
	return err != nil && errors.Is(err, errkind.ErrInvalidArgument)
}

// decodeOperations reads the per-file operation form: {"operations": [...]}
// (the function tool's arguments), and, as the reference's freeform
// fallback also accepts, {"operation": {...}}, a single operation object or
// an array of them.
func decodeOperations(data []byte) ([]patch.Operation, error) {
	if len(data) > 0 && data[0] == '[' {
		var ops []patch.Operation
		if err := json.Unmarshal(data, &ops); err != nil {
			return nil, err
		}
		return ops, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, err
	}
	if raw, ok := fields["operations"]; ok {
		var ops []patch.Operation
		if err := json.Unmarshal(raw, &ops); err != nil {
			return nil, fmt.Errorf("operations: %w", err)
		}
		return ops, nil
	}
	if raw, ok := fields["operation"]; ok {
		var op patch.Operation
		if err := json.Unmarshal(raw, &op); err != nil {
			return nil, fmt.Errorf("operation: %w", err)
		}
		return []patch.Operation{op}, nil
	}
	if _, ok := fields["type"]; !ok {
		return nil, errors.New(`expected {"operations": [{"type": ..., "path": ..., "diff": ...}]}`)
	}
	var op patch.Operation
	if err := json.Unmarshal(data, &op); err != nil {
		return nil, err
	}
	return []patch.Operation{op}, nil
}

// toAgentOperations maps the operation form onto the daemon client's
// (whose types are the form's: create_file, update_file, delete_file).
func toAgentOperations(ops []patch.Operation) []agentclient.PatchOperation {
	out := make([]agentclient.PatchOperation, 0, len(ops))
	for _, o := range ops {
		out = append(out, agentclient.PatchOperation{Type: agentclient.PatchOperationType(o.Type), Path: o.Path, Diff: o.Diff, MoveTo: o.MoveTo})
	}
	return out
}

// successSummary lists what changed, one operation per line in patch order,
// with the paths as the patch wrote them: "Created p", "Updated p",
// "Updated p\nMoved p to q", "Deleted p" (the reference's wording).
func successSummary(changes []agentclient.PatchChange) string {
	lines := make([]string, 0, len(changes))
	for _, c := range changes {
		switch c.Kind {
		case agentclient.PatchCreated:
			lines = append(lines, "Created "+c.Path)
		case agentclient.PatchDeleted:
			lines = append(lines, "Deleted "+c.Path)
		case agentclient.PatchMoved:
			lines = append(lines, "Updated "+c.Path, "Moved "+c.Path+" to "+c.NewPath)
		default:
			lines = append(lines, "Updated "+c.Path)
		}
	}
	if len(lines) == 0 {
		return "No files were modified."
	}
	return strings.Join(lines, "\n")
}

// patchFailure renders a failed ApplyPatch for the model. ok is false for
// failures the model cannot act on (the daemon unreachable or broken, a
// cancelled call, an unknown run_as user): those end the call with an error.
// The daemon's own text is never quoted: only the patch engine's message
// from the typed rejection, which is written for the model and names only
// the patch's paths, and otherwise the harness's wording for the class.
func patchFailure(err error, workdir string) (msg string, ok bool) {
	if errors.Is(err, errkind.ErrUserNotFound) {
		return "", false
	}
	rej := agentclient.PatchRejection(err)
	p := rejectedPath(err)
	// A PathError says the workspace failed on a file the patch needed
	// (while planning or committing): its cause is worded here, more
	// precisely than the engine's generic "cannot access the file".
	var pe *errkind.PathError
	fileFailure := errors.As(err, &pe)
	var b strings.Builder
	b.WriteString("apply_patch verification failed: ")
	switch {
	case errors.Is(err, errkind.ErrPathEscape):
		fmt.Fprintf(&b, "the path '%s' leads outside the workspace", p)
		if workdir != "" {
			fmt.Fprintf(&b, " (relative paths are resolved from the working directory '%s')", workdir)
		}
		b.WriteString("; every path of a patch must stay inside the workspace, also through symbolic links.")
	case errors.Is(err, errkind.ErrReadOnly):
		fmt.Fprintf(&b, "the path '%s' is read-only.", p)
	case rej != nil && rej.Message != "" && !fileFailure:
		b.WriteString(rej.Message)
		writeRejectionDetail(&b, rej)
	case rej != nil:
		b.WriteString(pathCause(p, err))
		writeRejectionDetail(&b, rej)
	case errors.Is(err, errkind.ErrPermissionDenied):
		fmt.Fprintf(&b, "permission denied: the sandbox user may not change '%s'.", p)
	case errors.Is(err, errkind.ErrNoSpace):
		b.WriteString("the sandbox has no space left on its disk.")
	case errors.Is(err, errkind.ErrPatchRejected), errors.Is(err, errkind.ErrInvalidArgument),
		errors.Is(err, errkind.ErrResourceExhausted):
		b.WriteString(pathCause(p, err))
	default:
		return "", false
	}
	b.WriteString("\n")
	b.WriteString(nothingChanged)
	return b.String(), true
}

// pathCause is "'path': cause." (or "cause." without a path).
func pathCause(path string, err error) string {
	if path == "" {
		return causeText(err) + "."
	}
	return fmt.Sprintf("'%s': %s.", path, causeText(err))
}

// causes are the specific reasons a file operation fails, with how the
// model is told about them.
var causes = [...]struct {
	sentinel error
	text     string
}{
	{errkind.ErrNotDirectory, "not a directory: a parent of this path is a file"},
	{errkind.ErrIsDirectory, "this is a directory, not a file"},
	{errkind.ErrNotFound, "no such file or directory"},
	{errkind.ErrPermissionDenied, "permission denied"},
	{errkind.ErrReadOnly, "the path is read-only"},
	{errkind.ErrNoSpace, "no space left on the sandbox's disk"},
	{errkind.ErrResourceExhausted, "a limit of the sandbox was exceeded"},
}

// causeText names the specific reason of a failure by its class (a
// rejected patch's cause counts, see agentclient): only known wording is
// used, so no text of the daemon reaches the model.
func causeText(err error) string {
	for _, c := range causes {
		if errors.Is(err, c.sentinel) {
			return c.text
		}
	}
	return sentinelText(err)
}

// sentinelText names err's class by its sentinel's text, never by the
// error's own text.
func sentinelText(err error) string {
	if c, ok := errkind.ClassOf(err); ok {
		return c.Err.Error()
	}
	return "the operation failed"
}

// writeRejectionDetail quotes the lines the patch looked for and the
// closest region of the current file, from the daemon's typed rejection.
func writeRejectionDetail(b *strings.Builder, rej *agentclient.PatchRejectionDetail) {
	if rej == nil {
		return
	}
	if lines := rej.ExpectedLines; len(lines) > 0 {
		fmt.Fprintf(b, "\nThe patch looked for these lines in %s (shown without their ' ', '-' or '@@ ' prefix):", rej.Path)
		quoteLines(b, lines, 0)
	}
	if lines := rej.ClosestLines; len(lines) > 0 && rej.ClosestLine > 0 {
		fmt.Fprintf(b, "\nThe closest part of %s starts at line %d and currently reads:", rej.Path, rej.ClosestLine)
		quoteLines(b, lines, rej.ClosestLine)
	}
}

// Bounds on what a rejection quotes.
const (
	maxQuoteLines     = 20
	maxQuoteLineBytes = 200
)

// quoteLines writes lines indented, numbered from first when first > 0,
// at most maxQuoteLines of them, each cut to maxQuoteLineBytes with control
// characters escaped.
func quoteLines(b *strings.Builder, lines []string, first int) {
	for i, l := range lines {
		if i == maxQuoteLines {
			fmt.Fprintf(b, "\n    ... (%d more lines)", len(lines)-i)
			return
		}
		if first > 0 {
			fmt.Fprintf(b, "\n%6d | %s", first+i, printable(l))
		} else {
			fmt.Fprintf(b, "\n    %s", printable(l))
		}
	}
}

// printable cuts s to maxQuoteLineBytes on a rune boundary and escapes
// control characters other than tab.
func printable(s string) string {
	cut := false
	if len(s) > maxQuoteLineBytes {
		n := maxQuoteLineBytes
		for n > 0 && !isRuneStart(s[n]) {
			n--
		}
		s, cut = s[:n], true
	}
	var b strings.Builder
	for _, r := range s {
		if r != '\t' && (r < 0x20 || r == 0x7f) {
			fmt.Fprintf(&b, "\\x%02x", r)
			continue
		}
		b.WriteRune(r)
	}
	if cut {
		b.WriteString(" ...")
	}
	return b.String()
}

func isRuneStart(c byte) bool { return c&0xC0 != 0x80 }

// rejectedPath is the path a failure concerns, as the patch wrote it when
// the daemon's typed rejection says so, else as the daemon reports it
// (joined with the working directory; never a host path).
func rejectedPath(err error) string {
	if rej := agentclient.PatchRejection(err); rej != nil && rej.Path != "" {
		return rej.Path
	}
	var pe *errkind.PathError
	if errors.As(err, &pe) {
		return pe.Path
	}
	return ""
}

// errorClass names err's class for logs.
func errorClass(err error) string { return errkind.Name(err) }
