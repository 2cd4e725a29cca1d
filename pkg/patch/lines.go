package patch

import "strings"

// textLine is one line of a file: its text and the ending that followed it
// ("\n", "\r\n", "\r", or "" for a last line without one).
type textLine struct {
	text string
	eol  string
}

// utf8BOM is kept out of line texts so a patch can match the first line; it
// is written back in front of the result.
const utf8BOM = "\ufeff"

// splitText splits s into lines on "\r\n", lone "\r" and "\n". A final
// ending does not start another line, so "a\nb\n" has two lines and "" none.
func splitText(s string) []textLine {
	lines := make([]textLine, 0, strings.Count(s, "\n")+1)
	for len(s) > 0 {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			lines = append(lines, textLine{text: s})
			break
		}
		eol := s[i : i+1]
		if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
			eol = s[i : i+2]
		}
		lines = append(lines, textLine{text: s[:i], eol: eol})
		s = s[i+len(eol):]
	}
	return lines
}

// preferredEOL is the ending of the first line that has one, or "\n".
func preferredEOL(lines []textLine) string {
	for _, l := range lines {
		if l.eol != "" {
			return l.eol
		}
	}
	return "\n"
}
