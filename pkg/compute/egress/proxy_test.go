package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// mapResolver resolves names from a table (the tests' stand-in for DNS).
type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// fixture is a proxy on a unix socket (as a sandbox reaches it) in front of
// an HTTP and a TLS test server on loopback standing in for allowed.test.
type fixture struct {
	proxy     *Proxy
	socket    string
	logs      *observer.ObservedLogs
	httpPort  int
	tlsPort   int
	served    chan string // paths the upstream servers answered
	serveDone chan error
}

func port(t *testing.T, u string) int {
	t.Helper()
	_, ps, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(ps)
	return n
}

func newFixture(t *testing.T, mutate func(*Options)) *fixture {
	t.Helper()
	f := &fixture{served: make(chan string, 100)}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.served <- r.URL.Path
		fmt.Fprintf(w, "hello from %s%s", r.Host, r.URL.Path)
	})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	f.httpPort, f.tlsPort = port(t, hs.URL), port(t, ts.URL)

	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	opts := Options{
		Name: "test-sandbox",
		Policy: Policy{Allow: []Rule{
			{Host: "allowed.test", Ports: []int{f.httpPort, f.tlsPort}},
			{Host: "*.wild.test", Ports: []int{f.httpPort}},
			{Host: "private.test", Ports: []int{f.httpPort}},
			{Host: "meta.test", Ports: []int{80, f.httpPort}},
			{Host: "loopback6.test", Ports: []int{f.httpPort}},
		}},
		Resolver: mapResolver{
			"allowed.test":   loop,
			"a.wild.test":    loop,
			"other.test":     loop,
			"private.test":   {netip.MustParseAddr("10.1.2.3")},
			"meta.test":      {netip.MustParseAddr("169.254.169.254")},
			"loopback6.test": {netip.MustParseAddr("::1")},
		},
		// The stand-in servers listen on loopback; metadata stays refused
		// even though its whole range is let through here.
		AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("169.254.0.0/16")},
	}
	if mutate != nil {
		mutate(&opts)
	}
	core, logs := observer.New(zap.DebugLevel)
	p, err := New(opts, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	f.proxy, f.logs = p, logs
	f.socket = filepath.Join(t.TempDir(), "egress.sock")
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	f.serveDone = make(chan error, 1)
	go func() { f.serveDone <- p.Serve(context.Background(), l) }()
	t.Cleanup(func() { _ = p.Close() })
	return f
}

// httpClient sends requests through the proxy, as HTTP_PROXY would.
func (f *fixture) httpClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy: http.ProxyURL(&url1),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", f.socket)
			},
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test server
		},
		Timeout: 10 * time.Second,
	}
}

// connect sends CONNECT target and returns the connection and the status.
func (f *fixture) connect(t *testing.T, target string) (net.Conn, *bufio.Reader, int) {
	t.Helper()
	c, br, resp := f.connectResponse(t, target)
	return c, br, resp.StatusCode
}

// connectResponse sends CONNECT target and returns the proxy's answer (its
// body closed unless it is 200).
func (f *fixture) connectResponse(t *testing.T, target string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
	}
	return c, br, resp
}

// deniedHosts returns the hosts of the "egress denied" log entries.
func (f *fixture) denied() map[string]string {
	out := map[string]string{}
	for _, e := range f.logs.FilterMessage("egress denied").All() {
		m := e.ContextMap()
		host, _ := m["host"].(string)
		reason, _ := m["reason"].(string)
		out[host] = reason
		if m["sandbox"] != "test-sandbox" {
			panic(fmt.Sprintf("denial logged without the sandbox: %v", m))
		}
	}
	return out
}

// url1 is the proxy URL the clients use (they dial the socket whatever it says).
var url1 = url.URL{Scheme: "http", Host: "egress-proxy"}

func TestAllowedHTTPAndTLS(t *testing.T) {
	f := newFixture(t, nil)
	c := f.httpClient()

	resp, err := c.Get(fmt.Sprintf("http://allowed.test:%d/plain", f.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "hello from allowed.test") {
		t.Fatalf("plain HTTP through the proxy: %d %q", resp.StatusCode, body)
	}

	// https:// makes the client CONNECT and send SNI allowed.test.
	resp, err = c.Get(fmt.Sprintf("https://allowed.test:%d/tls", f.tlsPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "/tls") {
		t.Fatalf("TLS through the proxy: %d %q", resp.StatusCode, body)
	}

	// A wildcard rule allows names below it.
	resp, err = c.Get(fmt.Sprintf("http://a.wild.test:%d/wild", f.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("wildcard: %d", resp.StatusCode)
	}
	if st := f.proxy.Stats(); st.Allowed != 3 || st.Denied != 0 {
		t.Errorf("stats %+v, want 3 allowed and none denied (denials: %v)", st, f.denied())
	}
}

func TestRefused(t *testing.T) {
	f := newFixture(t, nil)
	c := f.httpClient()
	cases := []struct {
		name, target, logHost, reason string
	}{
		{"name not allowed", fmt.Sprintf("other.test:%d", f.httpPort), "other.test", "not in the allow list"},
		{"port not allowed", "allowed.test:22", "allowed.test", "not in the allow list"},
		{"wildcard apex", fmt.Sprintf("wild.test:%d", f.httpPort), "wild.test", "not in the allow list"},
		{"direct IP", fmt.Sprintf("127.0.0.1:%d", f.httpPort), "127.0.0.1", "direct IP"},
		{"direct IPv6", fmt.Sprintf("[::1]:%d", f.httpPort), "::1", "direct IP"},
		{"metadata IP", "169.254.169.254:80", "169.254.169.254", "direct IP"},
		{"IP in another spelling", fmt.Sprintf("127.1:%d", f.httpPort), "127.1", "direct IP"},
		{"name resolving to metadata", "meta.test:80", "meta.test", "cloud metadata"},
		{"name resolving to a private address", fmt.Sprintf("private.test:%d", f.httpPort), "private.test", "private"},
		{"name resolving to IPv6 loopback", fmt.Sprintf("loopback6.test:%d", f.httpPort), "loopback6.test", "loopback"},
	}
	for _, tc := range cases {
		t.Run(tc.name+" CONNECT", func(t *testing.T) {
			_, _, resp := f.connectResponse(t, tc.target)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("CONNECT %s: status %d, want 403", tc.target, resp.StatusCode)
			}
			// curl shows no body of a refused CONNECT: the reason is in a header too.
			if h := resp.Header.Get(DeniedHeader); !strings.Contains(h, tc.reason) {
				t.Errorf("CONNECT %s: %s %q, want the reason %q", tc.target, DeniedHeader, h, tc.reason)
			}
			if r, ok := f.denied()[tc.logHost]; !ok || !strings.Contains(r, tc.reason) {
				t.Errorf("no denial of %s logged with reason %q; logged: %v", tc.logHost, tc.reason, f.denied())
			}
		})
		t.Run(tc.name+" HTTP", func(t *testing.T) {
			resp, err := c.Get("http://" + tc.target + "/x")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("GET %s: status %d, want 403", tc.target, resp.StatusCode)
			}
			if h := resp.Header.Get(DeniedHeader); !strings.Contains(h, tc.reason) || !strings.Contains(string(body), tc.reason) {
				t.Errorf("GET %s: %s %q, body %q; want the reason %q in both", tc.target, DeniedHeader, h, body, tc.reason)
			}
		})
	}
	select {
	case p := <-f.served:
		t.Fatalf("an upstream server was reached (%s)", p)
	default:
	}
	if st := f.proxy.Stats(); st.Allowed != 0 || st.Denied != uint64(2*len(cases)) {
		t.Errorf("stats %+v, want %d denied", st, 2*len(cases))
	}
}

func TestSNIMismatchRefused(t *testing.T) {
	f := newFixture(t, nil)
	for _, sni := range []string{"evil.test", ""} {
		c, br, status := f.connect(t, fmt.Sprintf("allowed.test:%d", f.tlsPort))
		if status != 200 {
			t.Fatalf("CONNECT allowed.test: %d", status)
		}
		conf := &tls.Config{InsecureSkipVerify: true, ServerName: sni} //nolint:gosec // test server
		if sni == "" {
			// No SNI at all: crypto/tls sends none for an IP.
			conf.ServerName = "127.0.0.1"
		}
		tc := tls.Client(&bufConn{Conn: c, r: br}, conf)
		if err := tc.Handshake(); err == nil {
			t.Fatalf("TLS handshake with SNI %q through a tunnel to allowed.test succeeded", sni)
		}
	}
	d := f.denied()
	if !strings.Contains(d["allowed.test"], "TLS") {
		t.Errorf("SNI mismatch not logged with the host: %v", d)
	}
	select {
	case p := <-f.served:
		t.Fatalf("the upstream server answered a request (%s)", p)
	default:
	}
}

// bufConn reads through a bufio.Reader that may hold bytes already.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func TestNonTLSTunnelOnOtherPortPasses(t *testing.T) {
	f := newFixture(t, nil)
	c, br, status := f.connect(t, fmt.Sprintf("allowed.test:%d", f.httpPort))
	if status != 200 {
		t.Fatalf("CONNECT: %d", status)
	}
	fmt.Fprintf(c, "GET /tunnelled HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "/tunnelled") {
		t.Fatalf("body %q", body)
	}
}

func TestCloseDrainsAndLimits(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MaxConns = 1 })
	c, _, status := f.connect(t, fmt.Sprintf("allowed.test:%d", f.httpPort))
	if status != 200 {
		t.Fatalf("CONNECT: %d", status)
	}
	// A second connection is over the limit: closed at once.
	c2, err := net.Dial("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c2, "CONNECT allowed.test:%d HTTP/1.1\r\n\r\n", f.httpPort)
	if _, err := c2.Read(make([]byte, 1)); err == nil {
		t.Error("a connection over the limit was served")
	}
	done := make(chan error, 1)
	go func() { done <- f.proxy.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a tunnel open")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && err == nil {
		t.Errorf("tunnel still open after Close: %v", err)
	}
	select {
	case err := <-f.serveDone:
		if err != nil {
			t.Errorf("Serve after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	if !strings.Contains(fmt.Sprint(f.denied()), "connections open at once") {
		t.Errorf("limit refusal not logged: %v", f.denied())
	}
}

func TestIdleTunnelClosed(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.IdleTimeout = 200 * time.Millisecond })
	c, _, status := f.connect(t, fmt.Sprintf("allowed.test:%d", f.httpPort))
	if status != 200 {
		t.Fatalf("CONNECT: %d", status)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data from an idle tunnel")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("idle tunnel closed after %s", time.Since(start))
	}
}

func TestServeStopsWithContext(t *testing.T) {
	p, err := New(Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve ignored its context")
	}
}

// TestNonTLSOn443: a tunnel to port 443 must start with a TLS ClientHello
// unless the policy says otherwise.
func TestNonTLSOn443(t *testing.T) {
	for _, allow := range []bool{false, true} {
		p, err := New(Options{Policy: Policy{AllowNonTLS443: allow}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		go func() { _, _ = b.Write([]byte("GET / HTTP/1.1\r\n\r\n")) }()
		first, reason := p.inspectTunnel(a, a, "allowed.test", 443)
		if allow && (reason != "" || !strings.HasPrefix(string(first), "G")) {
			t.Errorf("AllowNonTLS443: reason %q, first %q", reason, first)
		}
		if !allow && !strings.Contains(reason, "not TLS") {
			t.Errorf("plain text on 443: reason %q", reason)
		}
		a.Close()
		b.Close()
		p.Close()
	}
}
