package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Defaults for Options fields left zero.
const (
	DefaultMaxConns         = 256
	DefaultDialTimeout      = 10 * time.Second
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultIdleTimeout      = 5 * time.Minute
)

// maxClientHelloBytes bounds what is read while looking for a ClientHello's
// server name (a ClientHello is at most a few records).
const maxClientHelloBytes = 64 << 10

// Resolver resolves host names; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Proxy.
type Options struct {
	// Policy is what the sandbox may reach.
	Policy Policy
	// Name identifies the sandbox in logs.
	Name string
	// Resolver resolves allowed names; nil means net.DefaultResolver. Tests
	// point allowed names at local servers with it.
	Resolver Resolver
	// AllowAddrs exempts address ranges from the private-address rules
	// (tests allow 127.0.0.1/32 for a local stand-in server). Cloud
	// metadata addresses are refused regardless.
	AllowAddrs []netip.Prefix
	// MaxConns bounds the client connections open at once; more are
	// closed at once and logged (0: DefaultMaxConns).
	MaxConns int
	// DialTimeout bounds the name lookup and the connect upstream.
	DialTimeout time.Duration
	// HandshakeTimeout bounds reading a request's header and a tunnel's
	// TLS ClientHello.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a tunnel, or a kept-alive client connection,
	// after this long without traffic.
	IdleTimeout time.Duration
}

// Stats count what a Proxy did.
type Stats struct {
	// Allowed counts connections and requests let through.
	Allowed uint64
	// Denied counts refusals (each logged with its host and reason).
	Denied uint64
}

// Proxy is one sandbox's egress proxy. It serves any number of listeners
// (Serve) until Close.
type Proxy struct {
	opts      Options
	log       *zap.Logger
	transport *http.Transport
	forward   *httputil.ReverseProxy
	conns     chan struct{} // one token per open client connection

	allowed, denied atomic.Uint64

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	servers map[*http.Server]struct{}
	active  sync.WaitGroup // handlers and tunnels running
}

// New returns a proxy enforcing opts.Policy. log receives every refusal.
func New(opts Options, log *zap.Logger) (*Proxy, error) {
	if log == nil {
		log = zap.NewNop()
	}
	pol, err := opts.Policy.Normalized()
	if err != nil {
		return nil, err
	}
	opts.Policy = pol
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		opts:    opts,
		log:     log.Named("egress").With(zap.String("sandbox", opts.Name)),
		conns:   make(chan struct{}, opts.MaxConns),
		ctx:     ctx,
		cancel:  cancel,
		servers: map[*http.Server]struct{}{},
	}
	p.transport = &http.Transport{
		Proxy:                 nil, // never the harness's own proxy settings
		DialContext:           p.dialChecked,
		MaxIdleConns:          32,
		IdleConnTimeout:       opts.IdleTimeout,
		ResponseHeaderTimeout: 0, // a slow server is the sandbox's business
		ForceAttemptHTTP2:     false,
	}
	p.forward = &httputil.ReverseProxy{
		Rewrite:       func(*httputil.ProxyRequest) {}, // the absolute URL as the client sent it
		Transport:     p.transport,
		FlushInterval: -1,
		ErrorLog:      discardLog(),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.Info("egress request failed upstream", zap.String("host", r.URL.Hostname()), zap.Error(err))
			http.Error(w, "egress proxy: upstream failed", http.StatusBadGateway)
		},
	}
	return p, nil
}

// Policy returns the (normalized) policy the proxy enforces.
func (p *Proxy) Policy() Policy { return p.opts.Policy }

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{Allowed: p.allowed.Load(), Denied: p.denied.Load()}
}

// Serve serves proxy clients on l until ctx ends or Close; then l and the
// connections accepted on it are closed. It returns nil after ctx ended or
// Close, else the listener's error.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	srv := &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		ReadHeaderTimeout: p.opts.HandshakeTimeout,
		IdleTimeout:       p.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          discardLog(),
		BaseContext:       func(net.Listener) context.Context { return sctx },
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = l.Close()
		return nil
	}
	p.servers[srv] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.servers, srv)
		p.mu.Unlock()
	}()
	context.AfterFunc(sctx, func() { _ = srv.Close() })
	err := srv.Serve(&limitListener{Listener: l, p: p})
	if sctx.Err() != nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("egress proxy: serve: %w", err)
}

// Close stops every Serve, closes every connection and waits for their
// handlers to return. Idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	servers := make([]*http.Server, 0, len(p.servers))
	for s := range p.servers {
		servers = append(servers, s)
	}
	p.mu.Unlock()
	p.cancel()
	for _, s := range servers {
		_ = s.Close()
	}
	p.active.Wait()
	p.transport.CloseIdleConnections()
	return nil
}

// begin registers a running handler; false once the proxy is closed.
func (p *Proxy) begin() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.active.Add(1)
	return true
}

// DeniedHeader carries the reason of a refused request or CONNECT, one
// line, beside the same line in the body: a client that shows no body
// (curl on a refused CONNECT says only "CONNECT tunnel failed, response
// 403") still shows it with -v or -i.
const DeniedHeader = "X-Bulkhead-Egress-Denied"

// deny logs and counts a refusal.
func (p *Proxy) deny(method, host string, port int, reason string) {
	p.denied.Add(1)
	p.log.Warn("egress denied", zap.String("host", host), zap.Int("port", port),
		zap.String("method", method), zap.String("reason", reason))
}

// refuse logs and counts a refusal and answers it: status, the reason in
// DeniedHeader and as the body's one line.
func (p *Proxy) refuse(w http.ResponseWriter, method, host string, port, status int, reason, answer string) {
	p.deny(method, host, port, reason)
	w.Header().Set(DeniedHeader, reason)
	http.Error(w, "egress proxy: "+answer, status)
}

// serveHTTP handles one proxy request: CONNECT, or an absolute-form HTTP
// request.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.begin() {
		http.Error(w, "egress proxy: closing", http.StatusServiceUnavailable)
		return
	}
	defer p.active.Done()
	if r.Method == http.MethodConnect {
		p.serveConnect(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Host == "" {
		p.refuse(w, r.Method, r.Host, 0, http.StatusBadRequest, "not a proxy request (no absolute URL)",
			"send requests through this proxy with an absolute URL")
		return
	}
	if r.URL.Scheme != "http" {
		p.refuse(w, r.Method, r.URL.Hostname(), 0, http.StatusBadRequest, "scheme "+r.URL.Scheme+" (use CONNECT for https)",
			"only http:// URLs are forwarded; use CONNECT for https")
		return
	}
	port := 80
	if ps := r.URL.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		if err != nil || n < 1 || n > 65535 {
			p.refuse(w, r.Method, r.URL.Hostname(), 0, http.StatusBadRequest, "invalid port "+ps, "invalid port")
			return
		}
		port = n
	}
	host, addrs, status, reason := p.check(r.Context(), r.URL.Hostname(), port)
	if reason != "" {
		p.refuse(w, r.Method, host, port, status, reason, reason)
		return
	}
	p.allowed.Add(1)
	p.log.Debug("egress request", zap.String("host", host), zap.Int("port", port), zap.String("method", r.Method))
	r = r.WithContext(context.WithValue(r.Context(), resolvedKey{}, resolved{host: host, port: port, addrs: addrs}))
	r.Header.Del("Proxy-Authorization")
	p.forward.ServeHTTP(w, r)
}

// check applies the policy to host:port and resolves the name. It
// returns the normalized host and the addresses to connect to, or an HTTP
// status and the reason for refusing.
func (p *Proxy) check(ctx context.Context, rawHost string, port int) (string, []netip.Addr, int, string) {
	host, err := normalizeHost(rawHost)
	if errors.Is(err, errIPLiteral) {
		return rawHost, nil, http.StatusForbidden, "direct IP address (only allowed names may be reached)"
	}
	if err != nil {
		return rawHost, nil, http.StatusBadRequest, "invalid host: " + err.Error()
	}
	if !p.opts.Policy.Allows(host, port) {
		return host, nil, http.StatusForbidden, "not in the allow list"
	}
	lctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	defer cancel()
	addrs, err := p.opts.Resolver.LookupNetIP(lctx, "ip", host)
	if err != nil {
		return host, nil, http.StatusBadGateway, "name does not resolve: " + err.Error()
	}
	if len(addrs) == 0 {
		return host, nil, http.StatusBadGateway, "name resolves to no address"
	}
	for _, a := range addrs {
		if why := blockedReason(a, p.opts.AllowAddrs); why != "" {
			return host, nil, http.StatusForbidden, fmt.Sprintf("resolves to %s, a %s address", a.Unmap(), why)
		}
	}
	return host, addrs, 0, ""
}

// resolvedKey carries a checked request's addresses to dialChecked.
type resolvedKey struct{}

// resolved is a checked destination.
type resolved struct {
	host  string
	port  int
	addrs []netip.Addr
}

// dial connects to the first of addrs that answers.
func (p *Proxy) dial(ctx context.Context, addrs []netip.Addr, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: p.opts.DialTimeout}
	var errs []error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// dialChecked is the forwarding transport's dialer: it connects only to
// the addresses check resolved for the request (never a second lookup).
func (p *Proxy) dialChecked(ctx context.Context, _, addr string) (net.Conn, error) {
	res, ok := ctx.Value(resolvedKey{}).(resolved)
	host, port, err := net.SplitHostPort(addr)
	if !ok || err != nil || port != strconv.Itoa(res.port) {
		return nil, fmt.Errorf("egress proxy: %s was not checked", addr)
	}
	if h, err := normalizeHost(host); err != nil || h != res.host {
		return nil, fmt.Errorf("egress proxy: %s was not checked", addr)
	}
	return p.dial(ctx, res.addrs, res.port)
}

// serveConnect handles a CONNECT tunnel: check, connect upstream, answer
// 200, then check the client's first bytes (TLS: the SNI must name the
// host) before any of them reaches the upstream.
func (p *Proxy) serveConnect(w http.ResponseWriter, r *http.Request) {
	hostStr, portStr, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		p.refuse(w, r.Method, r.Host, 0, http.StatusBadRequest, "CONNECT target is not host:port", "CONNECT needs host:port")
		return
	}
	host, addrs, status, reason := p.check(r.Context(), hostStr, port)
	if reason != "" {
		p.refuse(w, r.Method, host, port, status, reason, reason)
		return
	}
	up, err := p.dial(r.Context(), addrs, port)
	if err != nil {
		p.log.Info("egress connect failed", zap.String("host", host), zap.Int("port", port), zap.Error(err))
		http.Error(w, "egress proxy: connect failed", http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = up.Close()
		http.Error(w, "egress proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	t := newTunnel(client, up)
	defer t.close()
	stop := context.AfterFunc(r.Context(), t.close)
	defer stop()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent right behind the CONNECT are in brw's buffer.
	var clientR io.Reader = client
	if n := brw.Reader.Buffered(); n > 0 {
		clientR = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), client)
	}
	go t.watchIdle(p.opts.IdleTimeout)

	// Upstream -> client may start at once (server-first protocols).
	downDone := make(chan struct{})
	go func() {
		defer close(downDone)
		_, _ = io.Copy(client, activityReader{r: up, t: t})
		closeWrite(client)
	}()

	first, reason := p.inspectTunnel(client, clientR, host, port)
	if reason != "" {
		p.deny(r.Method, host, port, reason)
		t.close()
		<-downDone
		return
	}
	p.allowed.Add(1)
	p.log.Debug("egress tunnel", zap.String("host", host), zap.Int("port", port))
	if len(first) > 0 {
		if _, err := up.Write(first); err != nil {
			t.close()
			<-downDone
			return
		}
	}
	_, _ = io.Copy(up, activityReader{r: clientR, t: t})
	closeWrite(up)
	<-downDone
}

// inspectTunnel reads the start of what the client sends: a TLS
// ClientHello must name host (SNI); anything else is refused on 443
// unless the policy allows it. It returns the bytes read (to pass on) or
// the reason for refusing.
func (p *Proxy) inspectTunnel(client net.Conn, r io.Reader, host string, port int) ([]byte, string) {
	br := bufio.NewReaderSize(r, 1)
	if port == 443 {
		_ = client.SetReadDeadline(time.Now().Add(p.opts.HandshakeTimeout))
	}
	b, err := br.Peek(1)
	if err != nil {
		if port == 443 {
			return nil, "no TLS ClientHello in time"
		}
		return nil, "" // nothing sent: the tunnel ends as the client ends it
	}
	if b[0] != 0x16 { // not a TLS handshake record
		_ = client.SetReadDeadline(time.Time{})
		if port == 443 && !p.opts.Policy.AllowNonTLS443 {
			return nil, "not TLS on port 443"
		}
		first := make([]byte, br.Buffered())
		_, _ = io.ReadFull(br, first)
		return first, ""
	}
	_ = client.SetReadDeadline(time.Now().Add(p.opts.HandshakeTimeout))
	sni, data, err := readServerName(br, maxClientHelloBytes)
	_ = client.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, "unreadable TLS ClientHello: " + err.Error()
	}
	if sni == "" {
		return nil, "TLS ClientHello names no server (SNI)"
	}
	if got, err := normalizeHost(sni); err != nil || got != host {
		return nil, fmt.Sprintf("TLS server name %q does not match CONNECT host", sni)
	}
	return data, ""
}

// tunnel is an open CONNECT tunnel.
type tunnel struct {
	client, up net.Conn
	last       atomic.Int64 // unix nanoseconds of the last traffic
	once       sync.Once
	done       chan struct{} // closed by close
}

func newTunnel(client, up net.Conn) *tunnel {
	t := &tunnel{client: client, up: up, done: make(chan struct{})}
	t.touch()
	return t
}

func (t *tunnel) touch() { t.last.Store(time.Now().UnixNano()) }

// close closes both connections (idempotent).
func (t *tunnel) close() {
	t.once.Do(func() {
		_ = t.client.Close()
		_ = t.up.Close()
		close(t.done)
	})
}

// watchIdle closes the tunnel after idle without traffic either way.
func (t *tunnel) watchIdle(idle time.Duration) {
	tick := time.NewTicker(max(idle/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-tick.C:
			if time.Since(time.Unix(0, t.last.Load())) > idle {
				t.close()
				return
			}
		}
	}
}

// activityReader records traffic on a tunnel.
type activityReader struct {
	r io.Reader
	t *tunnel
}

func (a activityReader) Read(b []byte) (int, error) {
	n, err := a.r.Read(b)
	if n > 0 {
		a.t.touch()
	}
	return n, err
}

// closeWrite half-closes c when it can (TCP, unix), else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	if lc, ok := c.(*limitConn); ok {
		closeWrite(lc.Conn)
		return
	}
	_ = c.Close()
}

// limitListener closes connections beyond Options.MaxConns at once.
type limitListener struct {
	net.Listener
	p *Proxy
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.p.conns <- struct{}{}:
			return &limitConn{Conn: c, p: l.p}, nil
		default:
			l.p.deny("", "", 0, fmt.Sprintf("more than %d connections open at once", l.p.opts.MaxConns))
			_ = c.Close()
		}
	}
}

// limitConn gives its slot back when closed.
type limitConn struct {
	net.Conn
	p    *Proxy
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.p.conns })
	return err
}

// discardLog is a standard logger that drops what net/http reports about
// misbehaving clients (refusals are logged by the proxy itself).
func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }
