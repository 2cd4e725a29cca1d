package patch

import (
	"strings"
	"unicode"
)

// Markers of the patch format. The file markers include the single space
// after the colon.
const (
	markerBegin     = "*** Begin Patch"
	markerEnd       = "*** End Patch"
	markerAdd       = "*** Add File: "
	markerDelete    = "*** Delete File: "
	markerUpdate    = "*** Update File: "
	markerMove      = "*** Move to: "
	markerMoveLoose = "*** Move to:"
	markerEndOfFile = "*** End of File"
	markerEnvID     = "*** Environment ID:"
	markerHunk      = "@@"
)

// parseState is where the body parser is between lines.
type parseState int

const (
	stateBetween parseState = iota // before the first operation or after a Delete File
	stateAdd                       // inside an Add File
	stateUpdate                    // inside an Update File
	stateEnded                     // after an inner "*** End Patch"
)

// bodyParser turns the lines between "*** Begin Patch" and the final
// "*** End Patch" into file operations. The per-file operation form reuses
// its Update File rules.
type bodyParser struct {
	opts      Options
	patch     Patch
	state     parseState
	add       strings.Builder // content of the open Add File
	envIDSeen bool
}

// line consumes line n (1-based, counted from "*** Begin Patch").
func (p *bodyParser) line(n int, line string) error {
	switch p.state {
	case stateEnded:
		if strings.TrimSpace(line) == "" {
			return nil
		}
		return syntaxError(n, nil, "text after '%s'", markerEnd)
	case stateUpdate:
		return p.updateLine(n, line)
	case stateAdd:
		t := strings.TrimSpace(line)
		if isHeaderOrEnd(t) {
			if err := p.closeOp(n, t); err != nil {
				return err
			}
			return p.header(n, t)
		}
		if rest, ok := strings.CutPrefix(line, "+"); ok {
			p.add.WriteString(rest)
			p.add.WriteByte('\n')
			return nil
		}
		return syntaxError(n, p.current(), "line '%s' inside Add File does not start with '+'; every line of a new file, blank ones too, needs a '+' prefix", printable(line))
	default:
		t := strings.TrimSpace(line)
		if t == "" {
			// Deliberately lenient: Codex rejects a blank line between
			// operations, but it is unambiguous here.
			return nil
		}
		return p.header(n, t)
	}
}

// header starts an operation, reads the environment preamble or ends the
// patch. t is the line with whitespace already trimmed as the state requires.
func (p *bodyParser) header(n int, t string) error {
	if t == markerEnd {
		p.state = stateEnded
		return nil
	}
	if rest, ok := strings.CutPrefix(t, markerEnvID); ok && len(p.patch.Ops) == 0 {
		id := strings.TrimSpace(rest)
		switch {
		case id == "":
			return syntaxError(n, nil, "'%s' needs a value", markerEnvID)
		case p.envIDSeen:
			return syntaxError(n, nil, "'%s' appears more than once", markerEnvID)
		}
		p.envIDSeen = true
		p.patch.EnvironmentID = id
		return nil
	}
	var op FileOp
	var rest string
	var ok bool
	if rest, ok = strings.CutPrefix(t, markerAdd); ok {
		op.Kind, p.state = OpAdd, stateAdd
		p.add.Reset()
	} else if rest, ok = strings.CutPrefix(t, markerDelete); ok {
		op.Kind, p.state = OpDelete, stateBetween
	} else if rest, ok = strings.CutPrefix(t, markerUpdate); ok {
		op.Kind, p.state = OpUpdate, stateUpdate
	} else {
		return syntaxError(n, nil, "'%s' is not a file operation header; each operation starts with '%s<path>', '%s<path>' or '%s<path>', and the patch ends with '%s'",
			printable(t), markerAdd, markerDelete, markerUpdate, markerEnd)
	}
	op.Path, op.Line = strings.TrimSpace(rest), n
	if err := checkPath(op.Path); err != "" {
		return syntaxError(n, nil, "%s in '%s'", err, printable(t))
	}
	if len(p.patch.Ops) >= p.opts.MaxOperations {
		return limitError(OpNameParse, "", "more than %d file operations", p.opts.MaxOperations)
	}
	p.patch.Ops = append(p.patch.Ops, op)
	return nil
}

// checkPath returns why a path written in the patch is unusable, or "".
func checkPath(path string) string {
	switch {
	case path == "":
		return "missing path"
	case strings.ContainsRune(path, 0):
		return "path contains a NUL byte"
	}
	return ""
}

// updateLine consumes one line inside an Update File.
func (p *bodyParser) updateLine(n int, line string) error {
	u := strings.TrimRightFunc(line, unicode.IsSpace)
	if isHeaderOrEnd(u) {
		if err := p.closeOp(n, u); err != nil {
			return err
		}
		return p.header(n, u)
	}
	op := p.current()
	h := p.currentHunk()
	if h != nil && h.EndOfFile && !isHunkHeader(u) {
		if u == "" {
			return nil
		}
		return syntaxError(n, op, "only a new '@@' hunk or the next file header may follow '%s', got '%s'", markerEndOfFile, printable(line))
	}
	if rest, ok := strings.CutPrefix(u, markerMoveLoose); ok {
		dest := strings.TrimSpace(rest)
		if err := checkPath(dest); err != "" {
			return syntaxError(n, op, "%s in '%s'", err, printable(u))
		}
		if !strings.HasPrefix(u, markerMove) {
			return syntaxError(n, op, "write '%s<path>' with a space after the colon, got '%s'", markerMove, printable(u))
		}
		if len(op.Hunks) > 0 || op.MoveTo != "" {
			return syntaxError(n, op, "'%s<path>' must directly follow '%s<path>' and appear at most once", markerMove, markerUpdate)
		}
		op.MoveTo = dest
		return nil
	}
	if isHunkHeader(u) {
		anchor := hunkAnchor(u)
		if h != nil && len(h.Lines) == 0 {
			// Stacked anchors ("@@ class A" then "@@ def f"), as the
			// Agents SDK accepts; Codex rejects them.
			if anchor != "" {
				h.Anchors = append(h.Anchors, anchor)
			}
			return nil
		}
		nh := Hunk{Line: n}
		if anchor != "" {
			nh.Anchors = []string{anchor}
		}
		op.Hunks = append(op.Hunks, nh)
		return nil
	}
	if u == markerEndOfFile {
		if h == nil || len(h.Lines) == 0 {
			return syntaxError(n, op, "'%s' must follow the lines of a hunk", markerEndOfFile)
		}
		h.EndOfFile = true
		return nil
	}
	if line == "" {
		if h == nil {
			// A blank line right after the Update File (or Move to) header
			// is skipped, as older Codex did: as an empty context line it
			// would anchor on the file's first blank line.
			return nil
		}
		h.Lines = append(h.Lines, HunkLine{Kind: LineContext})
		return nil
	}
	switch kind := LineKind(line[0]); kind {
	case LineContext, LineAdd, LineDelete:
		if h == nil {
			op.Hunks = append(op.Hunks, Hunk{Line: n})
			h = &op.Hunks[len(op.Hunks)-1]
		}
		h.Lines = append(h.Lines, HunkLine{Kind: kind, Text: line[1:]})
		return nil
	}
	return syntaxError(n, op, "line '%s' inside Update File does not start with ' ' (context), '-' (remove), '+' (add) or '@@' (new hunk)", printable(line))
}

// closeOp finishes the open operation when line n (closing, already
// trimmed) ends it. Only an Update File can be incomplete.
func (p *bodyParser) closeOp(n int, closing string) error {
	switch p.state {
	case stateAdd:
		op := p.current()
		op.Content = []byte(p.add.String())
		p.add.Reset()
	case stateUpdate:
		op := p.current()
		if len(op.Hunks) == 0 {
			return syntaxError(op.Line, op, "Update File has no hunks; give '@@' followed by context, '-' and '+' lines")
		}
		if h := op.Hunks[len(op.Hunks)-1]; len(h.Lines) == 0 {
			return syntaxError(n, op, "hunk %d has '@@' but no context, '-' or '+' lines before '%s'", len(op.Hunks), closing)
		}
	}
	p.state = stateBetween
	return nil
}

// current returns the operation being parsed.
func (p *bodyParser) current() *FileOp {
	if len(p.patch.Ops) == 0 {
		return nil
	}
	return &p.patch.Ops[len(p.patch.Ops)-1]
}

// currentHunk returns the last hunk of the open Update File, or nil.
func (p *bodyParser) currentHunk() *Hunk {
	op := p.current()
	if op == nil || len(op.Hunks) == 0 {
		return nil
	}
	return &op.Hunks[len(op.Hunks)-1]
}

// isHeaderOrEnd reports whether t starts a file operation or ends the patch.
func isHeaderOrEnd(t string) bool {
	return t == markerEnd || strings.HasPrefix(t, markerAdd) ||
		strings.HasPrefix(t, markerDelete) || strings.HasPrefix(t, markerUpdate)
}

// isHunkHeader reports whether u (right-trimmed) is "@@" or "@@ text".
func isHunkHeader(u string) bool {
	return u == markerHunk || strings.HasPrefix(u, markerHunk+" ")
}

// hunkAnchor returns the anchor text of a hunk header, or "" for a bare
// "@@". A unified-diff range header ("@@ -12,7 +12,8 @@ ...") also gives "":
// its numbers say nothing V4A can use, and searching for them as text could
// only fail. (Deliberate: Codex fails such a hunk, the Agents SDK ignores the
// header; we treat it as a bare "@@".)
func hunkAnchor(u string) string {
	if u == markerHunk {
		return ""
	}
	text := u[len(markerHunk)+1:]
	if isUnifiedRange(text) {
		return ""
	}
	return text
}

// isUnifiedRange reports whether s starts like the rest of a unified-diff
// hunk header: "-a[,b] +c[,d] @@".
func isUnifiedRange(s string) bool {
	s, ok := cutRange(s, '-')
	if !ok {
		return false
	}
	s, ok = strings.CutPrefix(s, " ")
	if !ok {
		return false
	}
	s, ok = cutRange(s, '+')
	if !ok {
		return false
	}
	return strings.HasPrefix(s, " @@")
}

// cutRange removes "<sign>digits[,digits]" from the front of s.
func cutRange(s string, sign byte) (string, bool) {
	if len(s) == 0 || s[0] != sign {
		return s, false
	}
	s = s[1:]
	digits := func() bool {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		s = s[i:]
		return i > 0
	}
	if !digits() {
		return s, false
	}
	if rest, ok := strings.CutPrefix(s, ","); ok {
		s = rest
		if !digits() {
			return s, false
		}
	}
	return s, true
}
