package service

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSON is the Connect codec of JSON requests (Connect's own JSON,
// gRPC-Web and gRPC with +json): protojson, like Connect's default, but an
// unknown field is an error rather than dropped. A misspelt field
// ({"approve": true} for "approved") would otherwise be read as its zero
// value, and the call would do what nobody asked (a rejection). Connect
// answers a request the codec cannot read with InvalidArgument; the
// message names the field (`unknown field "approve"`).
type strictJSON struct{ name string }

// strictJSONCodecs are the handler options installing strictJSON under
// both names Connect registers its JSON codec by.
func strictJSONCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSON{name: "json"}),
		connect.WithCodec(strictJSON{name: "json; charset=utf-8"}),
	}
}

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(v any) ([]byte, error) {
	msg, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a protobuf message", v)
	}
	return protojson.MarshalOptions{}.Marshal(msg)
}

func (c strictJSON) Unmarshal(data []byte, v any) error {
	msg, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal into %T: not a protobuf message", v)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(data, msg); err != nil {
		return fmt.Errorf("%s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}
