package egress

import (
	"net/netip"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// metadataAddrs are cloud instance metadata services: refused always, even
// when Options.AllowAddrs would let their range through.
var metadataAddrs = [...]netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
}

// blockedPrefixes are ranges a sandbox never reaches through the proxy:
// the host itself, private networks, link-local (metadata lives there),
// shared address space, and ranges that are not public unicast.
var blockedPrefixes = [...]struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated)"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "IPv4-translated"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64"},
	{netip.MustParsePrefix("100::/64"), "discard"},
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (private)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// Prefixes whose IPv6 addresses embed an IPv4 address that decides.
var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
)

// CheckAddr reports whether the harness may connect to a on behalf of a
// sandbox or a tenant: nil for a public unicast address, otherwise an error
// of kind errkind.ErrPermissionDenied saying why. Refused are loopback,
// private, link-local, shared (CGNAT), unique-local, multicast, reserved,
// documentation and unspecified addresses, cloud metadata addresses
// (169.254.169.254, fd00:ec2::254, ...), and IPv6 addresses that map or
// embed an IPv4 address of those kinds (::ffff:127.0.0.1, NAT64, 6to4).
//
// It is the one address check of the harness: the egress proxy applies it
// (with its test-only Options.AllowAddrs exemptions) to every address a
// sandbox's destination resolves to, and package materializer to the
// addresses of the git hosts of untrusted manifests.
func CheckAddr(a netip.Addr) error {
	if why := blockedReason(a, nil); why != "" {
		return errkind.Errorf(errkind.ErrPermissionDenied, "%s is not a public address: %s", a.Unmap(), why)
	}
	return nil
}

// blockedReason says why a sandbox may not reach a, or "" when it may.
// allow lists ranges exempt from the private-range rules (tests use
// loopback); metadata addresses are refused regardless.
func blockedReason(a netip.Addr, allow []netip.Prefix) string {
	a = a.Unmap().WithZone("")
	for _, m := range metadataAddrs {
		if a == m {
			return "cloud metadata address"
		}
	}
	// Embedded IPv4 (NAT64, 6to4) is judged as that IPv4 address.
	if a.Is6() && (nat64Prefix.Contains(a) || sixToFour.Contains(a)) {
		b := a.As16()
		var v4 [4]byte
		if nat64Prefix.Contains(a) {
			copy(v4[:], b[12:16])
		} else {
			copy(v4[:], b[2:6])
		}
		if why := blockedReason(netip.AddrFrom4(v4), allow); why != "" {
			return why + " (embedded in " + a.String() + ")"
		}
	}
	for _, p := range allow {
		if p.Contains(a) {
			return ""
		}
	}
	for _, b := range blockedPrefixes {
		if b.prefix.Contains(a) {
			return b.why
		}
	}
	if !a.IsGlobalUnicast() {
		return "not a global unicast address"
	}
	return ""
}
