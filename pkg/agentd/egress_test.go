package agentd

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestParseEgressRelay(t *testing.T) {
	r, err := ParseEgressRelay("127.0.0.1:3128=unix:///run/bulkhead/egress.sock")
	if err != nil || r.Listen != "127.0.0.1:3128" || r.Socket != "/run/bulkhead/egress.sock" {
		t.Fatalf("ParseEgressRelay = %+v, %v", r, err)
	}
	if env := r.ProxyEnv(); env["HTTPS_PROXY"] != "http://127.0.0.1:3128" || env["http_proxy"] != "http://127.0.0.1:3128" || !strings.Contains(env["NO_PROXY"], "127.0.0.1") {
		t.Errorf("ProxyEnv = %v", env)
	}
	for _, bad := range []string{"", "127.0.0.1:3128", "0.0.0.0:3128=unix:///x.sock", "10.0.0.1:3128=unix:///x.sock",
		"127.0.0.1=unix:///x.sock", "127.0.0.1:3128=tcp://1.2.3.4:3128", "127.0.0.1:3128=unix://rel.sock"} {
		if _, err := ParseEgressRelay(bad); err == nil {
			t.Errorf("ParseEgressRelay(%q) accepted", bad)
		}
	}
}

// TestEgressRelayCarriesBytes: a connection to the relay's loopback port
// reaches the unix socket, both ways, half-close included; close ends
// open connections.
func TestEgressRelayCarriesBytes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c) // until the client's half-close
				_, _ = c.Write([]byte("echo:" + string(b)))
			}()
		}
	}()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().String()
	free.Close()
	rl, err := startRelay(EgressRelay{Listen: port, Socket: sock}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	addr := rl.l.Addr().String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write([]byte("hello"))
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "echo:hello" {
		t.Fatalf("relayed reply %q, %v", got, err)
	}
	c.Close()

	// An open connection ends with the relay.
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	_, _ = open.Write([]byte("x"))
	time.Sleep(50 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- rl.close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay close hangs with a connection open")
	}
	_ = open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := open.Read(make([]byte, 16)); err == nil {
		t.Error("connection still open after the relay closed")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("relay still accepts after close")
	}
}
