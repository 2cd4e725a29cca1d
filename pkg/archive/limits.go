package archive

import (
	"io"
	"math"
	"sync/atomic"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// endMarker is the size of tar's end-of-archive marker: two zero blocks.
const endMarker = 1024

// resolve returns l with defaults in place of zero fields, or an error for
// a negative or meaningless field.
func (l Limits) resolve() (Limits, error) {
	bad := func(field string) (Limits, error) {
		return Limits{}, refuse(opRestore, ".", errkind.ErrInvalidArgument, "limits: %s is out of range", field)
	}
	switch {
	case l.MaxMembers < 0:
		return bad("MaxMembers")
	case l.MaxBytes < 0:
		return bad("MaxBytes")
	case l.MaxInputBytes < 0:
		return bad("MaxInputBytes")
	case l.RatioMinBytes < 0:
		return bad("RatioMinBytes")
	case l.MaxPathBytes < 0:
		return bad("MaxPathBytes")
	case l.MaxDepth < 0:
		return bad("MaxDepth")
	case math.IsNaN(l.MaxExpansionRatio) || l.MaxExpansionRatio < 0 ||
		(l.MaxExpansionRatio > 0 && l.MaxExpansionRatio < 1):
		return bad("MaxExpansionRatio")
	}
	if l.MaxMembers == 0 {
		l.MaxMembers = DefaultMaxMembers
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxInputBytes == 0 {
		l.MaxInputBytes = DefaultMaxInputBytes
	}
	if l.MaxExpansionRatio == 0 {
		l.MaxExpansionRatio = DefaultMaxExpansionRatio
	}
	if l.RatioMinBytes == 0 {
		l.RatioMinBytes = DefaultRatioMinBytes
	}
	if l.MaxPathBytes == 0 {
		l.MaxPathBytes = DefaultMaxPathBytes
	}
	if l.MaxDepth == 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l, nil
}

// meter enforces the stream limits. The input side may be read by the
// decompressor's own goroutines, hence the atomics.
type meter struct {
	lim *Limits
	// in counts bytes read from the caller's reader.
	in atomic.Int64
	// inOver is set once in passed MaxInputBytes.
	inOver atomic.Bool
	// inErr is the caller's reader's own failure, if any (not io.EOF).
	inErr atomic.Pointer[error]

	// out counts decompressed bytes handed to the tar reader; zeros counts
	// how many of the last ones were zero bytes.
	out, zeros int64
	// err is the first limit the output side saw crossed; once set every
	// read fails with it.
	err error
}

// input wraps the caller's reader.
func (m *meter) input(r io.Reader) io.Reader { return &inputCounter{r: r, m: m} }

// output wraps the decompressed stream.
func (m *meter) output(r io.Reader) io.Reader { return &outputMeter{r: r, m: m} }

// inputCounter counts and bounds the bytes of the caller's reader.
type inputCounter struct {
	r io.Reader
	m *meter
}

// Read implements io.Reader.
func (c *inputCounter) Read(p []byte) (int, error) {
	if c.m.inOver.Load() {
		return 0, errInputLimit
	}
	n, err := c.r.Read(p)
	if c.m.in.Add(int64(n)) > c.m.lim.MaxInputBytes {
		c.m.inOver.Store(true)
		return n, errInputLimit
	}
	if err != nil && err != io.EOF {
		c.m.inErr.CompareAndSwap(nil, &err)
	}
	return n, err
}

// errInputLimit stops the decompressor once the input limit is passed; the
// output side reports the limit itself.
var errInputLimit = errkind.Errorf(errkind.ErrResourceExhausted, "input limit reached")

// outputMeter counts the decompressed bytes, checks the input and ratio
// limits after every read, and remembers how many trailing bytes were zero
// (to recognise a complete end-of-archive marker).
type outputMeter struct {
	r io.Reader
	m *meter
}

// Read implements io.Reader.
func (o *outputMeter) Read(p []byte) (int, error) {
	m := o.m
	if m.err != nil {
		return 0, m.err
	}
	n, err := o.r.Read(p)
	m.out += int64(n)
	if n > 0 {
		i := n
		for i > 0 && p[i-1] == 0 {
			i--
		}
		if i == 0 {
			m.zeros += int64(n)
		} else {
			m.zeros = int64(n - i)
		}
	}
	if m.check() != nil {
		return n, m.err
	}
	return n, err
}

// check sets m.err when a stream limit is crossed and returns it.
func (m *meter) check() error {
	if m.err != nil {
		return m.err
	}
	in := m.in.Load()
	switch {
	case m.inOver.Load():
		m.err = errkind.Errorf(errkind.ErrResourceExhausted,
			"the archive is larger than the input limit of %d bytes", m.lim.MaxInputBytes)
	case m.out > m.lim.RatioMinBytes && float64(m.out) > m.lim.MaxExpansionRatio*float64(max(in, 1)):
		m.err = errkind.Errorf(errkind.ErrResourceExhausted,
			"the archive expands more than %g times (%d bytes from %d)", m.lim.MaxExpansionRatio, m.out, in)
	}
	return m.err
}
