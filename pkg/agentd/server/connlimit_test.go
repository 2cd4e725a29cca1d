package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/mem"
)

// TestLimitedConnReadOnReady checks the reads gRPC makes through a
// connection the limiter accepted (ReadOnReady, on a unix and a TCP
// socket): the bytes arrive whole and in order in buffers of the size
// asked for, the peer's close is io.EOF, a passed deadline an error, and
// closing the connection frees its place.
func TestLimitedConnReadOnReady(t *testing.T) {
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = filepath.Join(t.TempDir(), "s.sock")
			}
			inner, err := net.Listen(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			l := limitConnections(inner, 1, 0, nil, zap.NewNop())
			defer l.Close()
			client, err := net.Dial(network, inner.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			lc := c.(*limitedConn)
			if lc.raw == nil {
				t.Fatal("the connection reads through a buffer, not straight from its socket")
			}
			want := make([]byte, 1<<20)
			for i := range want {
				want[i] = byte(i * 7)
			}
			go func() { _, _ = client.Write(want); client.Close() }()
			pool := mem.DefaultBufferPool()
			var got bytes.Buffer
			for {
				buf, n, err := lc.ReadOnReady(16<<10, pool)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(*buf) != 16<<10 || n <= 0 || n > len(*buf) {
					t.Fatalf("a read of %d bytes into a buffer of %d", n, len(*buf))
				}
				got.Write((*buf)[:n])
				pool.Put(buf)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("read %d bytes, not the %d written", got.Len(), len(want))
			}

			// A passed deadline ends a read that waits.
			client2, err := net.Dial(network, inner.Addr().String())
			if err == nil {
				defer client2.Close()
			}
			if err := lc.Close(); err != nil {
				t.Fatal(err)
			}
			if lc.l.open.Load() != 0 {
				t.Fatalf("%d connections counted open after the only one closed", lc.l.open.Load())
			}
			c2, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			_ = c2.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, _, err := c2.(*limitedConn).ReadOnReady(4096, pool); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("a read past its deadline: %v", err)
			}
		})
	}
}
