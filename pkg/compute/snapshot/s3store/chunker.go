package s3store

import (
	"errors"
	"fmt"
	"io"
)

// Chunking cuts a stream into content-defined chunks: a cut falls where a
// rolling hash of the last bytes matches a mask, so an insertion or a
// change moves only the cuts around it and the chunks elsewhere keep their
// bytes (and so their content address). The hash is a gear hash (as in
// FastCDC): h = h<<1 + gear[b], whose top bits depend on the last 64
// bytes; the mask tests the top bits.
type Chunking struct {
	// Min and Max bound a chunk's size; Avg (a power of two) is the
	// expected size past Min.
	Min, Avg, Max int
}

// DefaultChunking suits workspace tar streams: small enough that a change
// to one file re-uploads about 160 KiB (the expected chunk), large enough
// that a GiB workspace is about 6,500 objects.
func DefaultChunking() Chunking { return Chunking{Min: 32 << 10, Avg: 128 << 10, Max: 512 << 10} }

// chunkingVersion names the hash, its table and how masks are made; a
// change to any of them must change it (manifests record it).
const chunkingVersion = "gear64-v1"

func (c Chunking) validate() error {
	if c.Min <= 0 || c.Avg <= 0 || c.Max < c.Min || c.Avg&(c.Avg-1) != 0 || c.Max > maxChunkSize {
		return fmt.Errorf("chunking %+v: want 0 < min <= max <= %d and a power-of-two average", c, maxChunkSize)
	}
	return nil
}

// maxChunkSize bounds Chunking.Max, and so what one chunk may make a
// reader allocate.
const maxChunkSize = 16 << 20

// chunker reads a stream and returns it as chunks.
type chunker struct {
	r    io.Reader
	c    Chunking
	mask uint64
	gear [256]uint64
	buf  []byte // buf[:n] is read, not yet returned
	n    int
	eof  bool
}

func newChunker(r io.Reader, c Chunking) *chunker {
	k := &chunker{r: r, c: c, buf: make([]byte, c.Max)}
	bits := 0
	for 1<<bits < c.Avg {
		bits++
	}
	k.mask = ^uint64(0) << (64 - bits) // the top bits: they see the most bytes
	// A fixed table from a fixed seed (splitmix64): every harness cuts the
	// same stream at the same places, which is what makes chunks shared.
	seed := uint64(0x62756c6b68656164) // "bulkhead"
	for i := range k.gear {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		k.gear[i] = z ^ (z >> 31)
	}
	return k
}

// next returns the next chunk in a new slice, or io.EOF after the last.
func (k *chunker) next() ([]byte, error) {
	for !k.eof && k.n < len(k.buf) {
		m, err := k.r.Read(k.buf[k.n:])
		k.n += m
		if errors.Is(err, io.EOF) {
			k.eof = true
		} else if err != nil {
			return nil, err
		}
	}
	if k.n == 0 {
		return nil, io.EOF
	}
	cut := k.n
	if k.n > k.c.Min {
		var h uint64
		for i := k.c.Min; i < k.n; i++ {
			h = h<<1 + k.gear[k.buf[i]]
			if h&k.mask == 0 {
				cut = i + 1
				break
			}
		}
	}
	out := make([]byte, cut)
	copy(out, k.buf[:cut])
	k.n = copy(k.buf, k.buf[cut:k.n])
	return out, nil
}
