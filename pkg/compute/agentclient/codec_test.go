package agentclient

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/wirecodec"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

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

func TestFollowCodecMatchesProto(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 50000)
	msgs := []*agentdv1.AttachResponse{
		{},
		{NextCursor: 7},
		{Chunks: []*agentdv1.OutputChunk{{Stream: agentdv1.OutputStream_OUTPUT_STREAM_STDOUT, Offset: 3, Data: []byte("hello")}}, NextCursor: 8},
		{Chunks: []*agentdv1.OutputChunk{
			{Stream: agentdv1.OutputStream_OUTPUT_STREAM_STDERR, Offset: 1 << 40, Data: big},
			{Stream: agentdv1.OutputStream_OUTPUT_STREAM_PTY, Data: nil},
			{Stream: agentdv1.OutputStream(42), Offset: 9, Data: []byte{0}},
		}, NextCursor: 1<<40 + 500000, DroppedBytes: 12, Exit: &agentdv1.ExitStatus{ExitCode: 3, Signal: "KILL", TimedOut: true}},
	}
	for i, want := range msgs {
		wire, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		for _, frame := range []int{1, 7, 16 << 10, 1 << 30} {
			fc := &followCodec{}
			got := &agentdv1.AttachResponse{NextCursor: 99, Chunks: []*agentdv1.OutputChunk{{}}} // reset first
			if err := fc.Unmarshal(split(wire, frame), got); err != nil {
				t.Fatalf("message %d, frames of %d: %v", i, frame, err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("message %d, frames of %d: got %v, want %v", i, frame, got, want)
			}
			fc.release()
		}
	}
}

func TestFollowCodecFallsBack(t *testing.T) {
	// A chunk with a field the fast path does not know: proto decodes it,
	// keeping the unknown field.
	chunk := protowire.AppendTag(nil, 3, protowire.BytesType)
	chunk = protowire.AppendBytes(chunk, []byte("data"))
	chunk = protowire.AppendTag(chunk, 9, protowire.VarintType)
	chunk = protowire.AppendVarint(chunk, 5)
	wire := protowire.AppendTag(nil, 1, protowire.BytesType)
	wire = protowire.AppendBytes(wire, chunk)
	want := &agentdv1.AttachResponse{}
	if err := proto.Unmarshal(wire, want); err != nil {
		t.Fatal(err)
	}
	fc := &followCodec{}
	got := &agentdv1.AttachResponse{}
	if err := fc.Unmarshal(split(wire, 3), got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) || fc.held != nil {
		t.Fatalf("got %v, want %v (held %v)", got, want, fc.held != nil)
	}
	// Malformed input is an error, as with proto.
	if err := fc.Unmarshal(split(wire[:len(wire)-1], 3), got); err == nil {
		t.Fatal("truncated message decoded")
	}
}

func TestReadFileDataDecode(t *testing.T) {
	data := bytes.Repeat([]byte{1, 2, 3}, 100000)
	for _, want := range []*agentdv1.ReadFileResponse{
		{Data: data},
		{Data: []byte{9}},
		{Info: &agentdv1.FileInfo{Path: "p", Size: 3}, Data: data},
		{},
	} {
		wire, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := &agentdv1.ReadFileResponse{Data: []byte("stale")}
		if err := (codec{}).Unmarshal(split(wire, 16<<10), got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("got %d bytes, want %d", len(got.GetData()), len(want.GetData()))
		}
	}
}

func TestHandOffCodecMatchesProto(t *testing.T) {
	for _, m := range []*agentdv1.WriteFileRequest{
		{Message: &agentdv1.WriteFileRequest_Data{Data: bytes.Repeat([]byte{5}, 300000)}},
		{Message: &agentdv1.WriteFileRequest_Data{Data: []byte("x")}},
		{Message: &agentdv1.WriteFileRequest_Header{Header: &agentdv1.WriteFileHeader{Path: "a/b", Mode: 0o644}}},
	} {
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := handOffCodec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("marshaled %d bytes, want %d", got.Len(), len(want))
		}
	}
}

// BenchmarkCodecReadFileData decodes a 256 KiB ReadFile data message
// received in 16 KiB frames (the one-copy path).
func BenchmarkCodecReadFileData(b *testing.B) {
	wire, err := proto.Marshal(&agentdv1.ReadFileResponse{Data: bytes.Repeat([]byte{7}, 256<<10)})
	if err != nil {
		b.Fatal(err)
	}
	frames := split(wire, 16<<10)
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		m := &agentdv1.ReadFileResponse{}
		if err := (codec{}).Unmarshal(frames, m); err != nil {
			b.Fatal(err)
		}
		pool.PutBytes(m.Data)
	}
}

// BenchmarkFollowCodec decodes an AttachResponse of four 64 KiB chunks
// received in 16 KiB frames (the aliasing path).
func BenchmarkFollowCodec(b *testing.B) {
	want := &agentdv1.AttachResponse{NextCursor: 1 << 20}
	for i := range 4 {
		want.Chunks = append(want.Chunks, &agentdv1.OutputChunk{Stream: agentdv1.OutputStream_OUTPUT_STREAM_STDOUT, Offset: int64(i) << 16, Data: bytes.Repeat([]byte{byte(i)}, 64<<10)})
	}
	wire, err := proto.Marshal(want)
	if err != nil {
		b.Fatal(err)
	}
	frames := split(wire, 16<<10)
	fc := &followCodec{}
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		m := &agentdv1.AttachResponse{}
		if err := fc.Unmarshal(frames, m); err != nil {
			b.Fatal(err)
		}
		fc.release()
	}
}

// countingPool is a mem.BufferPool that counts the buffers given back.
type countingPool struct{ put int }

func (p *countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *countingPool) Put(*[]byte)       { p.put++ }

// readFileCodec keeps a data message's frames past Unmarshal (gRPC frees
// its own reference when Unmarshal returns) until release, and leaves the
// data in them; a message with the info is decoded as proto would.
func TestReadFileCodecKeepsFrames(t *testing.T) {
	data := bytes.Repeat([]byte{4, 5, 6}, 20000)
	wire, err := proto.Marshal(&agentdv1.ReadFileResponse{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	pool := &countingPool{}
	var frames mem.BufferSlice
	for b := wire; len(b) > 0; {
		k := min(16<<10, len(b))
		buf := pool.Get(k)
		copy(*buf, b[:k])
		frames = append(frames, mem.NewBuffer(buf, pool))
		b = b[k:]
	}
	c := &readFileCodec{}
	got := &agentdv1.ReadFileResponse{Data: []byte("stale")}
	if err := c.Unmarshal(frames, got); err != nil {
		t.Fatal(err)
	}
	frames.Free() // as gRPC does after Unmarshal
	if pool.put != 0 {
		t.Fatalf("%d frames went back to the pool while held", pool.put)
	}
	if len(got.GetData()) != 0 || got.GetInfo() != nil || c.held == nil {
		t.Fatalf("data message decoded into the message (%d bytes) or not held", len(got.GetData()))
	}
	var out bytes.Buffer
	if _, err := wirecodec.WriteSkip(&out, c.held, c.skip); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("held frames give %d bytes (%v), want the data", out.Len(), err)
	}
	c.release()
	if pool.put != len(frames) {
		t.Fatalf("release gave back %d of %d frames", pool.put, len(frames))
	}

	want := &agentdv1.ReadFileResponse{Info: &agentdv1.FileInfo{Path: "p", Size: 3}, Data: []byte{7, 8, 9}}
	wire, err = proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got = &agentdv1.ReadFileResponse{}
	if err := c.Unmarshal(split(wire, 5), got); err != nil {
		t.Fatal(err)
	}
	if c.held != nil || !proto.Equal(got, want) {
		t.Fatalf("info message: held %v, decoded %v", c.held != nil, got)
	}
}
