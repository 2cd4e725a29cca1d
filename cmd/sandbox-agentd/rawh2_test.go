package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Client is a bare HTTP/2 client connection to a daemon: it sends what a
// hostile client would (header lists of any size, bodies nobody asked for)
// without the limits a gRPC client puts on itself, and records what the
// daemon answers, frame by frame.
type h2Client struct {
	conn net.Conn
	wmu  sync.Mutex // guards w
	w    *http2.Framer

	mu       sync.Mutex // guards what follows
	settings map[http2.SettingID]uint32
	streams  map[uint32]*h2Stream
	closed   error         // why the connection ended (GOAWAY or a read error); nil while open
	pongs    int           // PING acks received
	changed  chan struct{} // closed (and replaced) on every change above
}

// h2Stream is what the daemon sent on one stream.
type h2Stream struct {
	fields    []hpack.HeaderField // response headers then trailers
	ended     bool                // END_STREAM received
	reset     bool                // RST_STREAM received, with code resetCode
	resetCode http2.ErrCode
	// windowCredit sums the stream's WINDOW_UPDATE increments: what the
	// daemon read of the body and gave back.
	windowCredit uint64
}

// h2MaxFrame is the largest frame payload the daemon accepts (HTTP/2's
// default SETTINGS_MAX_FRAME_SIZE, which gRPC announces).
const h2MaxFrame = 16 << 10

// dialH2 opens a connection to the daemon's unix socket path and sends the
// client preface and an empty SETTINGS frame; a goroutine reads the
// daemon's frames until the connection ends (closed at the end of t).
func dialH2(t *testing.T, path string) *h2Client {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &h2Client{conn: conn, w: http2.NewFramer(conn, nil), settings: map[http2.SettingID]uint32{},
		streams: map[uint32]*h2Stream{}, changed: make(chan struct{})}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.w.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go c.read()
	return c
}

// read records the daemon's frames until the connection ends.
func (c *h2Client) read() {
	r := http2.NewFramer(nil, c.conn)
	r.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for {
		f, err := r.ReadFrame()
		if err != nil {
			c.update(func() { c.closed = fmt.Errorf("read: %w", err) })
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			c.update(func() {
				_ = f.ForeachSetting(func(s http2.Setting) error { c.settings[s.ID] = s.Val; return nil })
			})
			c.tryWrite(func(w *http2.Framer) error { return w.WriteSettingsAck() })
		case *http2.PingFrame:
			if f.IsAck() {
				c.update(func() { c.pongs++ })
			} else {
				data := f.Data
				c.tryWrite(func(w *http2.Framer) error { return w.WritePing(true, data) })
			}
		case *http2.MetaHeadersFrame:
			c.update(func() {
				s := c.stream(f.StreamID)
				s.fields = append(s.fields, f.Fields...)
				s.ended = s.ended || f.StreamEnded()
			})
		case *http2.DataFrame:
			c.update(func() { s := c.stream(f.StreamID); s.ended = s.ended || f.StreamEnded() })
		case *http2.RSTStreamFrame:
			c.update(func() { s := c.stream(f.StreamID); s.reset, s.resetCode = true, f.ErrCode })
		case *http2.WindowUpdateFrame:
			if f.StreamID != 0 {
				c.update(func() { c.stream(f.StreamID).windowCredit += uint64(f.Increment) })
			}
		case *http2.GoAwayFrame:
			c.update(func() {
				if c.closed == nil {
					c.closed = fmt.Errorf("GOAWAY %v", f.ErrCode)
				}
			})
		}
	}
}

// tryWrite writes a control frame unless a long write (a huge header
// block) holds the connection: the daemon does not wait for these acks.
func (c *h2Client) tryWrite(write func(*http2.Framer) error) {
	if c.wmu.TryLock() {
		defer c.wmu.Unlock()
		_ = write(c.w)
	}
}

// stream returns the record of stream id; c.mu is held.
func (c *h2Client) stream(id uint32) *h2Stream {
	s := c.streams[id]
	if s == nil {
		s = &h2Stream{}
		c.streams[id] = s
	}
	return s
}

func (c *h2Client) update(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
	close(c.changed)
	c.changed = make(chan struct{})
}

// waitFor waits until cond (called with c.mu held) holds or ctx ends.
func (c *h2Client) waitFor(ctx context.Context, cond func() bool) error {
	for {
		c.mu.Lock()
		ok, ch := cond(), c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitSettings waits for the daemon's SETTINGS and returns them.
func (c *h2Client) waitSettings(ctx context.Context) (map[http2.SettingID]uint32, error) {
	err := c.waitFor(ctx, func() bool { return len(c.settings) > 0 || c.closed != nil })
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && len(c.settings) == 0 {
		err = c.closed
	}
	return maps.Clone(c.settings), err
}

// waitDone waits until stream id ended (END_STREAM or RST_STREAM) or the
// connection did, and describes the outcome: "grpc-status N: message",
// "reset: CODE" or "connection ended: why".
func (c *h2Client) waitDone(ctx context.Context, id uint32) (string, error) {
	err := c.waitFor(ctx, func() bool {
		s := c.streams[id]
		return c.closed != nil || s != nil && (s.ended || s.reset)
	})
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.streams[id]
	switch {
	case s != nil && field(s.fields, "grpc-status") != "":
		return "grpc-status " + field(s.fields, "grpc-status") + ": " + field(s.fields, "grpc-message"), nil
	case s != nil && s.reset:
		return "reset: " + s.resetCode.String(), nil
	case c.closed != nil:
		return "connection ended: " + c.closed.Error(), nil
	}
	return "stream ended without a gRPC status", nil
}

// ping sends a PING and waits for its ack: everything the daemon sent
// before it has then been read.
func (c *h2Client) ping(ctx context.Context) error {
	c.mu.Lock()
	want := c.pongs + 1
	c.mu.Unlock()
	c.wmu.Lock()
	err := c.w.WritePing(false, [8]byte{'b', 'u', 'l', 'k', 'h', 'e', 'a', 'd'})
	c.wmu.Unlock()
	if err != nil {
		return err
	}
	err = c.waitFor(ctx, func() bool { return c.pongs >= want || c.closed != nil })
	if err == nil && c.closed != nil {
		return c.closed
	}
	return err
}

// credit is the stream-level window the daemon gave back on stream id.
func (c *h2Client) credit(id uint32) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.streams[id]; s != nil {
		return s.windowCredit
	}
	return 0
}

func field(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// writeHeaders sends block (see encodeBlock) as stream id's header list:
// one HEADERS frame and as many CONTINUATION frames as it takes.
func (c *h2Client) writeHeaders(id uint32, block []byte, endStream bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	first := block[:min(len(block), h2MaxFrame)]
	rest := block[len(first):]
	if err := c.w.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: endStream, EndHeaders: len(rest) == 0}); err != nil {
		return err
	}
	for len(rest) > 0 {
		frag := rest[:min(len(rest), h2MaxFrame)]
		rest = rest[len(frag):]
		if err := c.w.WriteContinuation(id, len(rest) == 0, frag); err != nil {
			return err
		}
	}
	return nil
}

// writeData sends data on stream id in frames of at most h2MaxFrame,
// ignoring flow control beyond what the caller keeps to.
func (c *h2Client) writeData(id uint32, data []byte, endStream bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for {
		frag := data[:min(len(data), h2MaxFrame)]
		data = data[len(frag):]
		last := len(data) == 0
		if err := c.w.WriteData(id, endStream && last, frag); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

// grpcRequest is the header list of a gRPC call to method, with extra
// fields after the standard ones.
func grpcRequest(method string, extra ...hpack.HeaderField) []hpack.HeaderField {
	return append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: method},
		{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...)
}

// listSize is a header list's size as HTTP/2 counts it against
// SETTINGS_MAX_HEADER_LIST_SIZE: each field's name and value plus 32.
func listSize(fields []hpack.HeaderField) int {
	n := 0
	for _, f := range fields {
		n += int(f.Size())
	}
	return n
}

// encodeBlock HPACK-encodes fields as literals that are never indexed, so
// the block leaves the decoder's dynamic table as it was and can be sent
// on any connection, as often as wanted.
func encodeBlock(fields []hpack.HeaderField) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range fields {
		f.Sensitive = true
		if err := enc.WriteField(f); err != nil {
			panic(err) // writes to a bytes.Buffer do not fail
		}
	}
	return buf.Bytes()
}

// grpcFrame is msg as one gRPC length-prefixed message, uncompressed.
func grpcFrame(msg []byte) []byte {
	out := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

// procMemory is a memory figure of process pid in bytes, from
// /proc/pid/status: key "VmRSS" (resident now) or "VmHWM" (its peak).
func procMemory(pid int, key string) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s line %q: %w", key, line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no " + key + " line in /proc/" + strconv.Itoa(pid) + "/status")
}
