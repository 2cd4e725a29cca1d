package agentclient

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/internal/bufpool"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// pool holds the buffers of the bulk paths (see package bufpool).
var pool = &bufpool.Pool{}

// codec is gRPC's proto codec over the non-clearing pool, used by the bulk
// calls (grpc.ForceCodecV2: the content-subtype, and so the wire, stay
// the same). A ReadFile data message is decoded with a single copy, from
// the received frames straight into a pooled buffer, which ReadFile
// returns to the pool once written to its destination.
type codec struct{}

var _ encoding.CodecV2 = codec{}

// bulk is the call option selecting codec.
var bulk = grpc.ForceCodecV2(codec{})

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
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
	if r, ok := m.(*agentdv1.ReadFileResponse); ok {
		if b := decodeData(data); b != nil {
			proto.Reset(r)
			r.Data = b
			return nil
		}
	}
	buf := data.MaterializeToBuffer(pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// decodeData decodes a message that is nothing but a non-empty bytes
// field number 2 (ReadFileResponse's data) into a pooled buffer. It
// returns nil for anything else.
func decodeData(data mem.BufferSlice) []byte {
	var head [binaryHeadMax]byte
	h := head[:copyPrefix(head[:], data)]
	num, typ, n := protowire.ConsumeTag(h)
	if n < 0 || num != 2 || typ != protowire.BytesType {
		return nil
	}
	size, k := protowire.ConsumeVarint(h[n:])
	if k < 0 || size == 0 || uint64(data.Len()-n-k) != size {
		return nil
	}
	b := pool.Get(int(size))
	copySkip(*b, data, n+k)
	return *b
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

// followCodec is codec for the stream of one Follow: the chunks' data of
// an AttachResponse aliases the buffer the message was received into,
// instead of being copied out of it (and into newly allocated memory),
// and that buffer goes back to the pool when Follow's callback returned
// (release). Messages are decoded by the goroutine calling Recv, so the
// one buffer held needs no lock.
type followCodec struct {
	codec
	held mem.Buffer
}

func (c *followCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*agentdv1.AttachResponse)
	if !ok {
		return c.codec.Unmarshal(data, v)
	}
	c.release()
	buf := data.MaterializeToBuffer(pool)
	if decodeAttach(buf.ReadOnlyData(), m) {
		c.held = buf
		return nil
	}
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// release gives back the buffer of the last message decoded.
func (c *followCodec) release() {
	if c.held != nil {
		c.held.Free()
		c.held = nil
	}
}

// decodeAttach decodes an AttachResponse with its chunks' data aliasing b.
// It reports false for input it does not handle itself (a chunk with
// fields it does not know, malformed input), which proto.Unmarshal then
// decodes (or rejects).
func decodeAttach(b []byte, m *agentdv1.AttachResponse) bool {
	proto.Reset(m)
	var rest []byte // the other fields, merged by proto.Unmarshal
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		if num == 1 && typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(b[n:])
			if k < 0 {
				return false
			}
			ch := &agentdv1.OutputChunk{}
			if !decodeChunk(v, ch) {
				return false
			}
			m.Chunks = append(m.Chunks, ch)
			b = b[n+k:]
			continue
		}
		k := protowire.ConsumeFieldValue(num, typ, b[n:])
		if k < 0 {
			return false
		}
		rest = append(rest, b[:n+k]...)
		b = b[n+k:]
	}
	if len(rest) > 0 {
		if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(rest, m); err != nil {
			return false
		}
	}
	return true
}

// decodeChunk decodes an OutputChunk with its data aliasing b.
func decodeChunk(b []byte, ch *agentdv1.OutputChunk) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return false
			}
			ch.Stream, b = agentdv1.OutputStream(int32(v)), b[k:]
		case num == 2 && typ == protowire.VarintType:
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return false
			}
			ch.Offset, b = int64(v), b[k:]
		case num == 3 && typ == protowire.BytesType:
			v, k := protowire.ConsumeBytes(b)
			if k < 0 {
				return false
			}
			ch.Data, b = nil, b[k:]
			if len(v) > 0 {
				ch.Data = v[:len(v):len(v)]
			}
		default:
			return false
		}
	}
	return true
}

// handOffCodec is codec for the stream of one WriteFile, whose data chunks
// are pooled buffers that the caller hands over (uploadHandOff): a data
// message is marshaled as its few header bytes followed by the chunk
// itself, which the transport writes out and then returns to the pool,
// instead of being copied into a buffer of the message's own.
type handOffCodec struct{ codec }

func (c handOffCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*agentdv1.WriteFileRequest)
	data := m.GetData()
	if !ok || len(data) == 0 {
		return c.codec.Marshal(v)
	}
	head := protowire.AppendTag(make([]byte, 0, binaryHeadMax), 2, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(data)))
	return mem.BufferSlice{mem.SliceBuffer(head), mem.NewBuffer(&data, pool)}, nil
}
