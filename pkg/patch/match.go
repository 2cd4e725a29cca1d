package patch

import (
	"strings"
	"unicode"
)

// matchPass is one way of comparing a patch line with a file line. The
// passes run from strictest to loosest; a looser pass is only tried when the
// stricter one finds no position at all.
type matchPass int

const (
	passExact   matchPass = iota // byte-identical
	passTrimEnd                  // trailing whitespace ignored
	passTrim                     // leading and trailing whitespace ignored
	passFold                     // as passTrim, with Unicode dashes, quotes and spaces folded to ASCII
	numPasses
)

// passKey returns the form of s that pass p compares.
func passKey(p matchPass, s string) string {
	switch p {
	case passExact:
		return s
	case passTrimEnd:
		return strings.TrimRightFunc(s, unicode.IsSpace)
	case passTrim:
		return strings.TrimSpace(s)
	default:
		return foldPunctuation(strings.TrimSpace(s))
	}
}

// foldPunctuation maps typographic dashes, quotes and spaces to their ASCII
// counterparts, so a patch written with straight quotes matches a file with
// curly ones and the reverse.
func foldPunctuation(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return strings.Map(foldRune, s)
		}
	}
	return s
}

func foldRune(r rune) rune {
	switch {
	case r >= 0x2010 && r <= 0x2015, r == 0x2212: // hyphens, dashes, minus sign
		return '-'
	case r >= 0x2018 && r <= 0x201B: // single quotes
		return '\''
	case r >= 0x201C && r <= 0x201F: // double quotes
		return '"'
	case r == 0x00A0, r >= 0x2002 && r <= 0x200A, r == 0x202F, r == 0x205F, r == 0x3000: // spaces
		return ' '
	}
	return r
}

// matcher finds runs of lines in one file. For each pass it maps every
// distinct line key to a small integer once, then searches integer
// sequences with Knuth-Morris-Pratt, so one search costs O(file + pattern)
// however repetitive the file is.
type matcher struct {
	texts []string
	dict  [numPasses]map[string]int32
	ids   [numPasses][]int32
	// budget is the number of file lines left to examine for the whole
	// patch; shared by every matcher of one Plan.
	budget *int
	// exhausted is set once budget ran out; every search then fails.
	exhausted bool
}

// charge takes n lines from the budget and reports whether any was left.
func (m *matcher) charge(n int) bool {
	if m.exhausted {
		return false
	}
	*m.budget -= n
	if *m.budget < 0 {
		m.exhausted = true
	}
	return !m.exhausted
}

// fileIDs returns the key ids of the file's lines for pass p.
func (m *matcher) fileIDs(p matchPass) []int32 {
	if m.ids[p] == nil {
		m.charge(len(m.texts))
		dict := make(map[string]int32, len(m.texts))
		ids := make([]int32, len(m.texts))
		for i, t := range m.texts {
			k := passKey(p, t)
			id, ok := dict[k]
			if !ok {
				id = int32(len(dict))
				dict[k] = id
			}
			ids[i] = id
		}
		m.dict[p], m.ids[p] = dict, ids
	}
	return m.ids[p]
}

// patternIDs returns the key ids of pat for pass p, with -1 for a key no
// file line has. ok is false when pat cannot match anywhere in this pass.
func (m *matcher) patternIDs(p matchPass, pat []string) (ids []int32, ok bool) {
	m.fileIDs(p)
	ids = make([]int32, len(pat))
	ok = true
	for i, s := range pat {
		id, found := m.dict[p][passKey(p, s)]
		if !found {
			id, ok = -1, false
		}
		ids[i] = id
	}
	return ids, ok
}

// seek returns the first index at or after start where pat occurs, trying
// each pass over the whole remaining file before the next, or -1. With eof,
// the only candidate is the position where pat ends the file (and not
// before start). An empty pat matches at start.
func (m *matcher) seek(pat []string, start int, eof bool) int {
	if len(pat) == 0 {
		return start
	}
	last := len(m.texts) - len(pat)
	from := start
	if eof && last > from {
		from = last
	}
	if from > last || from < 0 {
		return -1
	}
	for p := passExact; p < numPasses; p++ {
		want, ok := m.patternIDs(p, pat)
		if m.exhausted {
			return -1
		}
		if !ok {
			continue
		}
		ids := m.ids[p]
		if eof {
			if equalIDs(ids[from:from+len(pat)], want) {
				return from
			}
			continue
		}
		i, scanned := indexIDs(ids[from:], want)
		if !m.charge(scanned) {
			return -1
		}
		if i >= 0 {
			return from + i
		}
	}
	return -1
}

func equalIDs(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

// indexIDs returns the first index of pat in text (or -1) and how many
// elements of text were examined.
func indexIDs(text, pat []int32) (index, scanned int) {
	if len(pat) == 1 {
		for i, x := range text {
			if x == pat[0] {
				return i, i + 1
			}
		}
		return -1, len(text)
	}
	// next[i] is the length of the longest proper prefix of pat[:i+1] that
	// is also its suffix.
	next := make([]int, len(pat))
	for i, k := 1, 0; i < len(pat); i++ {
		for k > 0 && pat[i] != pat[k] {
			k = next[k-1]
		}
		if pat[i] == pat[k] {
			k++
		}
		next[i] = k
	}
	k := 0
	for i, x := range text {
		for k > 0 && x != pat[k] {
			k = next[k-1]
		}
		if x == pat[k] {
			k++
		}
		if k == len(pat) {
			return i - len(pat) + 1, i + 1
		}
	}
	return -1, len(text)
}
