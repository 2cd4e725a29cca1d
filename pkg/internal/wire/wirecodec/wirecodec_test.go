package wirecodec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/bufpool"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// fieldShape is what a fast path assumes about one field.
type fieldShape struct {
	name     protoreflect.Name
	num      protowire.Number
	kind     protoreflect.Kind
	repeated bool
	oneof    protoreflect.Name // "" when not in a oneof
}

func (f fieldShape) String() string {
	return fmt.Sprintf("%s = %d (%v, repeated %v, oneof %q)", f.name, f.num, f.kind, f.repeated, f.oneof)
}

// TestFieldNumbers checks the constants, and every field of the messages
// the fast paths encode or decode by hand, against the generated
// descriptors. A field added to one of these messages fails here: the fast
// path must then be reviewed (the server's ReadFile marshaling, for one,
// writes nothing but data when info is unset) and this list updated.
func TestFieldNumbers(t *testing.T) {
	tests := []struct {
		msg    proto.Message
		fields []fieldShape
	}{
		{&agentdv1.ReadFileResponse{}, []fieldShape{
			{name: "info", num: 1, kind: protoreflect.MessageKind},
			{name: "data", num: ReadFileResponseData, kind: protoreflect.BytesKind},
		}},
		{&agentdv1.WriteFileRequest{}, []fieldShape{
			{name: "header", num: 1, kind: protoreflect.MessageKind, oneof: "message"},
			{name: "data", num: WriteFileRequestData, kind: protoreflect.BytesKind, oneof: "message"},
		}},
		{&agentdv1.OutputChunk{}, []fieldShape{
			{name: "stream", num: OutputChunkStream, kind: protoreflect.EnumKind},
			{name: "offset", num: OutputChunkOffset, kind: protoreflect.Int64Kind},
			{name: "data", num: OutputChunkData, kind: protoreflect.BytesKind},
		}},
		{&agentdv1.AttachResponse{}, []fieldShape{
			{name: "chunks", num: AttachResponseChunks, kind: protoreflect.MessageKind, repeated: true},
			{name: "next_cursor", num: 2, kind: protoreflect.Int64Kind},
			{name: "dropped_bytes", num: 3, kind: protoreflect.Int64Kind},
			{name: "exit", num: 4, kind: protoreflect.MessageKind},
		}},
	}
	for _, tt := range tests {
		md := tt.msg.ProtoReflect().Descriptor()
		t.Run(string(md.Name()), func(t *testing.T) {
			var got, want []string
			fds := md.Fields()
			for i := range fds.Len() {
				fd := fds.Get(i)
				f := fieldShape{name: fd.Name(), num: fd.Number(), kind: fd.Kind(), repeated: fd.Cardinality() == protoreflect.Repeated}
				if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
					f.oneof = od.Name()
				}
				got = append(got, f.String())
			}
			for _, f := range tt.fields {
				want = append(want, f.String())
			}
			sort.Strings(got)
			sort.Strings(want)
			if g, w := strings.Join(got, "\n"), strings.Join(want, "\n"); g != w {
				t.Errorf("%s fields differ from what the codecs' fast paths assume (review pkg/internal/wire/wirecodec and both codecs):\ngot\n%s\nwant\n%s", md.FullName(), g, w)
			}
		})
	}
}

// split cuts b into buffers of n bytes, as received frames are.
func split(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(bytes.Clone(b[:k])))
		b = b[k:]
	}
	return s
}

func TestBytesOnlyRoundTrip(t *testing.T) {
	pool := &bufpool.Pool{}
	for _, size := range []int{1, 127, 128, 16 << 10, 300000} {
		data := bytes.Repeat([]byte{0xa5}, size)
		want, err := proto.Marshal(&agentdv1.ReadFileResponse{Data: data})
		if err != nil {
			t.Fatal(err)
		}
		b := pool.Get(size)
		copy(*b, data)
		got := MarshalBytesOnly(pool, ReadFileResponseData, *b).Materialize()
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: MarshalBytesOnly differs from proto.Marshal", size)
		}
		for _, frame := range []int{1, 3, 16 << 10, 1 << 30} {
			dec := DecodeBytesOnly(pool, split(want, frame), ReadFileResponseData)
			if !bytes.Equal(dec, data) {
				t.Fatalf("size %d, frames of %d: decoded %d bytes", size, frame, len(dec))
			}
			pool.PutBytes(dec)
		}
	}
}

func TestDecodeBytesOnlyDeclines(t *testing.T) {
	pool := &bufpool.Pool{}
	other := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	full := other(&agentdv1.ReadFileResponse{Data: []byte("abc")})
	for name, wire := range map[string][]byte{
		"empty message":      nil,
		"info and data":      other(&agentdv1.ReadFileResponse{Info: &agentdv1.FileInfo{Path: "p"}, Data: []byte("abc")}),
		"info only":          other(&agentdv1.ReadFileResponse{Info: &agentdv1.FileInfo{Path: "p"}}),
		"empty data field":   {0x12, 0x00},
		"truncated":          full[:len(full)-1],
		"trailing byte":      append(bytes.Clone(full), 0),
		"wrong field number": append([]byte{0x1a}, full[1:]...),
		"wrong wire type":    append([]byte{0x10}, full[1:]...),
		"bad length varint":  {0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		if got := DecodeBytesOnly(pool, split(wire, 1), ReadFileResponseData); got != nil {
			t.Errorf("%s: decoded %q, want nil", name, got)
		}
	}
}

func TestDecodeAttachMatchesProto(t *testing.T) {
	msgs := []*agentdv1.AttachResponse{
		{},
		{NextCursor: 7, DroppedBytes: 2},
		{Chunks: []*agentdv1.OutputChunk{{Stream: agentdv1.OutputStream_OUTPUT_STREAM_STDOUT, Offset: 3, Data: []byte("hello")}}},
		{Chunks: []*agentdv1.OutputChunk{{}, {Stream: agentdv1.OutputStream(-1), Offset: -5, Data: []byte{0}}},
			Exit: &agentdv1.ExitStatus{ExitCode: 1, Signal: "TERM"}},
	}
	for i, want := range msgs {
		wire, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := &agentdv1.AttachResponse{NextCursor: 99}
		if !DecodeAttach(wire, got) {
			t.Fatalf("message %d: DecodeAttach declined", i)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("message %d: got %v, want %v", i, got, want)
		}
		for _, ch := range got.Chunks {
			if len(ch.Data) > 0 && !aliases(wire, ch.Data) {
				t.Fatalf("message %d: chunk data is a copy, not a part of the received buffer", i)
			}
		}
	}
}

// aliases reports whether part lies inside whole's memory.
func aliases(whole, part []byte) bool {
	for i := range whole {
		if &whole[i] == &part[0] {
			return true
		}
	}
	return false
}

// BytesOnlyHead finds the field's bytes in the frames as DecodeBytesOnly
// copies them, and WriteSkip writes exactly those bytes, whatever the
// frames' sizes.
func TestBytesOnlyHeadAndWriteSkip(t *testing.T) {
	for _, size := range []int{1, 127, 128, 16 << 10, 300000} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i * 7)
		}
		wire, err := proto.Marshal(&agentdv1.ReadFileResponse{Data: data})
		if err != nil {
			t.Fatal(err)
		}
		for _, frame := range []int{1, 3, 16 << 10, 1 << 30} {
			frames := split(wire, frame)
			skip, ok := BytesOnlyHead(frames, ReadFileResponseData)
			if !ok || skip != len(wire)-size {
				t.Fatalf("size %d, frames of %d: skip %d, %v; want %d", size, frame, skip, ok, len(wire)-size)
			}
			var out bytes.Buffer
			n, err := WriteSkip(&out, frames, skip)
			if err != nil || n != int64(size) || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("size %d, frames of %d: wrote %d bytes (%v), equal %v", size, frame, n, err, bytes.Equal(out.Bytes(), data))
			}
		}
	}
	if _, ok := BytesOnlyHead(split([]byte{0x12, 0x00}, 1), ReadFileResponseData); ok {
		t.Error("an empty data field was accepted")
	}
}

// errWriter fails after accepting limit bytes.
type errWriter struct{ limit int }

func (w *errWriter) Write(p []byte) (int, error) {
	if len(p) > w.limit {
		n := w.limit
		w.limit = 0
		return n, errors.New("destination full")
	}
	w.limit -= len(p)
	return len(p), nil
}

// shortWriter accepts one byte less than it is given, without an error.
type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) - 1, nil }

func TestWriteSkipReportsFailures(t *testing.T) {
	frames := split(bytes.Repeat([]byte{1}, 100), 10)
	n, err := WriteSkip(&errWriter{limit: 25}, frames, 2)
	if err == nil || n != 25 {
		t.Errorf("failing destination: wrote %d, %v; want 25 and its error", n, err)
	}
	if _, err := WriteSkip(shortWriter{}, frames, 0); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("short write: %v, want io.ErrShortWrite", err)
	}
}
