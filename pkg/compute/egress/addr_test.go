package egress_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestCheckAddr is the shared address check (the egress proxy's and the
// git fetches'): every address that is not public unicast is refused with
// ErrPermissionDenied, in every IPv6 spelling that carries an IPv4 address.
func TestCheckAddr(t *testing.T) {
	refused := []string{
		// IPv4
		"127.0.0.1", "127.1.2.3", "10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.1.1", "169.254.169.254", "169.254.170.2", "100.100.100.200", "100.64.0.1",
		"0.0.0.0", "0.1.2.3", "224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1",
		"192.0.2.1", "198.18.0.1",
		// IPv6
		"::", "::1", "fe80::1", "fe80::1%eth0", "fc00::1", "fd00::1", "fd00:ec2::254", "ff02::1", "fec0::1",
		"2001:db8::1",
		// IPv4 in IPv6
		"::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:0.0.0.0",
		"::127.0.0.1", "::ffff:0:127.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::808:808",
		"2002:7f00:1::1", "2002:c0a8:101::1", "2001::1",
		// not an address at all
		"",
	}
	for _, s := range refused {
		var a netip.Addr
		if s != "" {
			a = netip.MustParseAddr(s)
		}
		err := egress.CheckAddr(a)
		if !errors.Is(err, errkind.ErrPermissionDenied) {
			t.Errorf("CheckAddr(%s) = %v, want ErrPermissionDenied", s, err)
		}
	}
	public := []string{"8.8.8.8", "140.82.112.3", "1.1.1.1", "::ffff:140.82.112.3", "2606:4700::1111",
		"2a00:1450:4001:80b::200e", "64:ff9b::808:808", "2002:808:808::1"}
	for _, s := range public {
		if err := egress.CheckAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("CheckAddr(%s) = %v, want nil", s, err)
		}
	}
}
