// Package remote is the compute provider for sandboxes started by someone
// else: a sandbox-agentd already serving at an address (a VM, a pod, a
// container another system runs), reached with a token and optionally TLS
// or mTLS.
//
// The provider never creates, stops or deletes a sandbox. Launch and
// Reattach connect (after a health check that says clearly what failed),
// Destroy only forgets, and List reports the one configured sandbox.
// Session states record the address and nothing else: the token and the
// TLS material always come from the Config of the harness that resumes, and
// are only ever sent to the configured address.
package remote

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// ProviderName is the provider's name in session states.
const ProviderName = "remote"

// DefaultConnectTimeout bounds a connect's health check when
// Config.ConnectTimeout is zero.
const DefaultConnectTimeout = 10 * time.Second

// Config says where the sandbox is and how to authenticate to it.
type Config struct {
	// Address is the daemon's address: unix:///path/to.sock or
	// tcp://host:port.
	Address string
	// Token is the daemon's bearer token. Exactly one of Token and
	// TokenFile is set.
	Token string
	// TokenFile holds the token (surrounding white space is ignored). It
	// is read at every connect, so a rotated token is picked up.
	TokenFile string
	// TLS, when set, secures a tcp:// connection (and is required for one
	// to a host that is not a loopback address, unless InsecurePlaintext).
	TLS *TLSConfig
	// InsecurePlaintext allows sending the token without TLS to a host that
	// is not a loopback address (a trusted private network only).
	InsecurePlaintext bool
	// ConnectTimeout bounds each connect and health check (default
	// DefaultConnectTimeout).
	ConnectTimeout time.Duration
}

// TLSConfig is the TLS material for a tcp:// address, as PEM files.
type TLSConfig struct {
	// CAFile holds the certificate authorities that sign the daemon's
	// certificate; "" means the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and key presented to
	// a daemon that requires mTLS; both or neither.
	CertFile, KeyFile string
	// ServerName is the name the daemon's certificate must carry; "" means
	// the address's host.
	ServerName string
}

// endpoint is a parsed, validated Address.
type endpoint struct {
	network string // "unix" or "tcp"
	addr    string // socket path or host:port
}

func (e endpoint) String() string { return e.network + "://" + e.addr }

// parseAddress validates an address: unix:///abs/path or tcp://host:port.
func parseAddress(address string) (endpoint, error) {
	if address == "" {
		return endpoint{}, fmt.Errorf("%w: remote provider: no address", compute.ErrInvalidArgument)
	}
	u, err := url.Parse(address)
	if err != nil {
		return endpoint{}, fmt.Errorf("%w: remote provider: address %q: %v", compute.ErrInvalidArgument, address, err)
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if u.Host != "" {
			p = u.Host + u.Path
		}
		if !strings.HasPrefix(p, "/") {
			return endpoint{}, fmt.Errorf("%w: remote provider: address %q: the socket path must be absolute", compute.ErrInvalidArgument, address)
		}
		return endpoint{network: "unix", addr: p}, nil
	case "tcp":
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || host == "" || port == "" || (u.Path != "" && u.Path != "/") {
			return endpoint{}, fmt.Errorf("%w: remote provider: address %q: want tcp://host:port", compute.ErrInvalidArgument, address)
		}
		return endpoint{network: "tcp", addr: u.Host}, nil
	}
	return endpoint{}, fmt.Errorf("%w: remote provider: address %q: the scheme must be unix:// or tcp://", compute.ErrInvalidArgument, address)
}

// validate checks a Config without touching the network.
func (c Config) validate() (endpoint, error) {
	ep, err := parseAddress(c.Address)
	if err != nil {
		return ep, err
	}
	switch {
	case c.Token != "" && c.TokenFile != "":
		return ep, fmt.Errorf("%w: remote provider: set Token or TokenFile, not both", compute.ErrInvalidArgument)
	case c.Token == "" && c.TokenFile == "":
		return ep, fmt.Errorf("%w: remote provider: no Token or TokenFile for %s", compute.ErrInvalidArgument, ep)
	}
	if c.TLS != nil {
		if ep.network != "tcp" {
			return ep, fmt.Errorf("%w: remote provider: TLS is for tcp:// addresses, not %s", compute.ErrInvalidArgument, ep)
		}
		if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
			return ep, fmt.Errorf("%w: remote provider: a client certificate needs both CertFile and KeyFile", compute.ErrInvalidArgument)
		}
	}
	if ep.network == "tcp" && c.TLS == nil && !c.InsecurePlaintext && !isLoopback(ep.addr) {
		return ep, fmt.Errorf("%w: remote provider: %s is not a loopback address: set TLS (or InsecurePlaintext to send the token in clear text)", compute.ErrInvalidArgument, ep)
	}
	return ep, nil
}

// isLoopback reports whether host:port names the loopback interface.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// token returns the bearer token, reading TokenFile when set.
func (c Config) token() (string, error) {
	if c.TokenFile == "" {
		return c.Token, nil
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return "", fmt.Errorf("%w: remote provider: read token file: %v", compute.ErrInvalidArgument, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%w: remote provider: token file %s is empty", compute.ErrInvalidArgument, c.TokenFile)
	}
	return tok, nil
}

// tlsConfig builds the client TLS configuration (nil without TLS).
func (c Config) tlsConfig(ep endpoint) (*tls.Config, error) {
	if c.TLS == nil {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLS.ServerName}
	if tc.ServerName == "" {
		host, _, _ := net.SplitHostPort(ep.addr)
		tc.ServerName = host
	}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: remote provider: read CA file: %v", compute.ErrInvalidArgument, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: remote provider: CA file %s holds no PEM certificate", compute.ErrInvalidArgument, c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: remote provider: client certificate: %v", compute.ErrInvalidArgument, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
