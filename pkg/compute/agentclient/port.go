package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// forwardChunkBytes is the most one Forward data message carries.
const forwardChunkBytes = 32 << 10

// Forward opens a TCP connection to 127.0.0.1:<port> inside the sandbox,
// tunnelled over the daemon's authenticated channel, and returns it as a
// net.Conn. It returns once the daemon connected: nothing listening there
// is an ErrUnavailable error (retryable: the server may not be up yet).
// The connection ends with ctx, Close, or either side closing; CloseWrite
// half-closes it. Write deadlines are checked before each write, not
// during one (a write blocks only under the tunnel's flow control).
func (c *Client) Forward(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "forward: port %d is not in 1-65535", port)
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := agentdv1.NewPortServiceClient(c.conn).Forward(sctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("forward port %d: %w", port, wrap(err))
	}
	fail := func(err error) (net.Conn, error) {
		cancel()
		return nil, fmt.Errorf("forward port %d: %w", port, err)
	}
	if err := stream.Send(&agentdv1.ForwardRequest{Message: &agentdv1.ForwardRequest_Start{Start: &agentdv1.ForwardStart{Port: uint32(port)}}}); err != nil {
		if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			err = rerr // the status says more than the failed send
		}
		return fail(wrap(err))
	}
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errStreamEnded
		}
		return fail(wrap(err))
	}
	if first.GetOpened() == nil {
		return fail(errkind.Errorf(errkind.ErrInternal, "the daemon answered the start with %T", first.GetMessage()))
	}
	fc := &forwardConn{
		stream: stream, cancel: cancel, port: port,
		data: make(chan []byte), done: make(chan struct{}),
		readDeadline: newDeadline(), writeDeadline: newDeadline(),
	}
	go fc.receive()
	return fc, nil
}

// forwardConn is a forwarded connection as a net.Conn.
type forwardConn struct {
	stream agentdv1.PortService_ForwardClient
	cancel context.CancelFunc
	port   int

	// receive delivers data on data; once the port closed or the stream
	// failed it sets recvErr and closes data.
	data    chan []byte
	recvErr error
	readMu  sync.Mutex
	pending []byte // received, not yet read (under readMu)

	done      chan struct{} // closed by Close
	closeOnce sync.Once

	writeMu     sync.Mutex // one Send at a time; CloseSend under it too
	writeClosed bool

	readDeadline, writeDeadline *deadline
}

func (f *forwardConn) receive() {
	defer close(f.data)
	for {
		msg, err := f.stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			f.recvErr = io.EOF // the stream ended cleanly after both sides closed
			return
		case err != nil:
			f.recvErr = fmt.Errorf("forward port %d: %w", f.port, wrap(err))
			return
		case msg.GetClosed() != nil:
			f.recvErr = io.EOF
			return
		}
		if b := msg.GetData(); len(b) > 0 {
			select {
			case f.data <- b:
			case <-f.done:
				f.recvErr = net.ErrClosed
				return
			}
		}
	}
}

// Read reads bytes from the port; io.EOF once the port closed its side.
func (f *forwardConn) Read(p []byte) (int, error) {
	f.readMu.Lock()
	defer f.readMu.Unlock()
	if len(f.pending) == 0 {
		select {
		case <-f.done:
			return 0, net.ErrClosed
		default:
		}
		select {
		case b, ok := <-f.data:
			if !ok {
				return 0, f.recvErr
			}
			f.pending = b
		case <-f.done:
			return 0, net.ErrClosed
		case <-f.readDeadline.wait():
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// Write sends bytes to the port, in chunks.
func (f *forwardConn) Write(p []byte) (int, error) {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	written := 0
	for written < len(p) || len(p) == 0 {
		select {
		case <-f.done:
			return written, net.ErrClosed
		case <-f.writeDeadline.wait():
			return written, os.ErrDeadlineExceeded
		default:
		}
		if f.writeClosed {
			return written, fmt.Errorf("forward port %d: write after CloseWrite: %w", f.port, net.ErrClosed)
		}
		if len(p) == 0 {
			return 0, nil
		}
		chunk := p[written:min(len(p), written+forwardChunkBytes)]
		if err := f.stream.Send(&agentdv1.ForwardRequest{Message: &agentdv1.ForwardRequest_Data{Data: chunk}}); err != nil {
			return written, fmt.Errorf("forward port %d: %w", f.port, wrap(err))
		}
		written += len(chunk)
	}
	return written, nil
}

// CloseWrite half-closes the connection: the port reads EOF, and can still
// answer.
func (f *forwardConn) CloseWrite() error {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	if f.writeClosed {
		return nil
	}
	f.writeClosed = true
	return wrap(f.stream.CloseSend())
}

// Close ends the connection both ways (the daemon closes its connection to
// the port). Idempotent.
func (f *forwardConn) Close() error {
	f.closeOnce.Do(func() {
		close(f.done)
		f.cancel()
		f.readDeadline.stop()
		f.writeDeadline.stop()
	})
	return nil
}

func (f *forwardConn) LocalAddr() net.Addr  { return forwardAddr("harness") }
func (f *forwardConn) RemoteAddr() net.Addr { return forwardAddr("sandbox:" + strconv.Itoa(f.port)) }

func (f *forwardConn) SetDeadline(t time.Time) error {
	f.readDeadline.set(t)
	f.writeDeadline.set(t)
	return nil
}
func (f *forwardConn) SetReadDeadline(t time.Time) error  { f.readDeadline.set(t); return nil }
func (f *forwardConn) SetWriteDeadline(t time.Time) error { f.writeDeadline.set(t); return nil }

// forwardAddr names an end of a forwarded connection.
type forwardAddr string

func (a forwardAddr) Network() string { return "agentd-forward" }
func (a forwardAddr) String() string  { return string(a) }

// deadline is a settable deadline whose wait channel closes when it passes
// (as in net.Pipe).
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passed
}

func newDeadline() *deadline { return &deadline{cancel: make(chan struct{})} }

// set arms the deadline at t; the zero time disarms it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for its close to be seen
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

// wait returns a channel closed once the deadline passed.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// PortListener accepts local TCP connections and forwards each to a port
// inside the sandbox (ListenLocal).
type PortListener struct {
	l      net.Listener
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	err    error // the first failed forward, for Err
	closed bool
}

// ListenLocal listens on 127.0.0.1 (a free port: see Addr) and forwards
// every connection it accepts to port inside the sandbox, until ctx ends
// or Close. A connection whose forward fails is closed at once (Err keeps
// the first such error).
func (c *Client) ListenLocal(ctx context.Context, port int) (*PortListener, error) {
	if port < 1 || port > 65535 {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "forward: port %d is not in 1-65535", port)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("forward port %d: listen locally: %w", port, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	pl := &PortListener{l: l, cancel: cancel, conns: map[net.Conn]struct{}{}}
	pl.wg.Add(1)
	go func() {
		defer pl.wg.Done()
		<-ctx.Done()
		_ = pl.Close()
	}()
	pl.wg.Add(1)
	go func() {
		defer pl.wg.Done()
		for {
			local, err := l.Accept()
			if err != nil {
				return
			}
			if !pl.track(local) {
				local.Close()
				return
			}
			pl.wg.Add(1)
			go func() {
				defer pl.wg.Done()
				defer pl.untrack(local)
				pl.serve(ctx, c, port, local)
			}()
		}
	}()
	return pl, nil
}

// serve forwards one local connection, passing half-closes through.
func (pl *PortListener) serve(ctx context.Context, c *Client, port int, local net.Conn) {
	defer local.Close()
	remote, err := c.Forward(ctx, port)
	if err != nil {
		pl.mu.Lock()
		if pl.err == nil {
			pl.err = err
		}
		pl.mu.Unlock()
		return
	}
	defer remote.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(remote, local)
		_ = remote.(*forwardConn).CloseWrite()
	}()
	_, _ = io.Copy(local, remote)
	if tc, ok := local.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	<-done
}

func (pl *PortListener) track(c net.Conn) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed {
		return false
	}
	pl.conns[c] = struct{}{}
	return true
}

func (pl *PortListener) untrack(c net.Conn) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	delete(pl.conns, c)
}

// Addr is the local address to connect to.
func (pl *PortListener) Addr() net.Addr { return pl.l.Addr() }

// Err returns the first error a forward failed with, if any.
func (pl *PortListener) Err() error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.err
}

// Close stops accepting and closes the forwarded connections. Idempotent.
func (pl *PortListener) Close() error {
	pl.mu.Lock()
	if pl.closed {
		pl.mu.Unlock()
		return nil
	}
	pl.closed = true
	conns := pl.conns
	pl.conns = map[net.Conn]struct{}{}
	pl.mu.Unlock()
	pl.cancel()
	err := pl.l.Close()
	for c := range conns {
		_ = c.Close()
	}
	return err
}

// Wait waits until every forwarding goroutine has ended (after Close or
// the end of ctx).
func (pl *PortListener) Wait() { pl.wg.Wait() }
