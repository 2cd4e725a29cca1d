package manager

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// Exposed ports (ExposePort): a TCP port inside a tenant's sandbox (a
// server on 127.0.0.1:port there) gets a preview token, which the service
// puts in a URL anyone holding it may open, without a credential: the
// token is the capability. The transport proxies the URL's requests to the
// port through the sandbox's daemon (compute.Session.Forward); the manager
// verifies tokens, dials the tunnels, bounds them and ends them.
//
// Tokens. A token is 16 random bytes (the exposure's nonce) and the first
// 16 bytes of HMAC-SHA256 under the operator's key (Config.PreviewKey) over
// the exposure's tenant, sandbox id, port, expiry and nonce, in lower-case
// base32 (52 characters: one DNS label, so a token can also be a host
// name). A token is good while its exposure is in the table with those
// fields (looked up by nonce), its MAC matches (compared in constant time)
// and its expiry has not passed; a tampered, expired or revoked token and
// one never issued are refused alike (ErrPreviewNotFound). Exposing a port
// again makes a new token and ends the earlier one.
//
// Persistence. Each exposure is recorded with its sandbox's record
// (store.Sandbox.Ports, store.Run.Ports: the nonce, port, times and the
// key's id; never the token, which takes the key to make), so a manager
// started again with the same key takes back the exposures still in time,
// and their URLs keep working. With another key (a key made at random per
// process, when the operator gives none) they end with the process.
//
// Ending. Revoking ends the exposure at once: new requests are refused and
// every connection proxied for it is closed. So do its expiry, the
// deletion of its sandbox (DeleteSandbox, a deadline, the end of a run;
// those the manager learns of only later, when a dial finds the sandbox
// gone) and the manager's hard stop. Exposures count against no quota;
// each sandbox has at most PreviewPolicy.MaxPortsPerSandbox, and its
// proxied connections are bounded in number and closed when idle.

// PreviewPolicy bounds exposed ports and the connections proxied to them.
// Zero fields take their defaults (below).
type PreviewPolicy struct {
	// DefaultTTL and MaxTTL: a preview URL works this long (ExposePort's
	// ttl, at most MaxTTL).
	DefaultTTL, MaxTTL time.Duration
	// MaxPortsPerSandbox is how many ports of one sandbox may be exposed
	// at once.
	MaxPortsPerSandbox int
	// MaxConnsPerSandbox is how many proxied connections to one sandbox's
	// ports may be open at once (a request over it is refused).
	MaxConnsPerSandbox int
	// IdleTimeout closes a proxied connection (a kept-alive HTTP
	// connection, a WebSocket) that carried no byte either way this long.
	IdleTimeout time.Duration
	// MaxRequestBytes caps the body of one proxied request (the transport
	// enforces it).
	MaxRequestBytes int64
}

// Defaults of PreviewPolicy.
const (
	DefaultPreviewTTL          = time.Hour
	DefaultMaxPreviewTTL       = 24 * time.Hour
	DefaultMaxPortsPerSandbox  = 16
	DefaultMaxConnsPerSandbox  = 64
	DefaultPreviewIdleTimeout  = 5 * time.Minute
	DefaultMaxPreviewBodyBytes = 64 << 20 // 64 MiB
	// MinPreviewKeyBytes is the shortest Config.PreviewKey.
	MinPreviewKeyBytes = 32
)

func (p PreviewPolicy) withDefaults() (PreviewPolicy, error) {
	if p.MaxTTL == 0 {
		p.MaxTTL = max(DefaultMaxPreviewTTL, p.DefaultTTL)
	}
	if p.DefaultTTL == 0 {
		p.DefaultTTL = min(DefaultPreviewTTL, p.MaxTTL)
	}
	p.MaxPortsPerSandbox = cmp.Or(p.MaxPortsPerSandbox, DefaultMaxPortsPerSandbox)
	p.MaxConnsPerSandbox = cmp.Or(p.MaxConnsPerSandbox, DefaultMaxConnsPerSandbox)
	p.IdleTimeout = cmp.Or(p.IdleTimeout, DefaultPreviewIdleTimeout)
	p.MaxRequestBytes = cmp.Or(p.MaxRequestBytes, DefaultMaxPreviewBodyBytes)
	switch {
	case p.DefaultTTL < minSandboxTimeout || p.DefaultTTL > p.MaxTTL:
		return p, fmt.Errorf("preview policy: the default ttl %s is not between %s and the maximum %s", p.DefaultTTL, minSandboxTimeout, p.MaxTTL)
	case p.MaxPortsPerSandbox < 0 || p.MaxConnsPerSandbox < 0 || p.IdleTimeout < 0 || p.MaxRequestBytes < 0:
		return p, errors.New("preview policy: bounds must be positive")
	}
	return p, nil
}

// ExposedPort is a port of a sandbox with a preview token.
type ExposedPort struct {
	SandboxID string
	Port      int
	// Token is the capability the transport puts in the preview URL.
	Token            string
	Created, Expires time.Time
}

// ErrPreviewNotFound answers a preview token that is not good: tampered,
// expired, revoked, of a deleted sandbox, or never issued (the same error
// for all: nothing tells them apart). It is an errkind.ErrNotFound.
var ErrPreviewNotFound error = &kindError{kind: errkind.ErrNotFound, err: errors.New("no such preview")}

const (
	nonceBytes = 16
	macBytes   = 16
	// tokenChars is the length of a token: 32 bytes in unpadded base32.
	tokenChars = ((nonceBytes+macBytes)*8 + 4) / 5
)

// tokenEncoding is unpadded base32; tokens are its lower case.
var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// exposure is an exposed port. Its fields but tunnels are set once.
type exposure struct {
	tenant, sandbox string
	port            int
	nonce           [nonceBytes]byte
	created         time.Time
	expires         time.Time
	// pool names it to the transport's connection pool (not a secret).
	pool string
	// ctx ends with the exposure (revocation, replacement, expiry, the
	// sandbox's deletion, the manager's hard stop); cancel ends it.
	ctx    context.Context
	cancel context.CancelFunc
	// tunnels are its open proxied connections (under ports.mu).
	tunnels map[*tunnel]struct{}
}

// ports is the manager's table of exposures.
type ports struct {
	m      *Manager
	key    []byte
	keyID  []byte
	policy PreviewPolicy

	mu        sync.Mutex
	byNonce   map[[nonceBytes]byte]*exposure
	byPool    map[string]*exposure
	bySandbox map[string]map[int]*exposure
	// conns counts the open tunnels of each sandbox.
	conns  map[string]int
	serial uint64

	// save serializes the writes of the exposures to the sandboxes'
	// records (each write is the table's list for one sandbox).
	save sync.Mutex
}

// newPorts makes the table; a nil key is made at random (and said).
func newPorts(m *Manager, key []byte, pol PreviewPolicy, log *zap.Logger) (*ports, error) {
	pol, err := pol.withDefaults()
	if err != nil {
		return nil, err
	}
	switch {
	case len(key) == 0:
		key = make([]byte, MinPreviewKeyBytes)
		_, _ = rand.Read(key)
		log.Info("no preview key was given: made one at random; exposed ports' preview URLs end with this process")
	case len(key) < MinPreviewKeyBytes:
		return nil, fmt.Errorf("the preview key has %d bytes; it needs at least %d", len(key), MinPreviewKeyBytes)
	default:
		key = slices.Clone(key)
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte("bulkhead preview key id"))
	return &ports{m: m, key: key, keyID: h.Sum(nil)[:8], policy: pol,
		byNonce: map[[nonceBytes]byte]*exposure{}, byPool: map[string]*exposure{},
		bySandbox: map[string]map[int]*exposure{}, conns: map[string]int{}}, nil
}

// mac is the MAC of e's fields under the key.
func (p *ports) mac(e *exposure) []byte {
	h := hmac.New(sha256.New, p.key)
	var b []byte
	b = append(b, "bulkhead preview v1\x00"...)
	for _, s := range []string{e.tenant, e.sandbox} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(e.port))
	b = binary.BigEndian.AppendUint64(b, uint64(e.expires.UnixMicro()))
	b = append(b, e.nonce[:]...)
	h.Write(b)
	return h.Sum(nil)[:macBytes]
}

// token is e's token.
func (p *ports) token(e *exposure) string {
	b := append(e.nonce[:len(e.nonce):len(e.nonce)], p.mac(e)...)
	return strings.ToLower(tokenEncoding.EncodeToString(b))
}

// verify returns the live exposure token names, or nil.
func (p *ports) verify(token string) *exposure {
	if len(token) != tokenChars {
		return nil
	}
	b, err := tokenEncoding.DecodeString(strings.ToUpper(token))
	// Only the one spelling: the last character's unused bits, or a
	// letter's case, changed is another token.
	if err != nil || len(b) != nonceBytes+macBytes || strings.ToLower(tokenEncoding.EncodeToString(b)) != token {
		return nil
	}
	var nonce [nonceBytes]byte
	copy(nonce[:], b)
	p.mu.Lock()
	e := p.byNonce[nonce]
	p.mu.Unlock()
	if e == nil || !hmac.Equal(p.mac(e), b[nonceBytes:]) || !p.m.now().Before(e.expires) || e.ctx.Err() != nil {
		return nil
	}
	return e
}

// newExposure makes an exposure (not in the table yet).
func (p *ports) newExposure(tenant, sandbox string, port int, created, expires time.Time, nonce [nonceBytes]byte) *exposure {
	ctx, cancel := context.WithDeadline(p.m.base, expires)
	p.mu.Lock()
	p.serial++
	pool := "x" + strconv.FormatUint(p.serial, 10)
	p.mu.Unlock()
	return &exposure{tenant: tenant, sandbox: sandbox, port: port, nonce: nonce, created: created, expires: expires,
		pool: pool, ctx: ctx, cancel: cancel, tunnels: map[*tunnel]struct{}{}}
}

// add puts e in the table, ending the exposure of the same port it
// replaces. Once e ends, it leaves the table and its tunnels close.
func (p *ports) add(e *exposure) {
	p.mu.Lock()
	ports := p.bySandbox[e.sandbox]
	if ports == nil {
		ports = map[int]*exposure{}
		p.bySandbox[e.sandbox] = ports
	}
	old := ports[e.port]
	ports[e.port] = e
	p.byNonce[e.nonce] = e
	p.byPool[e.pool] = e
	p.mu.Unlock()
	if old != nil {
		old.cancel()
	}
	context.AfterFunc(e.ctx, func() { p.remove(e) })
}

// remove takes e out of the table and closes its tunnels (e ended).
func (p *ports) remove(e *exposure) {
	e.cancel()
	p.mu.Lock()
	if p.byNonce[e.nonce] == e {
		delete(p.byNonce, e.nonce)
	}
	if p.byPool[e.pool] == e {
		delete(p.byPool, e.pool)
	}
	if ports := p.bySandbox[e.sandbox]; ports[e.port] == e {
		delete(ports, e.port)
		if len(ports) == 0 {
			delete(p.bySandbox, e.sandbox)
		}
	}
	tunnels := make([]*tunnel, 0, len(e.tunnels))
	for t := range e.tunnels {
		tunnels = append(tunnels, t)
	}
	p.mu.Unlock()
	for _, t := range tunnels {
		_ = t.Close()
	}
}

// dropSandbox ends every exposure of a sandbox (it is being deleted).
func (p *ports) dropSandbox(id string) {
	p.mu.Lock()
	var list []*exposure
	for _, e := range p.bySandbox[id] {
		list = append(list, e)
	}
	p.mu.Unlock()
	for _, e := range list {
		p.remove(e)
	}
}

// live returns a sandbox's exposures still in time, by port.
func (p *ports) live(id string) []*exposure {
	now := p.m.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*exposure
	for _, e := range p.bySandbox[id] {
		if now.Before(e.expires) && e.ctx.Err() == nil {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(x, y *exposure) int { return cmp.Compare(x.port, y.port) })
	return out
}

// records is list as stored.
func (p *ports) records(list []*exposure) []store.Port {
	var out []store.Port
	for _, e := range list {
		out = append(out, store.Port{Port: e.port, Nonce: slices.Clone(e.nonce[:]), KeyID: p.keyID, Created: e.created, Expires: e.expires})
	}
	return out
}

func (p *ports) view(e *exposure) ExposedPort {
	return ExposedPort{SandboxID: e.sandbox, Port: e.port, Token: p.token(e), Created: e.created, Expires: e.expires}
}

// savePorts records list as the exposures of a tenant's sandbox (p.save
// held).
func (m *Manager) savePorts(ctx context.Context, tenant, id string, list []store.Port) error {
	if b := m.tenantBox(tenant, id); b != nil {
		return m.updateBox(ctx, b, func(r *store.Sandbox) { r.Ports = list })
	}
	runID := runIDOf(id)
	if runID == "" {
		return errNoSandbox
	}
	return m.updateStored(ctx, tenant, runID, func(r *store.Run) {
		if r.SandboxID == id {
			r.Ports = list
		}
	})
}

// checkPort is a port field.
func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return badField("port", "%d is not a TCP port (1-65535)", port)
	}
	if port == egress.RelayPort {
		// The sandbox's egress relay: exposed, anyone holding the preview
		// URL could send traffic out through the tenant's egress proxy.
		return badField("port", "%d is the sandbox's egress relay (%s), which is never exposed", port, egress.RelayAddr)
	}
	return nil
}

// ExposePort gives port of a tenant's sandbox a preview token that works
// for ttl (0: the policy's default), replacing (and ending) the port's
// earlier one. The sandbox's server need not be listening yet.
func (m *Manager) ExposePort(ctx context.Context, tenant, sandboxID string, port int, ttl time.Duration) (*ExposedPort, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	p := m.ports
	if err := checkSandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	if err := checkPort(port); err != nil {
		return nil, err
	}
	ttl, err := bounded("ttl", ttl, p.policy.DefaultTTL, minSandboxTimeout, p.policy.MaxTTL)
	if err != nil {
		return nil, err
	}
	if _, err := m.GetSandbox(ctx, tenant, sandboxID); err != nil {
		return nil, err
	}
	var nonce [nonceBytes]byte
	_, _ = rand.Read(nonce[:])
	now := m.now()
	e := p.newExposure(tenant, sandboxID, port, now, now.Add(ttl), nonce)
	p.save.Lock()
	defer p.save.Unlock()
	list := slices.DeleteFunc(p.live(sandboxID), func(x *exposure) bool { return x.port == port })
	if len(list) >= p.policy.MaxPortsPerSandbox {
		e.cancel()
		return nil, withKind(errkind.ErrResourceExhausted, fmt.Errorf("sandbox %s has %d exposed ports, the most it may have; revoke one first",
			sandboxID, len(list)))
	}
	if err := m.savePorts(ctx, tenant, sandboxID, p.records(append(list, e))); err != nil {
		e.cancel()
		return nil, err
	}
	p.add(e)
	out := p.view(e)
	m.log.Debug("port exposed", zap.String("sandbox", sandboxID), zap.Int("port", port), zap.Time("expires", e.expires))
	return &out, nil
}

// RevokePort ends the preview token of port of a tenant's sandbox at once:
// it is refused from now on and every connection proxied for it is closed.
// A port that is not exposed is not found.
func (m *Manager) RevokePort(ctx context.Context, tenant, sandboxID string, port int) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	p := m.ports
	if err := checkSandboxID("sandbox_id", sandboxID); err != nil {
		return err
	}
	if err := checkPort(port); err != nil {
		return err
	}
	if _, err := m.GetSandbox(ctx, tenant, sandboxID); err != nil {
		return err
	}
	p.save.Lock()
	defer p.save.Unlock()
	i := slices.IndexFunc(p.live(sandboxID), func(x *exposure) bool { return x.port == port })
	if i < 0 {
		return withKind(errkind.ErrNotFound, fmt.Errorf("port %d of sandbox %s is not exposed", port, sandboxID))
	}
	p.mu.Lock()
	e := p.bySandbox[sandboxID][port]
	p.mu.Unlock()
	if e != nil {
		p.remove(e) // first: it ends now, whatever the store does
	}
	m.log.Debug("port revoked", zap.String("sandbox", sandboxID), zap.Int("port", port))
	return m.savePorts(ctx, tenant, sandboxID, p.records(p.live(sandboxID)))
}

// ListPorts returns the exposed ports of a tenant's sandbox, by port.
func (m *Manager) ListPorts(ctx context.Context, tenant, sandboxID string) ([]ExposedPort, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if _, err := m.GetSandbox(ctx, tenant, sandboxID); err != nil {
		return nil, err
	}
	var out []ExposedPort
	for _, e := range m.ports.live(sandboxID) {
		out = append(out, m.ports.view(e))
	}
	return out, nil
}

// MaxPreviewRequestBytes is the cap on a proxied request's body.
func (m *Manager) MaxPreviewRequestBytes() int64 { return m.ports.policy.MaxRequestBytes }

// Preview is a preview token that was good when Preview checked it.
type Preview struct {
	m *Manager
	e *exposure
}

// Preview checks a preview token: ErrPreviewNotFound unless it is good
// (untampered, in time, not revoked).
func (m *Manager) Preview(token string) (*Preview, error) {
	e := m.ports.verify(token)
	if e == nil {
		return nil, ErrPreviewNotFound
	}
	return &Preview{m: m, e: e}, nil
}

// Port is the sandbox port the preview reaches.
func (pv *Preview) Port() int { return pv.e.port }

// Pool names the exposure (not a secret: it does not open anything) for
// the transport's connection pool: DialPreview dials it.
func (pv *Preview) Pool() string { return pv.e.pool }

// Begin marks a proxied request in progress (Shutdown waits for it; an
// API sandbox's idle clock counts it as use); the caller calls done once
// it ended. Unavailable once the manager is shut down.
func (pv *Preview) Begin() (done func(), err error) {
	m := pv.m
	if !m.tasks.enter() {
		return nil, errShutDown
	}
	unbusy := m.busyBox(pv.e.sandbox)
	return func() { unbusy(); m.tasks.leave() }, nil
}

// DialPreview opens a proxied connection to the port of the exposure pool
// names (Preview.Pool): a tunnel through the sandbox's daemon, closed when
// the exposure ends, after PreviewPolicy.IdleTimeout without a byte, or by
// Close. ctx bounds the dial only. An exposure that ended is
// ErrPreviewNotFound; a sandbox with MaxConnsPerSandbox open connections
// is resource exhausted; nothing listening on the port is unavailable.
func (m *Manager) DialPreview(ctx context.Context, pool string) (net.Conn, error) {
	if !m.tasks.enter() {
		return nil, errShutDown
	}
	defer m.tasks.leave()
	p := m.ports
	p.mu.Lock()
	e := p.byPool[pool]
	switch {
	case e == nil || e.ctx.Err() != nil:
		p.mu.Unlock()
		return nil, ErrPreviewNotFound
	case p.conns[e.sandbox] >= p.policy.MaxConnsPerSandbox:
		p.mu.Unlock()
		return nil, withKind(errkind.ErrResourceExhausted, fmt.Errorf("sandbox %s has %d proxied connections open, the most it may have", e.sandbox, p.policy.MaxConnsPerSandbox))
	}
	p.conns[e.sandbox]++
	t := &tunnel{p: p, e: e, counted: true}
	e.tunnels[t] = struct{}{}
	p.mu.Unlock()
	conn, err := m.dialExposure(ctx, e)
	if err != nil {
		t.release()
		return nil, err
	}
	p.mu.Lock()
	_, open := e.tunnels[t] // false when the exposure ended meanwhile
	if open {
		t.conn, t.idle = conn, p.policy.IdleTimeout
		t.timer = time.AfterFunc(t.idle, func() { _ = t.Close() })
	}
	p.mu.Unlock()
	if !open {
		_ = conn.Close()
		t.release()
		return nil, ErrPreviewNotFound
	}
	return t, nil
}

// dialExposure opens the tunnel of e: it lives as long as e (its ctx),
// the dial is bounded by ctx too.
func (m *Manager) dialExposure(ctx context.Context, e *exposure) (net.Conn, error) {
	sess, done, err := m.open(ctx, e.tenant, e.sandbox)
	if err != nil {
		if errors.Is(err, errkind.ErrNotFound) {
			m.ports.dropSandbox(e.sandbox) // deleted: its exposures end
			return nil, ErrPreviewNotFound
		}
		return nil, err
	}
	defer done()
	cctx, cancel := context.WithCancel(e.ctx)
	stop := context.AfterFunc(ctx, cancel)
	conn, err := sess.Forward(cctx, e.port)
	if !stop() {
		// The dial's ctx ended (a conn made meanwhile is canceled).
		if conn != nil {
			_ = conn.Close()
		}
		cancel()
		return nil, cmp.Or(err, context.Cause(ctx))
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &cancelConn{Conn: conn, cancel: cancel}, nil
}

// cancelConn is a forwarded connection whose stream's context ends with
// Close.
type cancelConn struct {
	net.Conn
	cancel context.CancelFunc
}

func (c *cancelConn) Close() error {
	err := c.Conn.Close()
	c.cancel()
	return err
}

// Hold ties a connection of the client to the preview (the transport's
// end of an upgraded request, a WebSocket): it is closed when the
// exposure ends or after PreviewPolicy.IdleTimeout without a byte, so a
// client that keeps it open holds nothing past then. It does not count
// against the sandbox's bound (its tunnel does).
func (pv *Preview) Hold(conn net.Conn) net.Conn {
	p := pv.m.ports
	t := &tunnel{p: p, e: pv.e}
	p.mu.Lock()
	_, open := p.byPool[pv.e.pool]
	if open {
		pv.e.tunnels[t] = struct{}{}
		t.conn, t.idle = conn, p.policy.IdleTimeout
		t.timer = time.AfterFunc(t.idle, func() { _ = t.Close() })
	}
	p.mu.Unlock()
	if !open {
		_ = conn.Close()
		t.closed.Store(true)
		t.conn = conn
	}
	return t
}

// tunnel is a proxied connection (counted against its sandbox's bound),
// or a client's connection held for one: closed when idle or when its
// exposure ends; reads and writes then fail with net.ErrClosed (not a
// clean EOF, which a proxy would pass on as a half close and wait).
type tunnel struct {
	p       *ports
	e       *exposure
	counted bool
	conn    net.Conn // set once dialed, before the tunnel is returned
	closed  atomic.Bool

	// idle and timer are set with conn (under ports.mu).
	idle  time.Duration
	timer *time.Timer

	closeOnce, releaseOnce sync.Once
}

// touch moves the idle deadline.
func (t *tunnel) touch() {
	if t.timer != nil {
		t.timer.Reset(t.idle)
	}
}

func (t *tunnel) Read(b []byte) (int, error) {
	n, err := t.conn.Read(b)
	if n > 0 {
		t.touch()
	}
	if err != nil && t.closed.Load() {
		err = net.ErrClosed
	}
	return n, err
}

func (t *tunnel) Write(b []byte) (int, error) {
	n, err := t.conn.Write(b)
	if n > 0 {
		t.touch()
	}
	if err != nil && t.closed.Load() {
		err = net.ErrClosed
	}
	return n, err
}

func (t *tunnel) Close() error {
	var err error
	t.closed.Store(true)
	t.closeOnce.Do(func() {
		t.p.mu.Lock()
		conn, timer := t.conn, t.timer
		t.p.mu.Unlock()
		if timer != nil {
			timer.Stop()
		}
		if conn != nil {
			err = conn.Close()
		}
		t.release()
	})
	return err
}

// release gives the tunnel's slot back.
func (t *tunnel) release() {
	t.releaseOnce.Do(func() {
		p := t.p
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(t.e.tunnels, t)
		if !t.counted {
			return
		}
		if p.conns[t.e.sandbox]--; p.conns[t.e.sandbox] <= 0 {
			delete(p.conns, t.e.sandbox)
		}
	})
}

func (t *tunnel) LocalAddr() net.Addr                { return t.conn.LocalAddr() }
func (t *tunnel) RemoteAddr() net.Addr               { return t.conn.RemoteAddr() }
func (t *tunnel) SetDeadline(d time.Time) error      { return t.conn.SetDeadline(d) }
func (t *tunnel) SetReadDeadline(d time.Time) error  { return t.conn.SetReadDeadline(d) }
func (t *tunnel) SetWriteDeadline(d time.Time) error { return t.conn.SetWriteDeadline(d) }

// CloseWrite half-closes the tunnel when its connection can.
func (t *tunnel) CloseWrite() error {
	if cw, ok := t.conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// recoverPorts takes back the exposures an earlier manager recorded with
// the sandboxes still live (New): those made under this manager's key and
// still in time. Their sandboxes are reattached on first use.
func (m *Manager) recoverPorts(ctx context.Context) error {
	p := m.ports
	now := m.now()
	n := 0
	load := func(tenant, id string, recs []store.Port) {
		for _, r := range recs {
			if !hmac.Equal(r.KeyID, p.keyID) || !now.Before(r.Expires) || checkPort(r.Port) != nil || len(r.Nonce) != nonceBytes {
				continue
			}
			var nonce [nonceBytes]byte
			copy(nonce[:], r.Nonce)
			p.add(p.newExposure(tenant, id, r.Port, r.Created, r.Expires, nonce))
			n++
		}
	}
	sbs, err := m.cfg.Store.LiveSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("recover exposed ports: %w", err)
	}
	for _, rec := range sbs {
		if len(rec.Ports) > 0 && rec.Expires.After(now) && len(rec.SessionState) > 0 {
			load(rec.Tenant, rec.ID, rec.Ports)
		}
	}
	runs, err := m.cfg.Store.HeldSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("recover exposed ports: %w", err)
	}
	for _, r := range runs {
		if len(r.Ports) == 0 || !r.HoldsSandbox() || (terminal(r.Status) && !r.SandboxExpires.After(now)) {
			continue
		}
		load(r.Tenant, r.SandboxID, r.Ports)
	}
	if n > 0 {
		m.log.Info("exposed ports of an earlier service", zap.Int("kept", n))
	}
	return nil
}
