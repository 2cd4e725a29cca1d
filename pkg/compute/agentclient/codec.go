package agentclient

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/bufpool"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/wirecodec"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// pool holds the buffers of the bulk paths (see package bufpool).
var pool = &bufpool.Pool{}

// codec is gRPC's proto codec over the non-clearing pool, used by the bulk
// calls (grpc.ForceCodecV2: the content-subtype, and so the wire, stay
// the same). A ReadFile data message is decoded with a single copy, from
// the received frames straight into a pooled buffer, which ReadFile
// returns to the pool once written to its destination. The wire handling
// is package wirecodec's, shared with the daemon's server.
type codec struct{}

var _ encoding.CodecV2 = codec{}

// bulk is the call option selecting codec.
var bulk = grpc.ForceCodecV2(codec{})

func (codec) Name() string { return wirecodec.Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) { return wirecodec.Marshal(pool, v) }

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*agentdv1.ReadFileResponse); ok {
		if b := wirecodec.DecodeBytesOnly(pool, data, wirecodec.ReadFileResponseData); b != nil {
			proto.Reset(r)
			r.Data = b
			return nil
		}
	}
	return wirecodec.Unmarshal(pool, data, v)
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
	if wirecodec.DecodeAttach(buf.ReadOnlyData(), m) {
		c.held = buf
		return nil
	}
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		return fmt.Errorf("unmarshal %T: %w", v, err)
	}
	return nil
}

// release gives back the buffer of the last message decoded.
func (c *followCodec) release() {
	if c.held != nil {
		c.held.Free()
		c.held = nil
	}
}

// readFileCodec is codec for the stream of one ReadFile: a data message is
// not decoded at all. Its received frames are kept (held, the field's
// bytes starting skip bytes in) and ReadFile writes them to its
// destination in place, then releases them: the data is not copied out of
// the frames it arrived in. Messages are decoded by the goroutine calling
// Recv, so the frames held need no lock.
type readFileCodec struct {
	codec
	held mem.BufferSlice
	skip int
}

func (c *readFileCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.release()
	if r, ok := v.(*agentdv1.ReadFileResponse); ok {
		if skip, ok := wirecodec.BytesOnlyHead(data, wirecodec.ReadFileResponseData); ok {
			proto.Reset(r)
			data.Ref() // gRPC frees data when Unmarshal returns
			c.held, c.skip = data, skip
			return nil
		}
	}
	return c.codec.Unmarshal(data, v)
}

// release gives back the frames of the last data message decoded.
func (c *readFileCodec) release() {
	if c.held != nil {
		c.held.Free()
		c.held = nil
	}
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
	if !ok || len(data) == 0 || len(m.ProtoReflect().GetUnknown()) > 0 {
		return c.codec.Marshal(v)
	}
	return wirecodec.MarshalBytesOnly(pool, wirecodec.WriteFileRequestData, data), nil
}
