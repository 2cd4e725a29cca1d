package patch

import (
	"sort"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// edit replaces oldLen lines of a file, starting at line index start, with
// lines.
type edit struct {
	start, oldLen int
	lines         []textLine
}

// updateText applies the hunks of the update op to the current text of its
// file and returns the new text. The text must be valid UTF-8. budget is the
// matcher's scan budget for the whole patch.
//
// Lines outside the hunks, and the file's own versions of context lines,
// are kept byte for byte with their line endings, a missing final ending
// included: a last line without one stays without one while it stays last.
// Added lines take the file's first line ending, and the last line gains
// that ending only when lines come to follow it. So replacing the last line
// gives a result that ends with a line ending (the reference's fixture 014),
// while a patch that leaves the last line alone leaves it as it was.
func updateText(op *FileOp, text string, budget *int) (string, *Error) {
	bom := ""
	if strings.HasPrefix(text, utf8BOM) {
		bom, text = utf8BOM, text[len(utf8BOM):]
	}
	lines := splitText(text)
	texts := make([]string, len(lines))
	for i, l := range lines {
		texts[i] = l.text
	}
	eol := preferredEOL(lines)
	m := &matcher{texts: texts, budget: budget}
	edits := make([]edit, 0, len(op.Hunks))
	cursor := 0
	for hi := range op.Hunks {
		h := &op.Hunks[hi]
		for _, anchor := range h.Anchors {
			i := m.seek([]string{anchor}, cursor, false)
			if m.exhausted {
				return "", scanLimitError(op)
			}
			if i < 0 {
				return "", anchorError(op, hi, anchor, cursor, m)
			}
			cursor = i + 1
		}
		if h.isInsertion() {
			// Deliberate: Codex appends every insertion-only hunk at the end
			// of the file (its issue #30946); like the Agents SDK we insert
			// after the hunk's last anchor. A hunk without anchor, or marked
			// End of File, still goes at the end.
			at := len(lines)
			if len(h.Anchors) > 0 && !h.EndOfFile {
				at = cursor
			}
			edits = append(edits, edit{start: at, lines: addedLines(h.Lines, eol)})
			continue
		}
		body := h.Lines
		old := h.oldLines()
		i := m.seek(old, cursor, h.EndOfFile)
		if i < 0 && !m.exhausted {
			// A blank line before the next marker often becomes a trailing
			// empty context line the file does not have; retry without it.
			if shorter, ok := withoutTrailingBlankContext(body); ok {
				shorterOld := oldOf(shorter)
				if j := m.seek(shorterOld, cursor, h.EndOfFile); j >= 0 {
					i, body, old = j, shorter, shorterOld
				}
			}
		}
		if m.exhausted {
			return "", scanLimitError(op)
		}
		if i < 0 {
			return "", hunkError(op, hi, cursor, m)
		}
		out := make([]textLine, 0, len(body))
		pos := i
		for _, l := range body {
			switch l.Kind {
			case LineContext:
				out = append(out, lines[pos])
				pos++
			case LineDelete:
				pos++
			default:
				out = append(out, textLine{text: l.Text, eol: eol})
			}
		}
		edits = append(edits, edit{start: i, oldLen: len(old), lines: out})
		cursor = i + len(old)
	}
	// Insertions at the end of the file may come before later hunks.
	sort.SliceStable(edits, func(a, b int) bool { return edits[a].start < edits[b].start })

	var b strings.Builder
	b.Grow(len(bom) + len(text) + len(text)/8 + 64)
	b.WriteString(bom)
	// Only the file's last line can lack an ending (added lines always have
	// one); it gets one only if another line is written after it.
	pending := false
	write := func(ls []textLine) {
		for _, l := range ls {
			if pending {
				b.WriteString(eol)
				pending = false
			}
			b.WriteString(l.text)
			b.WriteString(l.eol)
			pending = l.eol == ""
		}
	}
	pos := 0
	for _, e := range edits {
		if e.start < pos {
			// Unreachable while the cursor only moves forward; kept so that
			// a future change cannot silently corrupt a file.
			return "", &Error{Op: OpNameUpdate, Path: op.Path, Reason: "hunks overlap", Err: errkind.ErrPatchRejected}
		}
		write(lines[pos:e.start])
		write(e.lines)
		pos = e.start + e.oldLen
	}
	write(lines[pos:])
	return b.String(), nil
}

// addedLines returns the "+" lines of a hunk with the given ending.
func addedLines(hl []HunkLine, eol string) []textLine {
	out := make([]textLine, 0, len(hl))
	for _, l := range hl {
		if l.Kind == LineAdd {
			out = append(out, textLine{text: l.Text, eol: eol})
		}
	}
	return out
}

// oldOf returns the context and removed texts of hunk lines.
func oldOf(hl []HunkLine) []string {
	h := Hunk{Lines: hl}
	return h.oldLines()
}

// withoutTrailingBlankContext returns hl without its last context-or-removed
// line when that line is an empty context line: the line no longer has to
// match, and it stays in the result only if added lines follow it (then it
// becomes an added blank line). ok is false when there is no such line.
func withoutTrailingBlankContext(hl []HunkLine) (out []HunkLine, ok bool) {
	j := len(hl) - 1
	for j >= 0 && hl[j].Kind == LineAdd {
		j--
	}
	if j < 0 || hl[j].Kind != LineContext || hl[j].Text != "" {
		return nil, false
	}
	out = append([]HunkLine(nil), hl...)
	if j == len(hl)-1 {
		return out[:j], true
	}
	out[j].Kind = LineAdd
	return out, true
}
