package agentd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Egress relay: a sandbox with egress control has no network but its own
// loopback. The harness runs an egress proxy on a unix socket the sandbox
// can see; the daemon listens on a loopback port and relays every TCP
// connection made to it to that socket, byte for byte, and gives the
// processes it starts HTTP_PROXY/HTTPS_PROXY pointing at the port. Every
// decision (which hosts, which addresses) is the proxy's, outside the
// sandbox; the relay only carries bytes.

// egressRelayMaxConns bounds the relayed connections open at once.
const egressRelayMaxConns = 256

// egressRelayDialTimeout bounds the connect to the proxy's socket.
const egressRelayDialTimeout = 5 * time.Second

// EgressRelay relays TCP connections to a loopback address inside the
// sandbox to the harness's egress proxy on a unix socket.
type EgressRelay struct {
	// Listen is a loopback address and port; the providers pass
	// egress.RelayAddr (package pkg/compute/egress).
	Listen string
	// Socket is the absolute path of the proxy's unix socket.
	Socket string
}

// ParseEgressRelay reads LOOPBACK-IP:PORT=unix:///path.sock (the daemon's
// --egress-relay), as egress.RelayArgs in pkg/compute/egress makes it with
// egress.RelayAddr for the address.
func ParseEgressRelay(s string) (EgressRelay, error) {
	listen, target, ok := strings.Cut(s, "=")
	socket, isUnix := strings.CutPrefix(target, "unix://")
	if !ok || !isUnix {
		return EgressRelay{}, fmt.Errorf("egress relay %q: want LOOPBACK-IP:PORT=unix:///path.sock", s)
	}
	r := EgressRelay{Listen: listen, Socket: socket}
	if err := r.Validate(); err != nil {
		return EgressRelay{}, err
	}
	return r, nil
}

// Validate checks that Listen is a loopback address with a port and
// Socket an absolute path.
func (r EgressRelay) Validate() error {
	ap, err := netip.ParseAddrPort(r.Listen)
	if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
		return fmt.Errorf("egress relay: listen address %q is not a loopback IP:port", r.Listen)
	}
	if !strings.HasPrefix(r.Socket, "/") {
		return fmt.Errorf("egress relay: proxy socket %q is not an absolute path", r.Socket)
	}
	return nil
}

// ProxyEnv is what processes get so that HTTP clients use the relay: the
// proxy variables in both spellings, and NO_PROXY for the loopback.
func (r EgressRelay) ProxyEnv() map[string]string {
	u := "http://" + r.Listen
	noProxy := "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
	}
}

// relay is a running EgressRelay.
type relay struct {
	cfg   EgressRelay
	l     net.Listener
	log   *zap.Logger
	slots chan struct{}
	wg    sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	// For a checkpoint (see checkpoint.go): while paused, no connection to
	// the proxy's socket (a socket of the host's) is open or being made;
	// connections relayed meanwhile wait for open, closed by resume.
	paused  bool
	open    chan struct{}
	ups     map[net.Conn]struct{} // connections to the proxy
	dialing int                   // dials in flight
	dialed  *sync.Cond            // signalled when dialing drops
}

// startRelay listens on r.Listen and relays until close.
func startRelay(r EgressRelay, log *zap.Logger) (*relay, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", r.Listen)
	if err != nil {
		return nil, fmt.Errorf("egress relay: listen %s: %w", r.Listen, err)
	}
	rl := &relay{cfg: r, l: l, log: log.With(zap.String("egress_relay", r.Listen)),
		slots: make(chan struct{}, egressRelayMaxConns), conns: map[net.Conn]struct{}{}, ups: map[net.Conn]struct{}{}}
	rl.dialed = sync.NewCond(&rl.mu)
	rl.wg.Add(1)
	go rl.accept()
	log.Info("egress relay listening", zap.String("listen", r.Listen), zap.String("proxy_socket", r.Socket))
	return rl, nil
}

func (rl *relay) accept() {
	defer rl.wg.Done()
	for {
		c, err := rl.l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				rl.log.Warn("egress relay stopped accepting", zap.Error(err))
			}
			return
		}
		select {
		case rl.slots <- struct{}{}:
		default:
			rl.log.Warn("egress relay: too many connections; closing one", zap.Int("max", egressRelayMaxConns))
			_ = c.Close()
			continue
		}
		if !rl.track(c) {
			<-rl.slots
			_ = c.Close()
			return
		}
		rl.wg.Add(1)
		go rl.serve(c)
	}
}

// track records an open connection; false once the relay is closed.
func (rl *relay) track(c net.Conn) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.closed {
		return false
	}
	rl.conns[c] = struct{}{}
	return true
}

func (rl *relay) untrack(c net.Conn) {
	rl.mu.Lock()
	delete(rl.conns, c)
	delete(rl.ups, c)
	rl.mu.Unlock()
}

// serve carries one connection's bytes both ways, half-closes included.
func (rl *relay) serve(c net.Conn) {
	defer rl.wg.Done()
	defer func() { <-rl.slots }()
	defer rl.untrack(c)
	defer c.Close()
	up := rl.dialProxy()
	if up == nil {
		return
	}
	defer rl.untrack(up)
	defer up.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, c)
		_ = up.(*net.UnixConn).CloseWrite()
	}()
	_, _ = io.Copy(c, up)
	_ = c.(*net.TCPConn).CloseWrite()
	<-done
}

// dialProxy connects to the proxy's socket, waiting while the relay is
// paused for a checkpoint; nil when the dial failed or the relay closed.
func (rl *relay) dialProxy() net.Conn {
	for {
		rl.mu.Lock()
		if rl.closed {
			rl.mu.Unlock()
			return nil
		}
		if rl.paused {
			open := rl.open
			rl.mu.Unlock()
			<-open
			continue
		}
		rl.dialing++
		rl.mu.Unlock()
		up, err := net.DialTimeout("unix", rl.cfg.Socket, egressRelayDialTimeout)
		rl.mu.Lock()
		// Closed before dialing drops: pause waits for it, so that no
		// socket of the host's is open once it returned.
		again := err == nil && rl.paused && !rl.closed
		if err == nil && (rl.paused || rl.closed) {
			_ = up.Close()
			up = nil
		}
		if up != nil {
			rl.conns[up] = struct{}{}
			rl.ups[up] = struct{}{}
		}
		rl.dialing--
		rl.dialed.Broadcast()
		rl.mu.Unlock()
		switch {
		case err != nil:
			rl.log.Warn("egress relay: the harness's egress proxy does not answer", zap.Error(err))
			return nil
		case again:
			continue
		}
		return up
	}
}

// pause closes every connection to the proxy (the relayed connections
// they carried end) and makes new ones wait until resume; it returns once
// no dial is in flight.
func (rl *relay) pause() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.closed || rl.paused {
		return
	}
	rl.paused, rl.open = true, make(chan struct{})
	for up := range rl.ups {
		_ = up.Close()
	}
	for rl.dialing > 0 {
		rl.dialed.Wait()
	}
}

// resume lets relayed connections reach the proxy again.
func (rl *relay) resume() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.paused {
		rl.paused = false
		close(rl.open)
	}
}

// close stops accepting, closes every relayed connection and waits.
func (rl *relay) close() error {
	rl.mu.Lock()
	rl.closed = true
	if rl.paused {
		rl.paused = false
		close(rl.open) // waiting connections see closed
	}
	for c := range rl.conns {
		_ = c.Close()
	}
	rl.mu.Unlock()
	err := rl.l.Close()
	rl.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("egress relay: close: %w", err)
	}
	return nil
}
