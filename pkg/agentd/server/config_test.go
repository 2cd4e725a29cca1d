package server

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func validConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Listen = []string{"unix:///tmp/x.sock"}
	cfg.Daemon.WorkspaceRoot = t.TempDir()
	cfg.InsecureNoAuth = true
	return cfg
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" = valid
	}{
		{"valid insecure", func(c *Config) {}, ""},
		{"token file", func(c *Config) { c.InsecureNoAuth = false; c.TokenFile = "/t" }, ""},
		{"no listen", func(c *Config) { c.Listen = nil }, "no --listen"},
		{"bad scheme", func(c *Config) { c.Listen = []string{"http://x"} }, "scheme"},
		{"empty unix path", func(c *Config) { c.Listen = []string{"unix://"} }, "empty socket path"},
		{"tcp without host", func(c *Config) { c.Listen = []string{"tcp://"} }, "host:port"},
		{"no token", func(c *Config) { c.InsecureNoAuth = false }, "no token configured"},
		{"two token sources", func(c *Config) { c.InsecureNoAuth = false; c.TokenFile = "/t"; c.TokenFD = 3 }, "not both"},
		{"token and insecure", func(c *Config) { c.TokenFile = "/t" }, "contradicts"},
		{"stdio token fd", func(c *Config) { c.InsecureNoAuth = false; c.TokenFD = 0 }, ">= 3"},
		{"cert without key", func(c *Config) { c.TLSCertFile = "c" }, "go together"},
		{"client CA without TLS", func(c *Config) { c.ClientCAFile = "ca" }, "needs --tls-cert"},
		{"no reclaiming", func(c *Config) { c.ReclaimIdle = 0 }, ""},
		{"negative reclaim idle", func(c *Config) { c.ReclaimIdle = -time.Second }, "--reclaim-idle"},
		{"no reclaiming under load", func(c *Config) { c.ReclaimGrowth = 0 }, ""},
		{"negative reclaim growth", func(c *Config) { c.ReclaimGrowth = -1 }, "--reclaim-growth-bytes"},
		{"no connection cap", func(c *Config) { c.MaxConnections = 0 }, ""},
		{"negative connection cap", func(c *Config) { c.MaxConnections = -1 }, "--max-connections"},
		{"no handshake timeout", func(c *Config) { c.HandshakeTimeout = 0 }, "--handshake-timeout"},
		{"relative workspace", func(c *Config) { c.Daemon.WorkspaceRoot = "ws" }, "absolute"},
		{"workspace is /", func(c *Config) { c.Daemon.WorkspaceRoot = "/" }, "must not be /"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := validConfig(t)
			c.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("want error containing %q, got %v", c.want, err)
			}
		})
	}
}

func TestTokenFileIsReadAndRemoved(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{TokenFile: p, TokenFD: -1}
	tok, err := cfg.loadToken()
	if err != nil {
		t.Fatal(err)
	}
	if string(tok) != testToken {
		t.Fatalf("token %q", tok)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatal("token file still exists after reading")
	}
}

func TestTokenFromDescriptor(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { w.WriteString(testToken); w.Close() }()
	// loadToken closes the descriptor it is given, as the daemon does with
	// an inherited one; hand it a duplicate so that r's own close (and
	// finalizer) never closes a descriptor number reused meanwhile.
	fd, err := syscall.Dup(int(r.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	cfg := Config{TokenFD: fd, TokenFile: ""}
	tok, err := cfg.loadToken()
	if err != nil {
		t.Fatal(err)
	}
	if string(tok) != testToken {
		t.Fatalf("token %q", tok)
	}
}

func TestTokenRejected(t *testing.T) {
	for name, content := range map[string]string{
		"short":      "abc",
		"empty":      "",
		"whitespace": "0123456789 abcdef0123",
		"huge":       strings.Repeat("a", maxTokenBytes+10),
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := Config{TokenFile: p, TokenFD: -1}
			if _, err := cfg.loadToken(); err == nil {
				t.Fatal("want an error")
			}
		})
	}
	cfg := Config{TokenFile: filepath.Join(t.TempDir(), "missing"), TokenFD: -1}
	if _, err := cfg.loadToken(); err == nil {
		t.Fatal("a missing token file must be an error")
	}
}
