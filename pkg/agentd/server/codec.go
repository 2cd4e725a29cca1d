package server

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/bufpool"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/wirecodec"
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
// The wire handling is package wirecodec's, shared with the client.
type codec struct{}

var _ encoding.CodecV2 = codec{}

func (codec) Name() string { return wirecodec.Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*agentdv1.ReadFileResponse); ok && r.Info == nil && len(r.Data) > 0 && len(r.ProtoReflect().GetUnknown()) == 0 {
		return wirecodec.MarshalBytesOnly(pool, wirecodec.ReadFileResponseData, r.Data), nil
	}
	return wirecodec.Marshal(pool, v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if w, ok := v.(*agentdv1.WriteFileRequest); ok {
		if b := wirecodec.DecodeBytesOnly(pool, data, wirecodec.WriteFileRequestData); b != nil {
			proto.Reset(w)
			w.Message = &agentdv1.WriteFileRequest_Data{Data: b}
			return nil
		}
	}
	return wirecodec.Unmarshal(pool, data, v)
}
