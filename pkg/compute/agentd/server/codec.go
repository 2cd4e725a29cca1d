package server

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// bufferPool is a tiered pool of byte buffers (powers of two from 4 KiB to
// 16 MiB) that, unlike gRPC's default pool, does not clear a buffer when it
// is handed out again: every user overwrites the bytes it reads. Clearing
// cost as much as a copy on the bulk paths (output streaming, file
// transfer). The buffers only ever hold this sandbox's own data.
type bufferPool struct {
	tiers [poolMaxShift - poolMinShift + 1]sync.Pool
}

const (
	poolMinShift = 12
	poolMaxShift = 24
)

var pool = &bufferPool{}

// tier returns the index of the smallest tier holding n bytes, or -1 when
// n is larger than the largest tier.
func tier(n int) int {
	if n <= 1<<poolMinShift {
		return 0
	}
	s := bits.Len(uint(n - 1))
	if s > poolMaxShift {
		return -1
	}
	return s - poolMinShift
}

// Get returns a buffer of length n (its bytes are not cleared).
func (p *bufferPool) Get(n int) *[]byte {
	t := tier(n)
	if t < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(t+poolMinShift))
	return &b
}

// Put returns a buffer obtained from Get (any prefix of it). Buffers whose
// capacity is not a tier's are dropped.
func (p *bufferPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<poolMinShift || c&(c-1) != 0 {
		return
	}
	if t := tier(c); t >= 0 {
		p.tiers[t].Put(b)
	}
}

// putBytes returns a buffer whose slice is all that is left of it (a data
// chunk decoded by codec).
func (p *bufferPool) putBytes(b []byte) {
	if b != nil {
		p.Put(&b)
	}
}

// codec is gRPC's proto codec with three changes for the bulk paths:
// marshaling and unmarshaling use the non-clearing pool; a WriteFile data
// message is decoded with a single copy, from the received frames straight
// into a pooled buffer, which the handler hands to the writer and returns
// to the pool once written and hashed (see chunkReader); and a ReadFile
// data-only message is marshaled as its few header bytes followed by its
// data, a pooled buffer that the ReadFile handler hands over and the
// transport returns to the pool once written, instead of being copied.
type codec struct{}

var _ encoding.CodecV2 = codec{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*agentdv1.ReadFileResponse); ok && r.Info == nil && len(r.Data) > 0 && len(r.ProtoReflect().GetUnknown()) == 0 {
		head := protowire.AppendTag(make([]byte, 0, binaryHeadMax), 2, protowire.BytesType)
		head = protowire.AppendVarint(head, uint64(len(r.Data)))
		data := r.Data
		return mem.BufferSlice{mem.SliceBuffer(head), mem.NewBuffer(&data, pool)}, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("proto: failed to marshal, message is %T, want proto.Message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // safe right after Size
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	b := pool.Get(size)
	if _, err := opts.MarshalAppend((*b)[:0], m); err != nil {
		pool.Put(b)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(b, pool)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("failed to unmarshal, message is %T, want proto.Message", v)
	}
	if w, ok := m.(*agentdv1.WriteFileRequest); ok && decodeWriteData(data, w) {
		return nil
	}
	buf := data.MaterializeToBuffer(pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// decodeWriteData decodes a WriteFileRequest that is nothing but a
// non-empty data field (every message after the header) into a pooled
// buffer. It reports false, having changed nothing, for anything else.
func decodeWriteData(data mem.BufferSlice, m *agentdv1.WriteFileRequest) bool {
	var head [binaryHeadMax]byte
	h := head[:copyPrefix(head[:], data)]
	num, typ, n := protowire.ConsumeTag(h)
	if n < 0 || num != 2 || typ != protowire.BytesType {
		return false
	}
	size, k := protowire.ConsumeVarint(h[n:])
	if k < 0 || size == 0 || uint64(data.Len()-n-k) != size {
		return false
	}
	b := pool.Get(int(size))
	copySkip(*b, data, n+k)
	proto.Reset(m)
	m.Message = &agentdv1.WriteFileRequest_Data{Data: *b}
	return true
}

// binaryHeadMax covers a tag and a length varint.
const binaryHeadMax = 16

// copyPrefix copies the first bytes of data into dst.
func copyPrefix(dst []byte, data mem.BufferSlice) int {
	n := 0
	for _, b := range data {
		if n == len(dst) {
			break
		}
		n += copy(dst[n:], b.ReadOnlyData())
	}
	return n
}

// copySkip copies data, less its first skip bytes, into dst.
func copySkip(dst []byte, data mem.BufferSlice, skip int) {
	for _, b := range data {
		d := b.ReadOnlyData()
		if skip >= len(d) {
			skip -= len(d)
			continue
		}
		dst = dst[copy(dst, d[skip:]):]
		skip = 0
	}
}
