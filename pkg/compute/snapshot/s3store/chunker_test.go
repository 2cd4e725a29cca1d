package s3store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

func chunksOf(t *testing.T, data []byte, c Chunking) [][]byte {
	t.Helper()
	k := newChunker(bytes.NewReader(data), c)
	var out [][]byte
	for {
		b, err := k.next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
}

// TestChunkerIsContentDefined: chunks rebuild the stream, respect the
// bounds, and an insertion changes only the chunks around it.
func TestChunkerIsContentDefined(t *testing.T) {
	c := DefaultChunking()
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 8<<20)
	for i := 0; i < len(data); i += 8 {
		binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
	}
	a := chunksOf(t, data, c)
	if got := bytes.Join(a, nil); !bytes.Equal(got, data) {
		t.Fatal("chunks do not rebuild the stream")
	}
	for i, ch := range a {
		if len(ch) > c.Max || (len(ch) < c.Min && i != len(a)-1) {
			t.Fatalf("chunk %d has %d bytes", i, len(ch))
		}
	}
	if avg := len(data) / len(a); avg < c.Min+c.Avg/2 || avg > c.Min+2*c.Avg {
		t.Fatalf("average chunk %d bytes over %d chunks", avg, len(a))
	}
	// Insert 100 bytes in the middle: the chunks before and after the
	// change are the same.
	mid := len(data) / 2
	changed := append(append(append([]byte(nil), data[:mid]...), bytes.Repeat([]byte("x"), 100)...), data[mid:]...)
	b := chunksOf(t, changed, c)
	have := map[[32]byte]bool{}
	for _, ch := range a {
		have[sha256.Sum256(ch)] = true
	}
	var fresh int
	for _, ch := range b {
		if !have[sha256.Sum256(ch)] {
			fresh += len(ch)
		}
	}
	if fresh > 3*c.Max {
		t.Fatalf("an insertion of 100 bytes made %d new bytes of chunks", fresh)
	}
	t.Logf("%d chunks, average %d bytes; an insertion re-chunked %d bytes", len(a), len(data)/len(a), fresh)
	if (Chunking{Min: 1, Avg: 3, Max: 4}).validate() == nil {
		t.Fatal("a non-power-of-two average was accepted")
	}
}
