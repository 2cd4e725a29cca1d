package faultnet

import (
	"bufio"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// echoServer answers each line with the same line, on a unix socket.
func echoServer(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "echo.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return "unix://" + sock
}

func dial(t *testing.T, address string) net.Conn {
	t.Helper()
	network, addr, err := split(address)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func roundTrip(c net.Conn, line string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func TestCutClosesOpenConnectionsOnly(t *testing.T) {
	target := echoServer(t)
	for _, listen := range []Listen{Unix, TCP} {
		t.Run(string(listen), func(t *testing.T) {
			p := Start(t, listen, target)
			if !strings.HasPrefix(p.Address(), string(listen)+"://") {
				t.Fatalf("Address() = %q, want a %s address", p.Address(), listen)
			}
			a, b := dial(t, p.Address()), dial(t, p.Address())
			for _, c := range []net.Conn{a, b} {
				if got, err := roundTrip(c, "hello"); err != nil || got != "hello" {
					t.Fatalf("through the proxy: %q, %v", got, err)
				}
			}
			if n := p.Cut(); n != 2 {
				t.Errorf("Cut() = %d, want the 2 open connections", n)
			}
			var ne net.Error
			if _, err := roundTrip(a, "after the cut"); err == nil {
				t.Error("a connection open at the cut still carries data")
			} else if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("a cut connection hangs instead of closing: %v", err)
			}
			c := dial(t, p.Address())
			if got, err := roundTrip(c, "again"); err != nil || got != "again" {
				t.Fatalf("a new connection after the cut: %q, %v", got, err)
			}
			if p.Accepted() != 3 {
				t.Errorf("Accepted() = %d, want 3", p.Accepted())
			}
			p.Close()
			p.Close() // idempotent
			if _, err := roundTrip(c, "closed"); err == nil {
				t.Error("Close left a connection open")
			}
		})
	}
}

func TestBadTarget(t *testing.T) {
	for _, target := range []string{"", "http://x", "127.0.0.1:80"} {
		if _, _, err := split(target); err == nil {
			t.Errorf("split(%q) accepted", target)
		}
	}
}
