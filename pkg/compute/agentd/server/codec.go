package server

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/internal/bufpool"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// pool holds the buffers of the bulk paths (see package bufpool).
var pool = &bufpool.Pool{}

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
