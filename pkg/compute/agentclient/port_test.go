package agentclient_test

// PortService.Forward end to end: an in-process daemon over real gRPC (a
// unix socket), and servers started by the test on 127.0.0.1, which is the
// daemon's own network here, as it is for a local sandbox.

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// serveTCP accepts connections on 127.0.0.1 and runs handle for each.
func serveTCP(t *testing.T, handle func(*net.TCPConn)) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// echo copies what it reads back until EOF, then half-closes.
func echo(c *net.TCPConn) {
	_, _ = io.Copy(c, c)
	_ = c.CloseWrite()
}

func TestForwardEchoWithHalfClose(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	port := serveTCP(t, echo)
	conn, err := d.Client.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payload := make([]byte, 3<<20+17)
	_, _ = rand.Read(payload)
	go func() {
		_, _ = conn.Write(payload)
		_ = conn.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("echo of %d bytes came back as %d bytes, equal=%v", len(payload), len(got), bytes.Equal(got, payload))
	}
	if _, err := conn.Write([]byte("late")); err == nil {
		t.Error("a write after CloseWrite succeeded")
	}
}

func TestForwardServerClosesFirst(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	port := serveTCP(t, func(c *net.TCPConn) { _, _ = c.Write([]byte("hello, then goodbye")) })
	conn, err := d.Client.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "hello, then goodbye" {
		t.Fatalf("read %q, %v", got, err)
	}
}

func TestForwardClientCloseReachesTheServer(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	ended := make(chan error, 1)
	port := serveTCP(t, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		ended <- err
	})
	conn, err := d.Client.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("some bytes")); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the server's connection stays open after the client closed")
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
}

func TestForwardErrors(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	_, err = d.Client.Forward(ctx, closed)
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
		t.Errorf("forward to a closed port: %v; want ErrUnavailable, retryable", err)
	}
	t.Log(err)
	for _, port := range []int{0, -1, 70000} {
		if _, err := d.Client.Forward(ctx, port); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("forward to port %d: %v", port, err)
		}
	}
	info, err := d.Client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.Features, "port.forward") {
		t.Errorf("features %v lack port.forward", info.Features)
	}
}

func TestForwardReadDeadline(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	port := serveTCP(t, echo)
	conn, err := d.Client.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	// Cleared, the connection works again.
	_ = conn.SetReadDeadline(time.Time{})
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'x' {
		t.Fatalf("read after clearing the deadline: %q %v", b, err)
	}
}

// TestListenLocalHTTP serves HTTP "inside the sandbox" and reaches it with
// a plain http.Client through ListenLocal, several requests at once.
func TestListenLocalHTTP(t *testing.T) {
	ctx := testCtx(t)
	d := agentdtest.Start(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "preview of %s", r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := l.Addr().(*net.TCPAddr).Port

	pl, err := d.Client.ListenLocal(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pl.Close(); pl.Wait() }()
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get(fmt.Sprintf("http://%s/page/%d", pl.Addr(), i))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != fmt.Sprintf("preview of /page/%d", i) {
				errs <- fmt.Errorf("page %d: %q %v", i, body, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := pl.Err(); err != nil {
		t.Errorf("a forward failed: %v", err)
	}
	// A forward directly through http.Transport's dialer works too.
	direct := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.Client.Forward(ctx, port)
	}}}
	defer direct.CloseIdleConnections()
	resp, err := direct.Get("http://sandbox/direct")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "preview of /direct" {
		t.Fatalf("direct: %q", body)
	}
}
