package server

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

func TestCodecWriteFileRequest(t *testing.T) {
	data := bytes.Repeat([]byte("abc"), 400000)
	for _, want := range []*agentdv1.WriteFileRequest{
		{Message: &agentdv1.WriteFileRequest_Data{Data: data}},
		{Message: &agentdv1.WriteFileRequest_Data{Data: []byte{7}}},
		{Message: &agentdv1.WriteFileRequest_Data{Data: []byte{}}},
		{Message: &agentdv1.WriteFileRequest_Header{Header: &agentdv1.WriteFileHeader{Path: "x", Mode: 0o600}}},
		{},
	} {
		wire, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		for _, frame := range []int{1, 5, 16 << 10, 1 << 30} {
			var s mem.BufferSlice
			for b := wire; len(b) > 0; {
				k := min(frame, len(b))
				s = append(s, mem.SliceBuffer(bytes.Clone(b[:k])))
				b = b[k:]
			}
			got := &agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: []byte("stale")}}
			if err := (codec{}).Unmarshal(s, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("frames of %d: got %d bytes, want %d", frame, len(got.GetData()), len(want.GetData()))
			}
		}
	}
}

func TestBufferPoolTiers(t *testing.T) {
	for _, n := range []int{0, 1, 4096, 4097, 1 << 20, 1<<20 + 1, 1 << 24, 1<<24 + 1} {
		b := pool.Get(n)
		if len(*b) != n || (n <= 1<<24 && cap(*b)&(cap(*b)-1) != 0) {
			t.Fatalf("Get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		pool.Put(b)
	}
}

func TestCodecReadFileResponse(t *testing.T) {
	for _, m := range []*agentdv1.ReadFileResponse{
		{Data: bytes.Repeat([]byte{3}, 600000)},
		{Data: []byte{1}},
		{Info: &agentdv1.FileInfo{Path: "f", Size: 1}, Data: []byte{1}},
		{},
	} {
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := (codec{}).Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("marshaled %d bytes, want %d", got.Len(), len(want))
		}
	}
}

// BenchmarkCodecWriteFileData decodes a 256 KiB WriteFile data message
// received in 16 KiB frames (the one-copy path).
func BenchmarkCodecWriteFileData(b *testing.B) {
	wire, err := proto.Marshal(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: bytes.Repeat([]byte{7}, 256<<10)}})
	if err != nil {
		b.Fatal(err)
	}
	var frames mem.BufferSlice
	for w := wire; len(w) > 0; {
		k := min(16<<10, len(w))
		frames = append(frames, mem.SliceBuffer(w[:k]))
		w = w[k:]
	}
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		m := &agentdv1.WriteFileRequest{}
		if err := (codec{}).Unmarshal(frames, m); err != nil {
			b.Fatal(err)
		}
		pool.PutBytes(m.GetData())
	}
}
