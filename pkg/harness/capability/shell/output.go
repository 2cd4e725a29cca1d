package shell

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// collector gathers the output one call returns. Up to limit bytes are kept
// whole; past that it keeps the first limit/2 bytes and a rolling window of
// the last limit/2, and counts everything.
type collector struct {
	limit    int
	head     []byte // everything, until overflow; then the first limit/2 bytes
	tail     []byte // after overflow: the latest bytes (at least limit/2)
	total    int
	newlines int // '\n' bytes seen, for the line count after an overflow
	lastByte byte
	overflow bool
}

func newCollector(limit int) *collector { return &collector{limit: limit} }

// add appends output.
func (c *collector) add(b []byte) {
	if len(b) == 0 {
		return
	}
	c.total += len(b)
	c.newlines += bytes.Count(b, []byte{'\n'})
	c.lastByte = b[len(b)-1]
	if !c.overflow {
		c.head = append(c.head, b...)
		if len(c.head) <= c.limit {
			return
		}
		half := c.limit / 2
		c.overflow = true
		c.tail = append([]byte(nil), c.head[half:]...)
		c.head = c.head[:half:half]
		c.trimTail()
		return
	}
	c.tail = append(c.tail, b...)
	c.trimTail()
}

// trimTail keeps the tail window bounded (amortized: it is cut back to
// limit/2 once it reaches twice that).
func (c *collector) trimTail() {
	half := c.limit / 2
	if len(c.tail) >= 2*half+utf8.UTFMax {
		c.tail = append([]byte(nil), c.tail[len(c.tail)-half-utf8.UTFMax:]...)
	}
}

// unreadIncompleteRune removes a trailing incomplete UTF-8 sequence (the
// rest of the character is still to come) and returns its length, so that
// the next call returns the character whole.
func (c *collector) unreadIncompleteRune() int {
	buf := c.head
	if c.overflow {
		buf = c.tail
	}
	n := incompleteRuneTail(buf)
	if n == 0 {
		return 0
	}
	if c.overflow {
		c.tail = c.tail[:len(c.tail)-n]
	} else {
		c.head = c.head[:len(c.head)-n]
	}
	c.total -= n
	if c.total > 0 {
		c.lastByte = buf[len(buf)-n-1]
	}
	return n
}

// incompleteRuneTail returns how many trailing bytes of b are a valid but
// unfinished UTF-8 sequence (a lead byte followed by fewer continuation
// bytes than it announces); 0 when b ends on a character boundary or in
// invalid bytes, which are shown as replacement characters right away.
func incompleteRuneTail(b []byte) int {
	for i := 1; i <= min(len(b), utf8.UTFMax-1); i++ {
		c := b[len(b)-i]
		if c&0xC0 == 0x80 {
			continue
		}
		var need int
		switch {
		case c&0xE0 == 0xC0:
			need = 2
		case c&0xF0 == 0xE0:
			need = 3
		case c&0xF8 == 0xF0:
			need = 4
		default:
			return 0
		}
		if i < need {
			return i
		}
		return 0
	}
	return 0
}

// decode turns output bytes into text, replacing each byte that is not
// part of valid UTF-8 with U+FFFD.
func decode(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			sb.WriteRune(utf8.RuneError)
			b = b[1:]
			continue
		}
		sb.Write(b[:size])
		b = b[size:]
	}
	return sb.String()
}

// rendered is output as shown to the model.
type rendered struct {
	text string
	// originalTokens is the estimated size of the whole output when it was
	// truncated; 0 when it was not.
	originalTokens int
}

// render decodes the collected output and truncates it to maxTokens (0:
// no limit) the way the reference does: when the output is larger than the
// byte budget for maxTokens, it keeps the first and last halves of the
// budget (on character boundaries), joined by a marker saying how many
// tokens were cut, after a line giving the total number of lines. Output
// that overflowed the collector is truncated to at most its limit.
func render(c *collector, maxTokens int, est TokenEstimator) rendered {
	var head, tail string
	var size, lines int
	if c.overflow {
		head, tail = decode(c.head), decode(c.tail)
		size = c.total
		lines = c.newlines
		if c.lastByte != '\n' {
			lines++
		}
	} else {
		head = decode(c.head)
		tail = head
		size = len(head)
	}
	budget := -1
	if maxTokens > 0 {
		budget = byteBudget(maxTokens, size, est)
	}
	if c.overflow && (budget < 0 || budget > c.limit) {
		budget = c.limit
	}
	if budget < 0 || budget >= size {
		return rendered{text: head}
	}
	if !c.overflow {
		lines = countLines(head)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Total output lines: %d\n\n", lines)
	marker := fmt.Sprintf("…%d tokens truncated…", est(size-budget))
	if budget == 0 {
		sb.WriteString(marker)
		return rendered{text: sb.String(), originalTokens: est(size)}
	}
	left := budget / 2
	right := budget - left
	prefixEnd := 0
	for i, r := range head {
		end := i + utf8.RuneLen(r) // head is valid UTF-8 (decoded)
		if end > left {
			break
		}
		prefixEnd = end
	}
	suffixStart := len(tail)
	for i := range tail {
		if i >= len(tail)-right {
			suffixStart = i
			break
		}
	}
	if !c.overflow && suffixStart < prefixEnd {
		suffixStart = prefixEnd
	}
	sb.WriteString(head[:prefixEnd])
	sb.WriteString(marker)
	sb.WriteString(tail[suffixStart:])
	return rendered{text: sb.String(), originalTokens: est(size)}
}

// byteBudget returns how many bytes of output fit in maxTokens: the most
// bytes n <= size with est(n) <= maxTokens (size when all of it fits).
func byteBudget(maxTokens, size int, est TokenEstimator) int {
	if est(size) <= maxTokens {
		return size
	}
	lo, hi := 0, size // est(lo) <= maxTokens or lo == 0; est(hi) > maxTokens
	for lo+1 < hi {
		mid := lo + (hi-lo)/2
		if est(mid) <= maxTokens {
			lo = mid
		} else {
			hi = mid
		}
	}
	if est(lo) > maxTokens {
		return 0
	}
	return lo
}

// countLines counts lines the way Python's str.splitlines does: every line
// break (\n, \r, \r\n, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029) ends a
// line, and a last line without a break counts too.
func countLines(s string) int {
	n := 0
	pending := false // characters since the last break
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\r':
			if i+1 < len(s) && s[i+1] == '\n' {
				size = 2
			}
			fallthrough
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			n++
			pending = false
		default:
			pending = true
		}
		i += size
	}
	if pending {
		n++
	}
	return n
}
