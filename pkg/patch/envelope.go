package patch

import (
	"strings"
	"unicode/utf8"
)

// Parse parses a whole patch: "*** Begin Patch", file operations,
// "*** End Patch". Surrounding whitespace, whitespace around the Begin, End
// and file header lines, CRLF line endings and a "<<EOF" heredoc wrapper
// (<<EOF, <<'EOF' or <<"EOF" on the first line, a last line ending in EOF)
// are tolerated. Line numbers in errors count "*** Begin Patch" as line 1.
//
// Parse fails with an *Error wrapping compute.ErrInvalidArgument when the
// text is malformed or holds no file operation, and compute.ErrResourceExhausted
// when it exceeds opts.MaxPatchBytes or opts.MaxOperations.
func Parse(text string, opts Options) (*Patch, error) {
	opts = opts.withDefaults()
	if len(text) > opts.MaxPatchBytes {
		return nil, limitError(OpNameParse, "", "the patch is %d bytes, more than the limit of %d", len(text), opts.MaxPatchBytes)
	}
	if !utf8.ValidString(text) {
		return nil, syntaxError(0, nil, "the patch text is not valid UTF-8")
	}
	lines, err := envelopeLines(text)
	if err != nil {
		return nil, err
	}
	p := &bodyParser{opts: opts}
	last := len(lines) - 1
	for i := 1; i < last; i++ {
		if err := p.line(i+1, lines[i]); err != nil {
			return nil, err
		}
	}
	// The final line is "*** End Patch" (checked by envelopeLines), whatever
	// the state; it closes the open operation.
	if p.state != stateEnded {
		if err := p.closeOp(last+1, markerEnd); err != nil {
			return nil, err
		}
	}
	if len(p.patch.Ops) == 0 {
		return nil, syntaxError(0, nil, "the patch contains no file operations")
	}
	return &p.patch, nil
}

// envelopeLines splits the patch into lines (on "\n", dropping one "\r" at
// the end of each), checks the Begin and End lines, and unwraps a heredoc.
// The first returned line is "*** Begin Patch" and the last "*** End Patch",
// each possibly padded with whitespace.
func envelopeLines(text string) ([]string, error) {
	text = strings.TrimSpace(text)
	if text == "" {
		return nil, syntaxError(0, nil, "the patch is empty; it must start with '%s' and end with '%s'", markerBegin, markerEnd)
	}
	lines := splitPatchLines(text)
	err := checkEnvelope(lines)
	if err == nil {
		return lines, nil
	}
	if n := len(lines); n >= 4 && isHeredocStart(lines[0]) && strings.HasSuffix(lines[n-1], "EOF") {
		inner := lines[1 : n-1]
		if err := checkEnvelope(inner); err != nil {
			return nil, err
		}
		return inner, nil
	}
	return nil, err
}

// checkEnvelope checks that lines start with "*** Begin Patch" and end with
// "*** End Patch" (ignoring surrounding whitespace) as separate lines.
func checkEnvelope(lines []string) error {
	if strings.TrimSpace(lines[0]) != markerBegin {
		return syntaxError(1, nil, "the first line must be '%s'", markerBegin)
	}
	if len(lines) < 2 || strings.TrimSpace(lines[len(lines)-1]) != markerEnd {
		return syntaxError(len(lines), nil, "the last line must be '%s'", markerEnd)
	}
	return nil
}

func isHeredocStart(line string) bool {
	return line == "<<EOF" || line == "<<'EOF'" || line == `<<"EOF"`
}

// splitPatchLines splits on "\n" and removes one trailing "\r" per line.
func splitPatchLines(text string) []string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	return lines
}
