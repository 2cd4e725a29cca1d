// Package wirecodec is the protobuf wire handling that the hand-written gRPC
// codecs of the typed client (pkg/compute/agentclient) and of the daemon's
// server (pkg/agentd/server) share: marshaling and unmarshaling
// through a non-clearing buffer pool (pkg/internal/wire/bufpool), and the fast paths
// of the bulk messages, written against the wire format by hand.
//
// The codecs exist for speed. gRPC's own proto codec clears every pooled
// buffer and copies bulk bytes more than once: a ReadFile or WriteFile data
// chunk is decoded here with one copy, from the received frames into a
// pooled buffer; a data chunk being sent is written as its few header bytes
// followed by the caller's buffer, with no copy; and the chunks of an
// AttachResponse alias the buffer the message was received into. Each fast
// path produces exactly what proto.Marshal or proto.Unmarshal would, and
// hands anything it does not handle itself to them. The content-subtype
// stays "proto", so the wire is gRPC's.
//
// Every field number the fast paths use is a constant below, and
// TestFieldNumbers checks each against the generated descriptors, together
// with the complete field sets the fast paths assume: adding a field to one
// of these messages fails that test until the fast path is reviewed.
//
// The daemon links this package: it imports nothing that the daemon's
// server does not already (gRPC's mem and encoding packages, protobuf, the
// generated agentd messages and bufpool).
package wirecodec

import (
	"fmt"
	"io"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/bufpool"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Field numbers of bulkhead.agentd.v1 that the fast paths read and write.
const (
	// ReadFileResponseData is ReadFileResponse.data (bytes).
	ReadFileResponseData protowire.Number = 2
	// WriteFileRequestData is WriteFileRequest.data (bytes, in oneof
	// message).
	WriteFileRequestData protowire.Number = 2
	// AttachResponseChunks is AttachResponse.chunks (repeated OutputChunk).
	AttachResponseChunks protowire.Number = 1
	// OutputChunkStream is OutputChunk.stream (enum OutputStream).
	OutputChunkStream protowire.Number = 1
	// OutputChunkOffset is OutputChunk.offset (int64).
	OutputChunkOffset protowire.Number = 2
	// OutputChunkData is OutputChunk.data (bytes).
	OutputChunkData protowire.Number = 3
)

// Name is the codecs' name, gRPC's proto codec's: the content-subtype, and
// so the wire, are unchanged.
const Name = "proto"

// headMax covers a tag and a length varint.
const headMax = 16

// Marshal marshals v, a proto.Message, as proto.Marshal does, into a
// buffer from pool when the message is large enough for pooling.
func Marshal(pool *bufpool.Pool, v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("proto: failed to marshal, message is %T, want proto.Message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // safe right after Size
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	b := pool.Get(size)
	if _, err := opts.MarshalAppend((*b)[:0], m); err != nil {
		pool.Put(b)
		return nil, fmt.Errorf("marshal %T: %w", v, err)
	}
	return mem.BufferSlice{mem.NewBuffer(b, pool)}, nil
}

// Unmarshal decodes data into v, a proto.Message, with proto.Unmarshal,
// materializing data into a buffer from pool when it arrived in several
// frames.
func Unmarshal(pool *bufpool.Pool, data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("proto: failed to unmarshal, message is %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(pool)
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		return fmt.Errorf("unmarshal %T: %w", v, err)
	}
	return nil
}

// MarshalBytesOnly returns the encoding of a message whose only field is
// the bytes field num holding data (non-empty): its tag and length,
// followed by data itself, which is handed over. data must come from
// pool: the transport returns it there once written.
func MarshalBytesOnly(pool *bufpool.Pool, num protowire.Number, data []byte) mem.BufferSlice {
	head := protowire.AppendTag(make([]byte, 0, headMax), num, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(data)))
	return mem.BufferSlice{mem.SliceBuffer(head), mem.NewBuffer(&data, pool)}
}

// DecodeBytesOnly decodes a message that is nothing but one non-empty
// bytes field num, copying the field's bytes from data straight into a
// buffer from pool, which it returns. It returns nil, having taken
// nothing from pool, for any other message (including malformed ones),
// which the caller then decodes with Unmarshal.
func DecodeBytesOnly(pool *bufpool.Pool, data mem.BufferSlice, num protowire.Number) []byte {
	skip, ok := BytesOnlyHead(data, num)
	if !ok {
		return nil
	}
	b := pool.Get(data.Len() - skip)
	copySkip(*b, data, skip)
	return *b
}

// BytesOnlyHead reports whether data is a message that is nothing but one
// non-empty bytes field num and, if so, the length of the field's tag and
// length (skip): the field's bytes are data less its first skip bytes,
// wherever data's buffers split them. It copies nothing, so a caller can
// keep data's buffers (Ref) and use them in place (see WriteSkip).
func BytesOnlyHead(data mem.BufferSlice, num protowire.Number) (skip int, ok bool) {
	var head [headMax]byte
	h := head[:copyPrefix(head[:], data)]
	n, typ, tagLen := protowire.ConsumeTag(h)
	if tagLen < 0 || n != num || typ != protowire.BytesType {
		return 0, false
	}
	size, k := protowire.ConsumeVarint(h[tagLen:])
	if k < 0 || size == 0 || uint64(data.Len()-tagLen-k) != size {
		return 0, false
	}
	return tagLen + k, true
}

// WriteSkip writes data, less its first skip bytes, to w, one Write per
// buffer of data (no copy), and returns the bytes written.
func WriteSkip(w io.Writer, data mem.BufferSlice, skip int) (int64, error) {
	var total int64
	for _, b := range data {
		d := b.ReadOnlyData()
		if skip >= len(d) {
			skip -= len(d)
			continue
		}
		n, err := w.Write(d[skip:])
		total += int64(n)
		if err != nil {
			return total, err
		}
		if n != len(d)-skip {
			return total, io.ErrShortWrite
		}
		skip = 0
	}
	return total, nil
}

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

// DecodeAttach decodes b, an AttachResponse, into m (reset first), the
// data of its chunks aliasing b. It reports false for input it does not
// handle itself (a chunk with a field it does not know, malformed input),
// which the caller then decodes with proto.Unmarshal (which resets m
// again) or rejects.
func DecodeAttach(b []byte, m *agentdv1.AttachResponse) bool {
	proto.Reset(m)
	var rest []byte // the other fields, merged by proto.Unmarshal
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		if num == AttachResponseChunks && typ == protowire.BytesType {
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
		case num == OutputChunkStream && typ == protowire.VarintType:
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return false
			}
			ch.Stream, b = agentdv1.OutputStream(int32(v)), b[k:]
		case num == OutputChunkOffset && typ == protowire.VarintType:
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return false
			}
			ch.Offset, b = int64(v), b[k:]
		case num == OutputChunkData && typ == protowire.BytesType:
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
