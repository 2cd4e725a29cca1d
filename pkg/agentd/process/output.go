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
// The output pumps read straight into the ring (landing/commit) instead of
// copying through a buffer of their own. The ring's storage therefore grows
// up to max+land bytes: the land bytes past the newest retained byte are
// where the next read lands, never aliasing a retained byte, so readers can
// copy retained bytes out while a pump's read is in flight.
//
// outputLog is not safe for concurrent use; the owning proc locks it (the
// bytes of a landing slice excepted, see landing).
type outputLog struct {
	buf     []byte // ring storage; byte at absolute offset o lives at buf[o%len(buf)]
	max     int    // retained bytes limit
	land    int    // landing zone: storage may exceed max by this much
	start   int64  // absolute offset of the oldest retained byte
	end     int64  // absolute offset one past the newest byte
	segs    []segment
	segHead int // segs[segHead:] are live
	maxSegs int
	sealed  bool // no more appends are recorded (the exit was reported)
}

func newOutputLog(maxBytes int) *outputLog {
	return &outputLog{max: maxBytes, land: min(outputReadSize, maxBytes), maxSegs: max(64, maxBytes/512)}
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
	l.noteStream(s)
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

// noteStream opens a segment when the next byte (at end) belongs to another
// stream than the last one, dropping the oldest segment and its bytes when
// the index is full.
func (l *outputLog) noteStream(s Stream) {
	if n := len(l.segs) - l.segHead; n == 0 || l.segs[len(l.segs)-1].stream != s {
		l.segs = append(l.segs, segment{off: l.end, stream: s})
		if n+1 > l.maxSegs {
			l.segHead++
			l.start = max(l.start, l.segs[l.segHead].off)
		}
	}
}

// appendStart returns the offset of the oldest byte retained once bytes of
// stream s are appended and the end has advanced by n: what appending would
// evict up to.
func (l *outputLog) appendStart(s Stream, n int64) int64 {
	start := max(l.start, l.end+n-int64(l.max))
	if live := len(l.segs) - l.segHead; live >= l.maxSegs && l.segs[len(l.segs)-1].stream != s {
		start = max(start, l.segs[l.segHead+1].off)
	}
	return start
}

// landing returns ring storage for up to want bytes at offset end, which a
// pump may fill without holding the lock and then record with commit. The
// slice never aliases a retained byte, so readers may copy retained bytes
// concurrently. It may be shorter than want (the ring's end, or a ring
// still growing) but is never empty. The log must not be sealed.
func (l *outputLog) landing(want int) []byte {
	want = max(1, min(want, l.land))
	limit := l.max + l.land
	retained := int(l.end - l.start)
	// Grow (doubling) only when the free part is short and at most half
	// the storage, so that small outputs keep a small ring.
	if free := len(l.buf) - retained; free < want && 2*free <= len(l.buf) && len(l.buf) < limit {
		c := max(2*len(l.buf), min(initialOutputCap, limit))
		if c >= l.max {
			c = limit // not max first: one large copy fewer
		}
		l.resize(min(c, limit))
	}
	n := min(want, len(l.buf)-retained)
	i := int(l.end % int64(len(l.buf)))
	n = min(n, len(l.buf)-i)
	return l.buf[i : i+n : i+n]
}

// commit records the n bytes of stream s that a pump read into the slice
// landing returned, evicting the oldest bytes beyond max. It reports false
// when the log was sealed meanwhile and the bytes were discarded.
func (l *outputLog) commit(s Stream, n int) bool {
	if l.sealed {
		return false
	}
	if n == 0 {
		return true
	}
	l.noteStream(s)
	l.end += int64(n)
	l.start = max(l.start, l.end-int64(l.max))
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
	old := l.buf
	if c == 0 {
		l.buf = nil
		return
	}
	l.buf = make([]byte, c)
	for off := l.start; off < l.end && len(old) > 0; {
		i := int(off % int64(len(old)))
		n := int(min(int64(len(old)-i), l.end-off))
		l.put(off, old[i:i+n])
		off += int64(n)
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
	// A full ring keeps its landing zone rather than be copied whole
	// (briefly doubling its memory) to save at most land bytes.
	if n := int(l.end - l.start); n < len(l.buf) && (len(l.buf) <= l.max || len(l.buf)-n > l.land) {
		l.resize(n)
	}
	l.segs = append([]segment(nil), l.segs[l.segHead:]...)
	l.segHead = 0
}

// drop frees every retained byte and the stream index: from then on a
// read from any cursor reports the bytes up to the end as dropped and
// returns none. The end offset stays, so cursors keep their meaning. The
// log must be sealed (nothing is appended any more). Memory the caller
// lent out of the ring stays valid: it is only no longer referenced here.
func (l *outputLog) drop() {
	l.start = l.end
	l.buf = nil
	l.segs, l.segHead = nil, 0
}

// view is read without copying: the chunks' data aliases the ring's
// storage, valid until the ring overwrites or moves those bytes. Chunks are
// also split where the ring wraps around, so two adjacent chunks may have
// the same stream.
func (l *outputLog) view(cursor int64, maxBytes int, chunks []Chunk) (_ []Chunk, next, dropped int64) {
	chunks = chunks[:0]
	if cursor < l.start {
		dropped = l.start - cursor
		cursor = l.start
	}
	limit := min(l.end, cursor+int64(maxBytes))
	if cursor >= limit {
		return chunks, cursor, dropped
	}
	live := l.segs[l.segHead:]
	i := sort.Search(len(live), func(i int) bool { return live[i].off > cursor }) - 1
	i = max(i, 0)
	for off := cursor; off < limit; {
		segEnd := limit
		if i+1 < len(live) {
			segEnd = min(segEnd, live[i+1].off)
		}
		j := int(off % int64(len(l.buf)))
		n := int(min(segEnd-off, int64(len(l.buf)-j)))
		chunks = append(chunks, Chunk{Stream: live[i].stream, Offset: off, Data: l.buf[j : j+n : j+n]})
		if off += int64(n); off == segEnd {
			i++
		}
	}
	return chunks, limit, dropped
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
