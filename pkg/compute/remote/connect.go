package remote

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// http2Preface is what an HTTP/2 client sends first, followed here by an
// empty SETTINGS frame.
var http2Preface = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)

// http2FrameSettings is the type of a SETTINGS frame (RFC 9113, 6.5).
const http2FrameSettings = 4

// connect reaches the daemon in steps, so that each failure says what it
// is: the transport (unreachable: ErrUnavailable, retryable), TLS (an
// untrusted certificate or a refused client certificate:
// ErrUnauthenticated), the protocol (not a gRPC server, or TLS mismatch:
// ErrFailedPrecondition), health (not serving within ConnectTimeout:
// ErrUnavailable, retryable), then an authenticated call (a bad token:
// ErrUnauthenticated); the last two through agentclient.WaitReady.
func (p *Provider) connect(ctx context.Context) (*agentclient.Client, *agentclient.DaemonInfo, error) {
	token, err := p.cfg.token()
	if err != nil {
		return nil, nil, err
	}
	tc, err := p.cfg.tlsConfig(p.ep)
	if err != nil {
		return nil, nil, err
	}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()
	if err := probe(ctx, p.ep, tc); err != nil {
		return nil, nil, err
	}
	client, err := agentclient.Dial(agentclient.Options{Address: p.ep.String(), Token: token, TLS: tc, TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return nil, nil, fmt.Errorf("remote sandbox %s: %w", p.ep, err)
	}
	fail := func(err error) (*agentclient.Client, *agentclient.DaemonInfo, error) {
		_ = client.Close()
		return nil, nil, err
	}
	// The rest of ConnectTimeout bounds the wait, which then ends as
	// unavailable (retryable); only the caller's own context ends it as
	// canceled or past its deadline.
	deadline, _ := ctx.Deadline()
	info, err := agentclient.WaitReady(outer, client, agentclient.ReadyOptions{Timeout: max(time.Until(deadline), time.Millisecond)})
	if err != nil {
		if errors.Is(err, compute.ErrUnauthenticated) {
			return fail(fmt.Errorf("remote sandbox %s rejected the token: %w", p.ep, err))
		}
		return fail(fmt.Errorf("remote sandbox %s: %w", p.ep, err))
	}
	p.log.Debug("connected", zap.String("address", p.ep.String()), zap.String("version", info.Version))
	return client, info, nil
}

// probe opens one raw connection to the daemon, does the TLS handshake
// when tc is set, and checks that an HTTP/2 server answers (with TLS 1.3 a
// server's verdict on the client certificate arrives only then).
func probe(ctx context.Context, ep endpoint, tc *tls.Config) error {
	var d net.Dialer
	raw, err := d.DialContext(ctx, ep.network, ep.addr)
	if err != nil {
		return compute.MarkRetryable(fmt.Errorf("%w: cannot reach the remote sandbox at %s: %v", compute.ErrUnavailable, ep, err))
	}
	defer raw.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(deadline)
	}
	conn := raw
	if tc != nil {
		cfg := tc.Clone()
		cfg.NextProtos = []string{"h2"}
		tconn := tls.Client(raw, cfg)
		if err := tconn.HandshakeContext(ctx); err != nil {
			return tlsError(ep, err)
		}
		conn = tconn
	}
	if _, err := conn.Write(http2Preface); err != nil {
		return answerError(ep, tc != nil, err)
	}
	// The server's first frame: 9 header bytes, the type at index 3.
	head := make([]byte, 9)
	if _, err := io.ReadFull(conn, head); err != nil {
		return answerError(ep, tc != nil, err)
	}
	if head[3] != http2FrameSettings {
		return fmt.Errorf("%w: remote sandbox %s does not answer as a gRPC server (first bytes %q)", compute.ErrFailedPrecondition, ep, bytes.TrimSpace(head))
	}
	return nil
}

// tlsError classifies a failed TLS handshake.
func tlsError(ep endpoint, err error) error {
	var (
		unknownCA  x509.UnknownAuthorityError
		hostname   x509.HostnameError
		invalid    x509.CertificateInvalidError
		verifyErr  *tls.CertificateVerificationError
		recordErr  tls.RecordHeaderError
		opErr      *net.OpError
		remoteDeny = errors.As(err, &opErr) && opErr.Op == "remote error"
	)
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verifyErr):
		return fmt.Errorf("%w: remote sandbox %s: its TLS certificate is not trusted: %v", compute.ErrUnauthenticated, ep, err)
	case remoteDeny:
		return fmt.Errorf("%w: remote sandbox %s refused the TLS handshake (client certificate missing or not trusted?): %v", compute.ErrUnauthenticated, ep, err)
	case errors.As(err, &recordErr):
		return fmt.Errorf("%w: remote sandbox %s does not speak TLS (configured with TLS): %v", compute.ErrFailedPrecondition, ep, err)
	}
	return compute.MarkRetryable(fmt.Errorf("%w: remote sandbox %s: TLS handshake: %v", compute.ErrUnavailable, ep, err))
}

// answerError classifies a failure to exchange the first HTTP/2 frames.
func answerError(ep endpoint, withTLS bool, err error) error {
	var opErr *net.OpError
	switch {
	case withTLS && errors.As(err, &opErr) && opErr.Op == "remote error":
		return fmt.Errorf("%w: remote sandbox %s refused the client certificate: %v", compute.ErrUnauthenticated, ep, err)
	case !withTLS && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		return fmt.Errorf("%w: remote sandbox %s closed a plaintext connection (does it require TLS?): %v", compute.ErrFailedPrecondition, ep, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return compute.MarkRetryable(fmt.Errorf("%w: remote sandbox %s did not answer in time: %v", compute.ErrUnavailable, ep, err))
	}
	return compute.MarkRetryable(fmt.Errorf("%w: remote sandbox %s: %v", compute.ErrUnavailable, ep, err))
}

// healthy reports whether the daemon answers its health check in time.
func (p *Provider) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, min(p.cfg.ConnectTimeout, 3*time.Second))
	defer cancel()
	tc, err := p.cfg.tlsConfig(p.ep)
	if err != nil {
		return false
	}
	return probe(ctx, p.ep, tc) == nil
}
