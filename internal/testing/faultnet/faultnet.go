// Package faultnet stands between a client and a server's socket in tests
// and fails the network on demand: Cut closes every connection open
// through the proxy at once, as a broken network would, while new
// connections go through again.
package faultnet

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Listen says where a proxy listens.
type Listen string

const (
	// Unix listens on a fresh unix socket in a short private directory.
	Unix Listen = "unix"
	// TCP listens on 127.0.0.1, on a port the system picks.
	TCP Listen = "tcp"
)

// Proxy forwards connections to one target and can cut them all.
type Proxy struct {
	address string
	l       net.Listener
	wg      sync.WaitGroup

	mu       sync.Mutex
	conns    []net.Conn // pairs: client side, target side
	accepted int
	closed   bool
}

// Start starts a proxy to target, an address in the daemon's form
// (unix:///path.sock or tcp://host:port), listening as listen says. The
// proxy and every connection through it are closed when the test ends.
func Start(tb testing.TB, listen Listen, target string) *Proxy {
	tb.Helper()
	network, addr, err := split(target)
	if err != nil {
		tb.Fatalf("faultnet: %v", err)
	}
	var l net.Listener
	p := &Proxy{}
	switch listen {
	case Unix:
		// t.TempDir paths can pass the ~107-byte limit of socket paths.
		dir, err := os.MkdirTemp("", "faultnet-")
		if err != nil {
			tb.Fatalf("faultnet: %v", err)
		}
		tb.Cleanup(func() { _ = os.RemoveAll(dir) })
		sock := filepath.Join(dir, "proxy.sock")
		l, err = net.Listen("unix", sock)
		p.address = "unix://" + sock
		if err != nil {
			tb.Fatalf("faultnet: listen: %v", err)
		}
	case TCP:
		l, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("faultnet: listen: %v", err)
		}
		p.address = "tcp://" + l.Addr().String()
	default:
		tb.Fatalf("faultnet: unknown listener %q", listen)
	}
	p.l = l
	tb.Cleanup(p.Close)
	p.wg.Add(1)
	go p.serve(network, addr)
	return p
}

// split turns unix:///path or tcp://host:port into a network and address.
func split(target string) (network, addr string, err error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", "", fmt.Errorf("target %q: %w", target, err)
	}
	switch u.Scheme {
	case "unix":
		return "unix", u.Host + u.Path, nil
	case "tcp":
		return "tcp", u.Host, nil
	}
	return "", "", fmt.Errorf("target %q: want unix:///path or tcp://host:port", target)
}

func (p *Proxy) serve(network, addr string) {
	defer p.wg.Done()
	for {
		down, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial(network, addr)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			up.Close()
			down.Close()
			return
		}
		p.accepted++
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(up, down); up.Close() }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(down, up); down.Close() }()
	}
}

// Address is where clients connect, in the daemon's address form
// (unix:///path.sock or tcp://127.0.0.1:port).
func (p *Proxy) Address() string { return p.address }

// Cut closes every connection open through the proxy and returns how many
// client connections it cut. The proxy keeps accepting new ones.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns) / 2
}

// Accepted returns how many client connections the proxy has forwarded.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops accepting, cuts every connection and waits for the copies
// to end. It is idempotent.
func (p *Proxy) Close() {
	_ = p.l.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
}
