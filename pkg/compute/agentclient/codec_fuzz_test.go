package agentclient

import (
	"testing"

	"google.golang.org/protobuf/proto"

	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// FuzzClientDecode feeds bytes such as an untrusted daemon could send to
// the client's hand-written decoders (an AttachResponse through a Follow's
// codec, a ReadFileResponse through the bulk codec), received in frames of
// the given size (0: one frame), and checks each against proto.Unmarshal:
// the same message, or both an error. The seed corpus is in
// testdata/fuzz/FuzzClientDecode.
func FuzzClientDecode(f *testing.F) {
	for _, m := range []proto.Message{
		&agentdv1.AttachResponse{Chunks: []*agentdv1.OutputChunk{{Stream: agentdv1.OutputStream_OUTPUT_STREAM_STDOUT, Offset: 1, Data: []byte("out")}}, NextCursor: 4},
		&agentdv1.ReadFileResponse{Data: []byte("file bytes")},
	} {
		wire, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(wire, uint16(0))
	}
	f.Fuzz(func(t *testing.T, wire []byte, frame uint16) {
		n := int(frame)
		if n == 0 {
			n = len(wire) + 1
		}
		frames := split(wire, n)

		fc := &followCodec{}
		defer fc.release()
		stale := &agentdv1.AttachResponse{NextCursor: 1, Chunks: []*agentdv1.OutputChunk{{Data: []byte("stale")}}}
		checkSame(t, wire, fc.Unmarshal(frames, stale), stale, &agentdv1.AttachResponse{})

		staleFile := &agentdv1.ReadFileResponse{Info: &agentdv1.FileInfo{Path: "stale"}, Data: []byte("stale")}
		checkSame(t, wire, (codec{}).Unmarshal(frames, staleFile), staleFile, &agentdv1.ReadFileResponse{})
	})
}

// checkSame checks got, decoded from wire with error err, against what
// proto.Unmarshal makes of wire into want.
func checkSame(t *testing.T, wire []byte, err error, got, want proto.Message) {
	t.Helper()
	werr := proto.Unmarshal(wire, want)
	switch {
	case (err == nil) != (werr == nil):
		t.Fatalf("%T from %x: codec error %v, proto.Unmarshal error %v", want, wire, err, werr)
	case err == nil && !proto.Equal(got, want):
		t.Fatalf("%T from %x: codec decoded %v, proto.Unmarshal %v", want, wire, got, want)
	}
}
