package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
)

// Config is everything sandbox-agentd needs to run: where to listen, how to
// authenticate, and the daemon's own settings.
type Config struct {
	// Listen holds one or more addresses: unix:///path/to.sock or tcp://host:port.
	Listen []string
	// TokenFile is read once at start and then removed.
	TokenFile string
	// TokenFD is an inherited descriptor (>= 3) the token is read from, then closed. -1 = unset.
	TokenFD int
	// InsecureNoAuth disables authentication (local development only).
	InsecureNoAuth bool
	// TLS: server certificate and key; with ClientCAFile set, clients must
	// present a certificate signed by it (mTLS).
	TLSCertFile, TLSKeyFile, ClientCAFile string
	// ShutdownTimeout bounds the graceful drain after SIGTERM.
	ShutdownTimeout time.Duration
	// MetricsListen, when set, serves Prometheus metrics over HTTP at
	// /metrics on this address (tcp://host:port, host:port or
	// unix:///path.sock). The endpoint is unauthenticated: bind it to a
	// loopback or private address. "" (the default) serves no metrics and
	// counts nothing.
	MetricsListen string
	// ReclaimIdle is how long a burst of calls must have been over before
	// the daemon gives the memory it used back to the system (once per
	// burst); 0 disables it, and reclaiming under load with it.
	ReclaimIdle time.Duration
	// ReclaimGrowth is how many bytes the memory the Go runtime holds may
	// grow since the last reclaim before the daemon reclaims while calls
	// keep coming (under steady load it is never idle for ReclaimIdle); at
	// most once per 10 s and only when no transfer is in flight. 0
	// disables it.
	ReclaimGrowth int64
	// MaxConnections is how many connections each listen address keeps
	// open at once; one more is closed as soon as it is accepted (and
	// counted in the metrics). 0 means no cap. Default
	// DefaultMaxConnections.
	MaxConnections int
	// HandshakeTimeout is how long a new connection has to finish its
	// TLS handshake (when on) and HTTP/2 preface, and, unless
	// InsecureNoAuth, to make its first call with the token (a health
	// check does not count); a connection that has not is closed.
	// Default DefaultHandshakeTimeout; it must be positive.
	HandshakeTimeout time.Duration
	// BulkGOMAXPROCS is GOMAXPROCS while an Archive or Restore runs, when
	// it is above the count at the time: their compression and file work
	// overlap on a second P. 0 leaves GOMAXPROCS alone.
	BulkGOMAXPROCS int
	// Daemon holds the workspace, process and limit settings.
	Daemon agentd.Config
}

// MinTokenBytes is the shortest token the daemon accepts.
const MinTokenBytes = 16

// maxTokenBytes bounds what is read from a token file or descriptor.
const maxTokenBytes = 4096

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{TokenFD: -1, ShutdownTimeout: 10 * time.Second, ReclaimIdle: DefaultReclaimIdle, ReclaimGrowth: DefaultReclaimGrowth,
		MaxConnections: DefaultMaxConnections, HandshakeTimeout: DefaultHandshakeTimeout, Daemon: agentd.DefaultConfig()}
}

// Validate checks the configuration without touching the token source.
func (c *Config) Validate() error {
	if len(c.Listen) == 0 {
		return errors.New("no --listen address")
	}
	for _, l := range c.Listen {
		if _, _, err := parseListen(l); err != nil {
			return err
		}
	}
	sources := 0
	if c.TokenFile != "" {
		sources++
	}
	if c.TokenFD >= 0 {
		sources++
		if c.TokenFD < 3 {
			return fmt.Errorf("--token-fd %d: must be an inherited descriptor >= 3", c.TokenFD)
		}
	}
	switch {
	case sources > 1:
		return errors.New("give either --token-file or --token-fd, not both")
	case sources == 0 && !c.InsecureNoAuth:
		return errors.New("no token configured: give --token-file or --token-fd (or --insecure-no-auth for local development)")
	case sources == 1 && c.InsecureNoAuth:
		return errors.New("--insecure-no-auth contradicts a configured token")
	}
	if c.MetricsListen != "" {
		if _, _, err := parseMetricsListen(c.MetricsListen); err != nil {
			return err
		}
	}
	if c.ReclaimIdle < 0 {
		return fmt.Errorf("--reclaim-idle %s: must not be negative", c.ReclaimIdle)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("--max-connections %d: want 0 (no cap) or more", c.MaxConnections)
	}
	if c.HandshakeTimeout <= 0 {
		return fmt.Errorf("--handshake-timeout %s: must be positive", c.HandshakeTimeout)
	}
	if c.ReclaimGrowth < 0 {
		return fmt.Errorf("--reclaim-growth-bytes %d: must not be negative", c.ReclaimGrowth)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if c.ClientCAFile != "" && c.TLSCertFile == "" {
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	return c.Daemon.Validate()
}

// parseListen splits unix:///path or tcp://host:port into a network and address.
func parseListen(s string) (network, address string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", fmt.Errorf("--listen %q: %w", s, err)
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if u.Host != "" { // unix://relative/path
			p = u.Host + u.Path
		}
		if p == "" {
			return "", "", fmt.Errorf("--listen %q: empty socket path", s)
		}
		return "unix", p, nil
	case "tcp":
		if u.Host == "" {
			return "", "", fmt.Errorf("--listen %q: missing host:port", s)
		}
		return "tcp", u.Host, nil
	default:
		return "", "", fmt.Errorf("--listen %q: scheme must be unix:// or tcp://", s)
	}
}

// loadToken reads the token from its file (then removes the file) or from
// the inherited descriptor (then closes it). The token never passes through
// argv or the environment.
func (c *Config) loadToken() ([]byte, error) {
	if c.InsecureNoAuth {
		return nil, nil
	}
	var (
		raw []byte
		err error
	)
	if c.TokenFile != "" {
		raw, err = readBounded(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("read token file: %w", err)
		}
		if err := os.Remove(c.TokenFile); err != nil {
			return nil, fmt.Errorf("remove token file after reading it (the token must not stay readable): %w", err)
		}
	} else {
		f := os.NewFile(uintptr(c.TokenFD), "token-fd")
		if f == nil {
			return nil, fmt.Errorf("--token-fd %d is not open", c.TokenFD)
		}
		raw, err = io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read token from fd %d: %w", c.TokenFD, err)
		}
	}
	token := bytes.TrimSpace(raw)
	if len(raw) > maxTokenBytes {
		return nil, fmt.Errorf("token is longer than %d bytes", maxTokenBytes)
	}
	if len(token) < MinTokenBytes {
		return nil, fmt.Errorf("token is shorter than %d bytes", MinTokenBytes)
	}
	if strings.ContainsAny(string(token), " \t\r\n") {
		return nil, errors.New("token contains whitespace")
	}
	return token, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
}
