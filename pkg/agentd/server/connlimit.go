package server

import (
	"context"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
)

// Limits on connections (issue #27, hostile tenants): what any process
// that can reach a listen address may make the daemon hold without the
// token.
const (
	// DefaultMaxConnections is how many connections one listener keeps
	// open at once (--max-connections); one more is closed as soon as it
	// is accepted. A harness holds one connection per daemon (two while
	// it reconnects); probes and port forwards (streams on that
	// connection) add none. Measured on the daemon binary (RSS growth
	// over 40 to 400 connections, grpc-go 1.85, whose read and write
	// buffers are taken from pools only while bytes pass through them):
	// a connection that finished the HTTP/2 preface and SETTINGS and
	// stays idle costs 20-45 KiB, one that has not finished its preface
	// 8-12 KiB; 400 idle ones took 8.4 MiB without a cap. The cap bounds
	// what connections alone can hold to about 11 MiB.
	DefaultMaxConnections = 256
	// DefaultHandshakeTimeout is how long a new connection has to finish
	// its handshakes (TLS when on, the HTTP/2 preface and settings) and to
	// make its first authenticated call (--handshake-timeout).
	DefaultHandshakeTimeout = 10 * time.Second
	// maxCallsBeforeAuth is how many calls a connection may make before
	// its first with the token: health checks, and calls refused for
	// their token. The connection is closed at the next one. A client
	// that never reads its answers makes the daemon queue them (gRPC
	// stops reading it only after 10,000): 4-5 MiB per connection,
	// measured with token-less Info calls and with health checks. A
	// harness authenticates on its first or second call (WaitReady: a
	// health check, then Info), a probe makes one call per connection.
	maxCallsBeforeAuth = 32
	// refusalLogEvery bounds how often refused connections are logged:
	// one line, with the count since the last, per period.
	refusalLogEvery = 10 * time.Second
)

// connLimiter is a net.Listener that keeps at most max connections open
// (0: no cap), closing those over it as soon as they are accepted, and
// closes a connection that has made no authenticated call within
// authTimeout (0: never; see authenticated). A refused connection is
// never handed to gRPC, so it costs nothing beyond its accept.
//
// The connections it returns keep gRPC's reads from holding a buffer
// while they wait (see limitedConn.ReadOnReady), so wrapping them costs
// no memory; TCP ones get the TCP_USER_TIMEOUT gRPC sets on a bare
// *net.TCPConn.
type connLimiter struct {
	net.Listener
	max         int64
	authTimeout time.Duration
	open        atomic.Int64
	metrics     *metrics.Set
	log         *zap.Logger
	overCap     rateLog
	expired     rateLog
	calls       rateLog
}

// limitConnections wraps l; see connLimiter.
func limitConnections(l net.Listener, max int, authTimeout time.Duration, ms *metrics.Set, log *zap.Logger) *connLimiter {
	return &connLimiter{Listener: l, max: int64(max), authTimeout: authTimeout, metrics: ms, log: log,
		overCap: rateLog{msg: "refusing connections over --max-connections", every: refusalLogEvery},
		expired: rateLog{msg: "closed connections that made no authenticated call within --handshake-timeout", every: refusalLogEvery},
		calls:   rateLog{msg: "closed connections that made too many calls without the token", every: refusalLogEvery}}
}

// Accept returns the next connection under the cap, closing those over
// it.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.open.Add(1); l.max > 0 && n > l.max {
			l.open.Add(-1)
			_ = c.Close()
			l.metrics.ConnRefused(metrics.ConnLimit)
			l.overCap.note(l.log, zap.Int64("max_connections", l.max), zap.String("listener", l.Addr().String()))
			continue
		}
		l.metrics.ConnOpened()
		return l.wrap(c), nil
	}
}

// wrap makes c a limitedConn, with its authentication deadline armed.
func (l *connLimiter) wrap(c net.Conn) *limitedConn {
	lc := &limitedConn{Conn: c, l: l}
	addr := c.RemoteAddr()
	if addr == nil {
		addr = &net.UnixAddr{Net: c.LocalAddr().Network()}
	}
	lc.addr = connAddr{Addr: addr, c: lc}
	if sc, ok := c.(syscall.Conn); ok {
		switch c.(type) {
		case *net.TCPConn, *net.UnixConn: // reads straight from the socket are its plain bytes
			if raw, err := sc.SyscallConn(); err == nil {
				lc.raw = raw
				lc.readFn = lc.readReady
			}
		}
	}
	if tc, ok := c.(*net.TCPConn); ok {
		setTCPUserTimeout(tc, keepaliveTimeout)
	}
	if l.authTimeout > 0 {
		// Armed once assigned: expire reads lc.timer (through Close).
		lc.timer = time.AfterFunc(math.MaxInt64, lc.expire)
		lc.timer.Reset(l.authTimeout)
	}
	return lc
}

// setTCPUserTimeout does what gRPC does on a bare *net.TCPConn (which it
// no longer sees): unacknowledged data fails the connection after d.
func setTCPUserTimeout(c *net.TCPConn, d time.Duration) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond))
	})
}

// Connection states of the authentication deadline.
const (
	connPending       = iota // no authenticated call yet; the timer runs
	connAuthenticated        // made one: no deadline any more
	connExpired              // closed for making none in time
)

// limitedConn is a connection a connLimiter accepted: closing it frees
// its place, and it is closed when it makes no authenticated call within
// the limiter's authTimeout.
type limitedConn struct {
	net.Conn
	l      *connLimiter
	addr   connAddr
	timer  *time.Timer // nil: no authentication deadline
	state  atomic.Int32
	closed atomic.Bool
	// unauthCalls counts the calls made before the first authenticated
	// one (see callBeforeAuth).
	unauthCalls atomic.Int32

	// raw reads the socket directly for ReadOnReady; nil when the
	// connection is not a plain socket. The fields below are ReadOnReady's
	// state, kept here so that a read allocates nothing: gRPC reads a
	// connection from one goroutine.
	raw    syscall.RawConn
	readFn func(fd uintptr) bool
	rdSize int
	rdPool mem.BufferPool
	rdBuf  *[]byte
	rdN    int
	rdErr  error
}

// RemoteAddr is the peer's address, carrying the connection so that the
// call's authentication can find it (see authenticated).
func (c *limitedConn) RemoteAddr() net.Addr { return c.addr }

// Close closes the connection and frees its place under the cap.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		if c.timer != nil {
			c.timer.Stop()
		}
		c.l.open.Add(-1)
		c.l.metrics.ConnClosed()
	}
	return err
}

// expire closes the connection unless it made an authenticated call.
func (c *limitedConn) expire() {
	if !c.state.CompareAndSwap(connPending, connExpired) {
		return
	}
	c.l.metrics.ConnRefused(metrics.ConnHandshake)
	c.l.expired.note(c.l.log, zap.Duration("handshake_timeout", c.l.authTimeout), zap.String("listener", c.l.Addr().String()))
	_ = c.Close()
}

// ReadOnReady waits until the socket is readable, then reads up to size
// bytes into a buffer from pool. It is the optional interface of gRPC's
// readyreader.Reader (google.golang.org/grpc/internal/transport/readyreader,
// which gRPC finds on a connection by its method set): with it gRPC takes
// a read buffer only once bytes have arrived and gives it back once it
// has consumed them, as it does for a bare *net.UnixConn or *net.TCPConn.
// Without it gRPC would give this wrapper a bufio.Reader of
// ReadBufferSize (256 KiB) for as long as the connection lives: heap the
// collector counts for every connection, resident as bytes pass through
// it. (It recognises a bare connection by its type, which a wrapper
// hides; TLS connections get the bufio.Reader either way.)
func (c *limitedConn) ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error) {
	if c.raw == nil {
		buf := pool.Get(size)
		n, err := c.Conn.Read(*buf)
		if err != nil {
			pool.Put(buf)
			return nil, 0, err
		}
		return buf, n, nil
	}
	c.rdSize, c.rdPool = size, pool
	err := c.raw.Read(c.readFn)
	buf, n, rerr := c.rdBuf, c.rdN, c.rdErr
	c.rdBuf, c.rdN, c.rdErr, c.rdPool = nil, 0, nil, nil
	switch {
	case err != nil: // a deadline or a closed connection
		if buf != nil {
			pool.Put(buf)
		}
		return nil, 0, err
	case rerr != nil: // the buffer went back in readReady
		return nil, 0, rerr
	case n == 0:
		pool.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

// readReady is the raw read ReadOnReady makes once the socket may be
// readable; false asks the poller to wait for more.
func (c *limitedConn) readReady(fd uintptr) bool {
	c.rdBuf = c.rdPool.Get(c.rdSize)
	for {
		c.rdN, c.rdErr = syscall.Read(int(fd), *c.rdBuf)
		if c.rdErr != syscall.EINTR {
			break
		}
	}
	if c.rdErr != nil {
		c.rdPool.Put(c.rdBuf)
		c.rdBuf, c.rdN = nil, 0
	}
	return c.rdErr != syscall.EAGAIN
}

// connAddr is a connection's remote address that also leads back to the
// connection.
type connAddr struct {
	net.Addr
	c *limitedConn
}

// authenticated records that the connection a call came on made a call
// with the token (the peer in ctx is a limitedConn's): it is then never
// closed for its handshake timeout. A call on a connection that expired
// meanwhile changes nothing.
func authenticated(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	if a, ok := p.Addr.(connAddr); ok && a.c.state.Load() == connPending {
		if a.c.state.CompareAndSwap(connPending, connAuthenticated) && a.c.timer != nil {
			a.c.timer.Stop()
		}
	}
}

// callBeforeAuth counts a call that carries no valid token (a health
// check, or a call refused for its token) on the connection of ctx, and
// reports whether the connection may make it: once a connection that has
// made no authenticated call makes more than maxCallsBeforeAuth, it is
// closed and false returned. A connection that authenticated, or one the
// limiter did not accept (a test's listener), is not counted.
func callBeforeAuth(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return true
	}
	a, ok := p.Addr.(connAddr)
	if !ok || a.c.state.Load() == connAuthenticated {
		return true
	}
	if a.c.unauthCalls.Add(1) <= maxCallsBeforeAuth {
		return true
	}
	if a.c.state.CompareAndSwap(connPending, connExpired) {
		l := a.c.l
		l.metrics.ConnRefused(metrics.ConnCalls)
		l.calls.note(l.log, zap.Int("max_calls_before_auth", maxCallsBeforeAuth), zap.String("listener", l.Addr().String()))
		_ = a.c.Close()
	}
	return false
}

// rateLog logs an event at most once per period, with the count of those
// it did not log.
type rateLog struct {
	msg    string
	every  time.Duration
	mu     sync.Mutex
	last   time.Time
	missed int
}

func (r *rateLog) note(log *zap.Logger, fields ...zap.Field) {
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.missed++
		r.mu.Unlock()
		return
	}
	n := r.missed + 1
	r.last, r.missed = now, 0
	r.mu.Unlock()
	log.Warn(r.msg, append(fields, zap.Int("connections", n))...)
}
