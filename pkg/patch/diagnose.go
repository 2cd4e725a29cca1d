package patch

import (
	"fmt"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Bounds on the search for the closest region after a failed match. The
// search costs up to len(file) * maxClosestCompare comparisons and is
// skipped when that exceeds maxClosestWork.
const (
	maxClosestCompare = 64
	maxClosestWork    = 32 << 20
	maxAnchorCompare  = 200 // bytes of an anchor compared with file lines
)

// hunkError explains why hunk hi of op found no place at or after cursor.
func hunkError(op *FileOp, hi, cursor int, m *matcher) *Error {
	h := &op.Hunks[hi]
	old := h.oldLines()
	e := &Error{Op: OpNameUpdate, Path: op.Path, Line: h.Line, Hunk: hi + 1, Context: keepLines(old), Err: errkind.ErrPatchRejected}
	if len(m.texts) == 0 {
		e.Reason = fmt.Sprintf("hunk %d does not match: the file is empty", hi+1)
		return e
	}
	if j := m.seek(old, 0, false); j >= 0 {
		e.Closest = regionAt(m.texts, j, old)
		if h.EndOfFile {
			e.Reason = fmt.Sprintf("hunk %d is marked '%s' but its lines are not the last lines of the file; they occur at line %d",
				hi+1, markerEndOfFile, j+1)
		} else {
			e.Reason = fmt.Sprintf("hunk %d matches only at line %d, above line %d where the previous hunk or anchor left the search; hunks and anchors must follow file order and must not overlap",
				hi+1, j+1, cursor+1)
		}
		return e
	}
	where := "anywhere in the file"
	if cursor > 0 {
		where = fmt.Sprintf("at or after line %d (where the previous hunk or anchor left the search)", cursor+1)
	}
	e.Reason = fmt.Sprintf("hunk %d does not match: its context and removed lines do not occur %s, even ignoring whitespace and typographic quotes and dashes; copy them exactly from the current file",
		hi+1, where)
	e.Closest = m.closest(old, cursor)
	return e
}

// anchorError explains why an "@@ anchor" of hunk hi was not found at or
// after cursor.
func anchorError(op *FileOp, hi int, anchor string, cursor int, m *matcher) *Error {
	h := &op.Hunks[hi]
	e := &Error{Op: OpNameUpdate, Path: op.Path, Line: h.Line, Hunk: hi + 1, Context: []string{anchor}, Err: errkind.ErrPatchRejected}
	if j := m.seek([]string{anchor}, 0, false); j >= 0 {
		e.Reason = fmt.Sprintf("anchor '@@ %s' of hunk %d occurs only at line %d, above line %d where the previous hunk or anchor left the search; hunks and anchors must follow file order",
			printable(anchor), hi+1, j+1, cursor+1)
		e.Closest = regionAt(m.texts, j, []string{anchor})
		return e
	}
	e.Reason = fmt.Sprintf("anchor '@@ %s' of hunk %d is not a line of the file at or after line %d; an anchor must repeat a line of the file, such as the class or function line enclosing the change",
		printable(anchor), hi+1, cursor+1)
	e.Closest = m.closestAnchor(anchor, cursor)
	return e
}

// scanLimitError reports that matching used up Options.MaxScanLines.
func scanLimitError(op *FileOp) *Error {
	return limitError(OpNameUpdate, op.Path, "matching the hunks needs too much work; split the patch into smaller ones")
}

// regionAt returns the file lines at index start that correspond to pat,
// counting the non-blank lines of pat that agree once surrounding whitespace
// is ignored.
func regionAt(texts []string, start int, pat []string) *Region {
	n := min(len(pat), len(texts)-start)
	r := &Region{StartLine: start + 1, Lines: keepLines(texts[start : start+n])}
	for k := 0; k < n; k++ {
		want := strings.TrimSpace(pat[k])
		if want == "" {
			continue
		}
		r.Compared++
		if strings.TrimSpace(texts[start+k]) == want {
			r.Agree++
		}
	}
	return r
}

// closest returns the region of the file where the most non-blank lines of
// pat agree (ignoring surrounding whitespace) with the line at the same
// offset, preferring, among equals, the first one at or after cursor. It
// returns nil when no non-blank line agrees anywhere or the search would be
// too long.
func (m *matcher) closest(pat []string, cursor int) *Region {
	n := len(m.texts)
	compare := min(len(pat), maxClosestCompare)
	if n == 0 || compare == 0 || n*compare > maxClosestWork || m.exhausted {
		return nil
	}
	want, _ := m.patternIDs(passTrim, pat[:compare])
	ids := m.ids[passTrim]
	blank, hasBlank := m.dict[passTrim][""]
	if !hasBlank {
		blank = -1
	}
	best, bestOff := 0, -1
	for off := 0; off < n; off++ {
		agree := 0
		for k := 0; k < compare && off+k < n; k++ {
			if w := want[k]; w >= 0 && w != blank && ids[off+k] == w {
				agree++
			}
		}
		if agree > best || (agree == best && agree > 0 && off >= cursor && bestOff < cursor) {
			best, bestOff = agree, off
		}
	}
	if best == 0 {
		return nil
	}
	return regionAt(m.texts, bestOff, pat)
}

// closestAnchor returns the file line sharing the longest prefix with the
// anchor (after trimming and folding), if that prefix covers at least half
// the anchor; among equals the first at or after cursor wins.
func (m *matcher) closestAnchor(anchor string, cursor int) *Region {
	a := passKey(passFold, anchor)
	if len(a) > maxAnchorCompare {
		a = a[:maxAnchorCompare]
	}
	if len(a) < 3 || len(m.texts)*len(a) > maxClosestWork {
		return nil
	}
	best, bestOff := 0, -1
	for i, t := range m.texts {
		p := commonPrefixLen(a, passKey(passFold, t))
		if p > best || (p == best && p > 0 && i >= cursor && bestOff < cursor) {
			best, bestOff = p, i
		}
	}
	if best < 3 || 2*best < len(a) {
		return nil
	}
	return &Region{StartLine: bestOff + 1, Lines: []string{m.texts[bestOff]}}
}

func commonPrefixLen(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
