package agentd

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// portDialTimeout bounds the connect to a port inside the sandbox.
const portDialTimeout = 10 * time.Second

// portChunkBytes is the most a forwarded read passes on at once.
const portChunkBytes = 32 << 10

// PortTunnel is the harness's side of a forwarded connection, as the
// transport (the gRPC shim) delivers it.
type PortTunnel struct {
	// Opened tells the harness the connection to the port is open.
	Opened func(address string) error
	// Recv returns the next bytes from the harness; io.EOF when the
	// harness closed its side.
	Recv func() ([]byte, error)
	// Send passes bytes from the port to the harness.
	Send func([]byte) error
	// Closed tells the harness the port closed its side.
	Closed func() error
}

// ForwardPort connects to 127.0.0.1:port inside the sandbox and carries
// bytes both ways until both sides closed, either fails, or ctx ends. Half
// closes pass through: the harness's EOF half-closes the TCP connection,
// the port's EOF is reported with Closed. Nothing listening is
// ErrUnavailable (retrying can help once the server is up).
func (d *Daemon) ForwardPort(ctx context.Context, port int, t PortTunnel) error {
	if port < 1 || port > 65535 {
		return errkind.Errorf(errkind.ErrInvalidArgument, "forward: port %d is not in 1-65535", port)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	dialer := net.Dialer{Timeout: portDialTimeout}
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return errkind.Errorf(errkind.ErrUnavailable, "forward: nothing listens on %s in the sandbox", addr)
		}
		return errkind.Errorf(errkind.ErrUnavailable, "forward: connect to %s in the sandbox: %v", addr, err)
	}
	tcp := conn.(*net.TCPConn)
	defer tcp.Close()
	if err := t.Opened(addr); err != nil {
		return err
	}
	d.log.Debug("port forward opened", zap.Int("port", port))

	// Harness -> port. Its end is the harness's EOF (half-close the port)
	// or an error (abort the connection, which also ends the other way).
	upErr := make(chan error, 1)
	go func() {
		for {
			b, err := t.Recv()
			if errors.Is(err, io.EOF) {
				upErr <- tcp.CloseWrite()
				return
			}
			if err != nil {
				_ = tcp.Close()
				upErr <- err
				return
			}
			d.activity.Touch()
			if _, err := tcp.Write(b); err != nil {
				_ = tcp.Close()
				upErr <- errkind.Errorf(errkind.ErrUnavailable, "forward: write to %s: %v", addr, err)
				return
			}
		}
	}()

	// Port -> harness.
	var downErr error
	buf := make([]byte, portChunkBytes)
	for {
		n, err := tcp.Read(buf)
		if n > 0 {
			d.activity.Touch()
			if serr := t.Send(buf[:n]); serr != nil {
				_ = tcp.Close()
				downErr = serr
				break
			}
		}
		if errors.Is(err, io.EOF) {
			downErr = t.Closed()
			break
		}
		if err != nil {
			// Closed by the other direction's failure, or reset by the port.
			downErr = errkind.Errorf(errkind.ErrUnavailable, "forward: read from %s: %v", addr, err)
			_ = tcp.Close()
			break
		}
	}
	if downErr != nil {
		if ctx.Err() != nil {
			return ctx.Err() // the harness closed or went away
		}
		// The port reset the connection or the harness went away: end the
		// stream now (the transport then fails the pending Recv, and the
		// other direction ends with it).
		select {
		case uerr := <-upErr:
			if uerr != nil {
				downErr = uerr // the cause: the harness's side failed first
			}
		default:
		}
		d.log.Debug("port forward failed", zap.Int("port", port), zap.Error(downErr))
		return downErr
	}
	// The port closed its side; the stream ends once the harness is done
	// too (its EOF, an error, or the transport canceling Recv with ctx).
	err = <-upErr
	d.log.Debug("port forward closed", zap.Int("port", port))
	return err
}
