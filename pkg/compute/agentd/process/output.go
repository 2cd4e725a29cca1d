package process

import "sort"

// initialOutputCap is the ring's first allocation; it doubles up to the
// configured maximum so that short-lived processes cost little.
const initialOutputCap = 32 << 10

// segment marks the absolute offset from which bytes belong to a stream.
type segment struct {
	off    int64
	stream Stream
}

// outputLog is one process's output: a single byte log shared by its
// streams, addressed by absolute offsets, of which only the newest max bytes
// are kept in a ring. Stream changes are recorded as segments; their number
// is bounded too (maxSegs), so that a process alternating tiny writes to
// stdout and stderr cannot grow the index without bound: when the index is
// full the oldest segment and its bytes are dropped.
//
// outputLog is not safe for concurrent use; the owning proc locks it.
type outputLog struct {
	buf     []byte // ring storage; byte at absolute offset o lives at buf[o%len(buf)]
	max     int    // capacity limit in bytes
	start   int64  // absolute offset of the oldest retained byte
	end     int64  // absolute offset one past the newest byte
	segs    []segment
	segHead int // segs[segHead:] are live
	maxSegs int
	sealed  bool // no more appends are recorded (the exit was reported)
}

func newOutputLog(maxBytes int) *outputLog {
	return &outputLog{max: maxBytes, maxSegs: max(64, maxBytes/512)}
}

// append records p as the next bytes of stream s, evicting the oldest bytes
// beyond the capacity. It reports false when the log is sealed and the
// bytes were discarded.
func (l *outputLog) append(s Stream, p []byte) bool {
	if l.sealed {
		return false
	}
	if len(p) == 0 {
		return true
	}
	if n := len(l.segs) - l.segHead; n == 0 || l.segs[len(l.segs)-1].stream != s {
		l.segs = append(l.segs, segment{off: l.end, stream: s})
		if n+1 > l.maxSegs {
			l.segHead++
			l.start = max(l.start, l.segs[l.segHead].off)
		}
	}
	l.end += int64(len(p))
	if len(p) > l.max {
		p = p[len(p)-l.max:]
	}
	l.start = max(l.start, l.end-int64(l.max))
	if need := int(l.end - l.start); need > len(l.buf) {
		c := max(len(l.buf), min(initialOutputCap, l.max))
		for c < need {
			c *= 2
		}
		l.resize(min(c, l.max))
	}
	l.put(l.end-int64(len(p)), p)
	l.pruneSegments()
	return true
}

// put copies p into the ring at absolute offset off.
func (l *outputLog) put(off int64, p []byte) {
	for len(p) > 0 {
		i := int(off % int64(len(l.buf)))
		n := copy(l.buf[i:], p)
		p, off = p[n:], off+int64(n)
	}
}

// get copies the bytes at absolute offset off into dst; the range must be
// retained.
func (l *outputLog) get(dst []byte, off int64) {
	for len(dst) > 0 {
		i := int(off % int64(len(l.buf)))
		n := copy(dst, l.buf[i:])
		dst, off = dst[n:], off+int64(n)
	}
}

// resize moves the retained bytes into a ring of capacity c (>= retained).
func (l *outputLog) resize(c int) {
	old := *l
	if c == 0 {
		l.buf = nil
		return
	}
	l.buf = make([]byte, c)
	if len(old.buf) == 0 {
		return
	}
	tmp := make([]byte, min(int(l.end-l.start), 64<<10))
	for off := l.start; off < l.end; {
		n := min(int64(len(tmp)), l.end-off)
		old.get(tmp[:n], off)
		l.put(off, tmp[:n])
		off += n
	}
}

// pruneSegments forgets segments that end before the oldest retained byte.
func (l *outputLog) pruneSegments() {
	for len(l.segs)-l.segHead > 1 && l.segs[l.segHead+1].off <= l.start {
		l.segHead++
	}
	if l.segHead > 32 && l.segHead*2 > len(l.segs) {
		n := copy(l.segs, l.segs[l.segHead:])
		clear(l.segs[n:])
		l.segs = l.segs[:n]
		l.segHead = 0
	}
}

// seal stops recording and shrinks the ring to the retained bytes.
func (l *outputLog) seal() {
	if l.sealed {
		return
	}
	l.sealed = true
	if n := int(l.end - l.start); n < len(l.buf) {
		l.resize(n)
	}
	l.segs = append([]segment(nil), l.segs[l.segHead:]...)
	l.segHead = 0
}

// read returns up to maxBytes of output at or after cursor as chunks split
// at stream changes, the cursor after them, and how many bytes before the
// oldest retained one were skipped. cursor must be in [0, end].
func (l *outputLog) read(cursor int64, maxBytes int) (chunks []Chunk, next, dropped int64) {
	if cursor < l.start {
		dropped = l.start - cursor
		cursor = l.start
	}
	limit := min(l.end, cursor+int64(maxBytes))
	if cursor >= limit {
		return nil, cursor, dropped
	}
	live := l.segs[l.segHead:]
	// The last segment whose start is at or before cursor.
	i := sort.Search(len(live), func(i int) bool { return live[i].off > cursor }) - 1
	i = max(i, 0)
	data := make([]byte, limit-cursor)
	l.get(data, cursor)
	for off := cursor; off < limit; i++ {
		segEnd := limit
		if i+1 < len(live) {
			segEnd = min(segEnd, live[i+1].off)
		}
		n := segEnd - off
		chunks = append(chunks, Chunk{Stream: live[i].stream, Offset: off, Data: data[:n:n]})
		data = data[n:]
		off = segEnd
	}
	return chunks, limit, dropped
}
