package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// The limits a hostile tenant meets (issue #27): the header list the
// daemon decodes for one call, and how much its resident memory may grow
// under the attacks below.
const (
	wantMaxHeaderList = 64 << 10
	// rssSlack is how far above idle the daemon's RSS may be after an
	// attack. Idle is the daemon in use between calls (see settle): it
	// served its harness and the attack's pattern of token-less calls of
	// ordinary size. What is measured is then what the attack's content
	// adds, not what any burst of calls costs the Go runtime: from a
	// fresh daemon's 12 MiB, 120 small refused calls alone added 4.3 MiB
	// (the heap grown to its goal, garbage not yet collected). The fresh
	// figure is logged too.
	rssSlack = 4 << 20
)

// hostileDaemon starts the real daemon for the attacks below, with the
// reclaimer off so that nothing gives memory back behind the
// measurements, and returns it with its socket's path.
func hostileDaemon(ctx context.Context, t *testing.T, extra ...string) (*runningDaemon, string) {
	t.Helper()
	testenv.Require(t, testenv.Linux)
	var stderr lockedBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	})
	d := startBinary(ctx, t, &stderr, append([]string{"--reclaim-idle", "0", "--reclaim-growth-bytes", "0", "--log-level", "warn"}, extra...)...)
	return d, strings.TrimPrefix(d.addr, "unix://")
}

// lockedBuffer is a bytes.Buffer safe for the daemon's stderr copier and
// the test to share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// settle brings the daemon to its state in use: its harness writes and
// reads back a 1 MiB file and runs ten commands, then attack makes its
// calls with perConn, block and body, which must all be refused as
// Unauthenticated.
func settle(ctx context.Context, t *testing.T, d *runningDaemon, socket string, perConn int, block, body func(int) []byte) {
	t.Helper()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	if _, err := d.client.WriteFile(ctx, "settle.bin", agentclient.WriteFileOptions{}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := d.client.ReadFile(ctx, "settle.bin", agentclient.ReadFileOptions{}, &back); err != nil || back.Len() != len(data) {
		t.Fatalf("read back %d bytes: %v", back.Len(), err)
	}
	for range 10 {
		if _, err := d.client.Exec(ctx, agentclient.ProcessSpec{Command: "echo settled"}, agentclient.ExecOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, out := range attack(ctx, t, socket, perConn, block, body) {
		if !strings.HasPrefix(out, "grpc-status 16:") {
			t.Fatalf("ordinary call %d without a token: %q, want grpc-status 16 (Unauthenticated)", i, out)
		}
	}
}

// rss is the daemon's VmRSS, failing t when it cannot be read.
func rss(t *testing.T, d *runningDaemon, key string) int64 {
	t.Helper()
	n, err := procMemory(d.cmd.Process.Pid, key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The attacks below make attackCalls calls, on attackConcurrency
// connections at a time.
const (
	attackCalls       = 40
	attackConcurrency = 2
)

// attack makes attackCalls calls, perConn on each connection (which it
// closes once they are over), attackConcurrency connections at a time.
// Call i sends block(i) as its header list and, if the daemon still
// listens, body(i) as its request stream; a connection's calls are
// written one after the other without waiting for any answer, as a
// client that does not care for answers sends them. It returns every
// call's outcome (see h2Client.waitDone).
func attack(ctx context.Context, t *testing.T, socket string, perConn int, block, body func(i int) []byte) []string {
	t.Helper()
	outcomes := make([]string, attackCalls)
	sem := make(chan struct{}, attackConcurrency)
	var wg sync.WaitGroup
	for first := 0; first < attackCalls; first += perConn {
		sem <- struct{}{}
		c := dialH2(t, socket)
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			calls := min(perConn, attackCalls-first)
			// A write fails once the daemon closed the connection: that
			// is one of the refusals waitDone reports.
			for j := range calls {
				if err := c.writeHeaders(uint32(2*j+1), block(first+j), false); err != nil {
					break
				}
				if err := c.writeData(uint32(2*j+1), body(first+j), true); err != nil {
					break
				}
			}
			for j := range calls {
				out, err := c.waitDone(ctx, uint32(2*j+1))
				if err != nil {
					out = "no outcome: " + err.Error()
				}
				outcomes[first+j] = out
			}
			c.conn.Close()
		}()
	}
	wg.Wait()
	return outcomes
}

// TestHugeHeadersWithoutToken makes 40 calls to the real daemon, each on
// its own connection, two at a time, without a token and with 15 MiB of
// metadata (half of them as one header, half as 8 KiB headers): every
// call is refused, the daemon's resident memory ends within 4 MiB of idle
// (see rssSlack), and it still serves its harness.
func TestHugeHeadersWithoutToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, socket := hostileDaemon(ctx, t)
	const padBytes = 15 << 20
	info := agentdv1.SystemService_Info_FullMethodName
	oneHeader := encodeBlock(grpcRequest(info, hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("a", padBytes)}))
	var many []hpack.HeaderField
	for size := 0; size < padBytes; {
		f := hpack.HeaderField{Name: fmt.Sprintf("x-pad-%d", len(many)), Value: strings.Repeat("b", 8<<10)}
		many = append(many, f)
		size += int(f.Size())
	}
	manyHeaders := encodeBlock(grpcRequest(info, many...))
	huge := func(i int) []byte {
		if i%2 == 0 {
			return oneHeader
		}
		return manyHeaders
	}
	small := encodeBlock(grpcRequest(info, hpack.HeaderField{Name: "x-note", Value: "ordinary"}))
	empty := func(int) []byte { return grpcFrame(nil) }

	fresh := rss(t, d, "VmRSS")
	settle(ctx, t, d, socket, 1, func(int) []byte { return small }, empty)
	idle := rss(t, d, "VmRSS")
	outcomes := attack(ctx, t, socket, 1, huge, empty)
	after := rss(t, d, "VmRSS")
	t.Logf("daemon RSS fresh %.1f MiB, idle %.1f MiB, after %d calls with %d MiB of headers %.1f MiB (peak %.1f MiB); outcomes: %q, %q",
		mib(fresh), mib(idle), attackCalls, padBytes>>20, mib(after), mib(rss(t, d, "VmHWM")), outcomes[0], outcomes[1])
	for i, out := range outcomes {
		// Refused by HTTP/2 (a reset stream or a closed connection), not
		// by a gRPC status: that would mean the headers were decoded.
		if !strings.HasPrefix(out, "reset: ") && !strings.HasPrefix(out, "connection ended: ") {
			t.Errorf("call %d without a token: %s, want it refused over its header list", i, out)
		}
	}
	if after-idle > rssSlack {
		t.Errorf("daemon RSS grew by %.1f MiB (%.1f -> %.1f MiB), want at most %.0f MiB", mib(after-idle), mib(idle), mib(after), mib(rssSlack))
	}
	if _, err := d.client.Info(ctx); err != nil {
		t.Fatalf("the harness's own call after the attack: %v", err)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestStreamWithoutTokenRefusedBeforeBody opens client streams to
// WriteFile without a token: the daemon refuses one on its headers alone,
// before any of its body was sent; refuses one whose headers came with a
// file's header message and the whole stream window of data without
// reading any of it (no window given back) and without writing the file;
// and 40 such streams, 8 MiB of body each, ten after another on each of
// four connections, two connections at a time, leave its resident memory
// within 4 MiB of idle (see rssSlack).
func TestStreamWithoutTokenRefusedBeforeBody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, socket := hostileDaemon(ctx, t)
	block := encodeBlock(grpcRequest(agentdv1.FileService_WriteFile_FullMethodName))
	c := dialH2(t, socket)
	settings, err := c.waitSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	window, ok := settings[http2.SettingInitialWindowSize]
	if !ok {
		window = 65535 // HTTP/2's initial window
	}

	// Headers only: the answer comes with not one byte of body sent.
	if err := c.writeHeaders(1, block, false); err != nil {
		t.Fatal(err)
	}
	out, err := c.waitDone(ctx, 1)
	if err != nil || !strings.HasPrefix(out, "grpc-status 16:") {
		t.Fatalf("WriteFile headers without a token: %q %v, want grpc-status 16 (Unauthenticated) before any body", out, err)
	}

	// Headers, then the file's header and a stream window of data in one
	// go, as a client that does not wait for an answer sends them.
	body := writeFileBody(t, "pwned.txt", int(window))
	if err := c.writeHeaders(3, block, false); err != nil {
		t.Fatal(err)
	}
	if err := c.writeData(3, body, true); err != nil {
		t.Fatal(err)
	}
	out, err = c.waitDone(ctx, 3)
	if err != nil || !strings.HasPrefix(out, "grpc-status 16:") {
		t.Fatalf("WriteFile with a body and without a token: %q %v, want grpc-status 16 (Unauthenticated)", out, err)
	}
	// A stream the daemon read from gets its window back as it reads; a
	// PING round trip makes sure anything it sent before has arrived.
	if err := c.ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.credit(3); n != 0 {
		t.Errorf("the daemon read %d bytes of a refused stream's body (window given back)", n)
	}
	if _, err := os.Lstat(filepath.Join(d.ws, "pwned.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused WriteFile left a file: %v", err)
	}

	// Memory: idle after the same streams with the file's header message
	// only, then with a stream window of data each, ten streams one
	// after the other on each connection: a daemon that opened a stream
	// for each would buffer their data until a handler refused it.
	const perConn = 10
	headerOnly := writeFileBody(t, "pwned.txt", 0)
	settle(ctx, t, d, socket, perConn, func(int) []byte { return block }, func(int) []byte { return headerOnly })
	idle := rss(t, d, "VmRSS")
	outcomes := attack(ctx, t, socket, perConn, func(int) []byte { return block }, func(int) []byte { return body })
	after := rss(t, d, "VmRSS")
	t.Logf("daemon RSS idle %.1f MiB, after %d WriteFile streams of %.0f MiB each without a token, %d per connection, %.1f MiB; first outcome %q",
		mib(idle), attackCalls, mib(int64(len(body))), perConn, mib(after), outcomes[0])
	for i, out := range outcomes {
		if !strings.HasPrefix(out, "grpc-status 16:") {
			t.Errorf("WriteFile %d without a token: %q, want grpc-status 16 (Unauthenticated)", i, out)
		}
	}
	if after-idle > rssSlack {
		t.Errorf("daemon RSS grew by %.1f MiB (%.1f -> %.1f MiB), want at most %.0f MiB", mib(after-idle), mib(idle), mib(after), mib(rssSlack))
	}
	if _, err := os.Lstat(filepath.Join(d.ws, "pwned.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused WriteFile left a file: %v", err)
	}
}

// writeFileBody is a WriteFile request stream for path: its header
// message, then data messages filling up to n bytes on the wire in all
// (none when n leaves no room).
func writeFileBody(t *testing.T, path string, n int) []byte {
	t.Helper()
	hdr, err := proto.Marshal(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Header{Header: &agentdv1.WriteFileHeader{Path: path}}})
	if err != nil {
		t.Fatal(err)
	}
	body := grpcFrame(hdr)
	const chunk = 1 << 20
	for len(body) < n {
		size := min(chunk, n-len(body)-5-8) // 5: the message prefix; 8: a data field's tag and length, at most
		if size <= 0 {
			break
		}
		msg, err := proto.Marshal(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: bytes.Repeat([]byte{'x'}, size)}})
		if err != nil {
			t.Fatal(err)
		}
		body = append(body, grpcFrame(msg)...)
	}
	return body
}

// TestHeaderListLimit checks the daemon's header list limit on an
// authenticated connection: it announces 64 KiB and a stream limit in its
// SETTINGS; a call whose header list is exactly 64 KiB is served, one byte
// more is refused; and the harness's client with a few KiB of metadata
// works as before.
func TestHeaderListLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, socket := hostileDaemon(ctx, t)
	if _, err := d.client.Info(metadata.AppendToOutgoingContext(ctx, "x-request-note", strings.Repeat("n", 4<<10))); err != nil {
		t.Fatalf("Info with 4 KiB of metadata: %v", err)
	}

	c := dialH2(t, socket)
	settings, err := c.waitSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := settings[http2.SettingMaxHeaderListSize]; got != wantMaxHeaderList {
		t.Errorf("SETTINGS_MAX_HEADER_LIST_SIZE = %d, want %d", got, wantMaxHeaderList)
	}
	// The default --max-processes (64) gives the floor, 1024.
	if got := settings[http2.SettingMaxConcurrentStreams]; got != 1024 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want 1024", got)
	}

	// sized is an authenticated Info call whose header list is size bytes.
	sized := func(size int) []byte {
		fields := grpcRequest(agentdv1.SystemService_Info_FullMethodName, hpack.HeaderField{Name: "authorization", Value: "Bearer " + d.token})
		pad := hpack.HeaderField{Name: "x-pad"}
		pad.Value = strings.Repeat("p", size-listSize(fields)-int(pad.Size()))
		fields = append(fields, pad)
		if listSize(fields) != size {
			t.Fatalf("built a header list of %d bytes, want %d", listSize(fields), size)
		}
		return encodeBlock(fields)
	}
	call := func(c *h2Client, id uint32, block []byte) string {
		t.Helper()
		if err := c.writeHeaders(id, block, false); err != nil {
			return "write: " + err.Error()
		}
		if err := c.writeData(id, grpcFrame(nil), true); err != nil {
			return "write: " + err.Error()
		}
		out, err := c.waitDone(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := call(c, 1, sized(wantMaxHeaderList)); out != "grpc-status 0: " {
		t.Errorf("authenticated Info with a %d-byte header list: %q, want it served", wantMaxHeaderList, out)
	}
	// Over the limit: refused by HTTP/2 (a reset stream, or a closed
	// connection when the excess is large), never served.
	refused := func(out string) bool {
		return strings.HasPrefix(out, "reset: ") || strings.HasPrefix(out, "connection ended: ") || strings.HasPrefix(out, "write: ")
	}
	if out := call(c, 3, sized(wantMaxHeaderList+1)); !refused(out) {
		t.Errorf("authenticated Info with a %d-byte header list: %q, want it refused", wantMaxHeaderList+1, out)
	}
	big := dialH2(t, socket)
	if out := call(big, 1, sized(1<<20)); !refused(out) {
		t.Errorf("authenticated Info with a 1 MiB header list: %q, want it refused", out)
	}
	if _, err := d.client.Info(ctx); err != nil {
		t.Fatalf("the harness's own call afterwards: %v", err)
	}
}
