package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"
)

// errHelloRead stops the TLS handshake once the ClientHello is read.
var errHelloRead = errors.New("client hello read")

// readServerName reads a TLS ClientHello from r (at most limit bytes) and
// returns its server name (SNI, "" when it sends none) and every byte
// consumed from r, to be passed on unchanged. crypto/tls parses the
// ClientHello (no parser of our own); nothing is ever written back.
func readServerName(r *bufio.Reader, limit int64) (string, []byte, error) {
	var seen bytes.Buffer
	conn := &helloConn{r: io.TeeReader(&io.LimitedReader{R: r, N: limit}, &seen)}
	var sni string
	got := false
	err := tls.Server(conn, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, got = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	if !got {
		if err == nil {
			err = errors.New("handshake ended without a ClientHello")
		}
		return "", nil, err
	}
	// Bytes r buffered beyond what crypto/tls consumed go on too.
	rest := make([]byte, r.Buffered())
	_, _ = io.ReadFull(r, rest)
	seen.Write(rest)
	return sni, seen.Bytes(), nil
}

// helloConn is the read side of a client connection as crypto/tls sees
// it while reading the ClientHello: writes (alerts) are dropped.
type helloConn struct{ r io.Reader }

func (c *helloConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *helloConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *helloConn) Close() error                     { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *helloConn) SetDeadline(time.Time) error      { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }
