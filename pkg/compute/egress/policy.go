// Package egress is the harness side of a sandbox's network access: a
// forward proxy (HTTP CONNECT and plain absolute-form HTTP) that lets a
// sandbox reach only the domains (and ports) its Policy allows.
//
// A sandbox with egress control has no network of its own (a bubblewrap
// network namespace holding only loopback; a Docker container on network
// "none"). The proxy listens on a unix socket in the sandbox's private run
// directory, which the sandbox sees; sandbox-agentd relays TCP connections
// made to a loopback port inside the sandbox (127.0.0.1:3128) to that
// socket, and gives processes HTTP_PROXY/HTTPS_PROXY pointing there. The
// proxy, outside the sandbox, then decides:
//
//   - the target must be a host name (never an IP literal) allowed by the
//     Policy, on an allowed port;
//   - the name is resolved by the proxy itself, and every address it
//     resolves to must be public: loopback, private, link-local, CGNAT,
//     unique-local, multicast and reserved ranges are refused, and cloud
//     metadata addresses (169.254.169.254, fd00:ec2::254, 100.100.100.200)
//     always are; the connection goes to the checked address, so a second
//     lookup cannot rebind it;
//   - a CONNECT tunnel whose client speaks TLS must name the same host in
//     its ClientHello (SNI); a tunnel to port 443 that does not start with
//     a TLS ClientHello is refused unless Policy.AllowNonTLS443.
//
// Every refusal is logged with the host and the reason, and counted.
package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DefaultPorts are the ports a Rule without ports allows.
var defaultPorts = []int{80, 443}

// DefaultPorts returns the ports a Rule without ports allows (80 and 443).
func DefaultPorts() []int { return slices.Clone(defaultPorts) }

// Rule allows one host name pattern on some ports.
type Rule struct {
	// Host is an exact name ("api.example.com") or a wildcard
	// ("*.example.com": any name below example.com, not example.com
	// itself). Lower case, no trailing dot once normalized.
	Host string `json:"host"`
	// Ports are the allowed ports; empty means 80 and 443.
	Ports []int `json:"ports,omitempty"`
}

// Policy is the list of destinations a sandbox may reach. The zero Policy
// allows nothing.
type Policy struct {
	// Allow lists the allowed destinations.
	Allow []Rule `json:"allow"`
	// AllowNonTLS443 lets CONNECT tunnels to port 443 carry something
	// other than TLS (then no SNI is checked). Off by default: on 443 the
	// ClientHello's server name is what ties the tunnel to the allowed
	// name.
	AllowNonTLS443 bool `json:"allow_non_tls_443,omitempty"`
}

// ParseRule reads "host", "host:port" or "*.domain[:port]" (the CLI's
// --allow-domain). Without a port the rule allows 80 and 443.
func ParseRule(s string) (Rule, error) {
	host, portStr := s, ""
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, portStr = s[:i], s[i+1:]
	}
	r := Rule{Host: host}
	if portStr != "" || strings.HasSuffix(s, ":") {
		port, err := strconv.Atoi(portStr)
		if err != nil || port < 1 || port > 65535 {
			return Rule{}, fmt.Errorf("egress rule %q: port %q is not a number in 1-65535", s, portStr)
		}
		r.Ports = []int{port}
	}
	if err := r.normalize(); err != nil {
		return Rule{}, fmt.Errorf("egress rule %q: %w", s, err)
	}
	return r, nil
}

// ParsePolicy builds a policy from rules as ParseRule reads them.
func ParsePolicy(rules []string) (Policy, error) {
	var p Policy
	for _, s := range rules {
		r, err := ParseRule(s)
		if err != nil {
			return Policy{}, err
		}
		p.Allow = append(p.Allow, r)
	}
	return p, nil
}

// Validate checks every rule: a valid host name or wildcard (no IP
// literal, no bare "*" or "*.tld"), ports in 1-65535.
func (p Policy) Validate() error {
	for _, r := range p.Allow {
		c := r
		c.Ports = slices.Clone(r.Ports)
		if err := c.normalize(); err != nil {
			return fmt.Errorf("egress rule %q: %w", r.Host, err)
		}
	}
	return nil
}

// Normalized returns a copy of p with every rule normalized (lower case,
// no trailing dot, ports sorted), or an error if one is invalid.
func (p Policy) Normalized() (Policy, error) {
	out := Policy{AllowNonTLS443: p.AllowNonTLS443}
	for _, r := range p.Allow {
		c := Rule{Host: r.Host, Ports: slices.Clone(r.Ports)}
		if err := c.normalize(); err != nil {
			return Policy{}, fmt.Errorf("egress rule %q: %w", r.Host, err)
		}
		out.Allow = append(out.Allow, c)
	}
	return out, nil
}

// Allows reports whether host (a name, normalized or not) on port is
// allowed. IP literals are never allowed.
func (p Policy) Allows(host string, port int) bool {
	host, err := normalizeHost(host)
	if err != nil {
		return false
	}
	for _, r := range p.Allow {
		ports := r.Ports
		if len(ports) == 0 {
			ports = defaultPorts
		}
		if !slices.Contains(ports, port) {
			continue
		}
		pattern := strings.TrimSuffix(strings.ToLower(r.Host), ".")
		if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
			if strings.HasSuffix(host, "."+suffix) {
				return true
			}
		} else if host == pattern {
			return true
		}
	}
	return false
}

// String is the policy as --allow-domain flags would spell it.
func (p Policy) String() string {
	var parts []string
	for _, r := range p.Allow {
		if len(r.Ports) == 0 {
			parts = append(parts, r.Host)
			continue
		}
		for _, port := range r.Ports {
			parts = append(parts, r.Host+":"+strconv.Itoa(port))
		}
	}
	return strings.Join(parts, ",")
}

// Marshal returns the policy as JSON (what providers record with a
// sandbox, so that a later harness enforces the same policy).
func (p Policy) Marshal() ([]byte, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode egress policy: %w", err)
	}
	return data, nil
}

// UnmarshalPolicy reads a policy Marshal wrote and validates it.
func UnmarshalPolicy(data []byte) (Policy, error) {
	var p Policy
	if err := json.Unmarshal(data, &p); err != nil {
		return Policy{}, fmt.Errorf("decode egress policy: %w", err)
	}
	return p.Normalized()
}

func (r *Rule) normalize() error {
	pattern := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(r.Host)), ".")
	name, wildcard := strings.CutPrefix(pattern, "*.")
	if _, err := normalizeHost(name); err != nil {
		return err
	}
	if wildcard && !strings.Contains(name, ".") {
		return fmt.Errorf("a wildcard must name a domain below a top-level domain (*.example.com, not *.%s)", name)
	}
	for _, port := range r.Ports {
		if port < 1 || port > 65535 {
			return fmt.Errorf("port %d is not in 1-65535", port)
		}
	}
	slices.Sort(r.Ports)
	r.Ports = slices.Compact(r.Ports)
	r.Host = pattern
	return nil
}

// normalizeHost lower-cases a host name, drops a trailing dot and checks
// that it is a DNS name: letters, digits, '-' and '_' in dot-separated
// labels of 1-63 characters, at most 253 in all, and not an IP address in
// any spelling (a literal, or a name whose last label is numeric, such as
// "127.1", which some resolvers read as an address).
func normalizeHost(h string) (string, error) {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "" {
		return "", fmt.Errorf("empty host name")
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return "", errIPLiteral
	}
	if len(h) > 253 {
		return "", fmt.Errorf("host name longer than 253 characters")
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("host name %q has an empty or over-long label", h)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("host name %q has a character other than letters, digits, '-' and '_'", h)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return "", errIPLiteral
	}
	return h, nil
}

// errIPLiteral refuses addresses given as such.
var errIPLiteral = errors.New("an IP address, not a host name (only names can be allowed)")
