package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRuleAndAllows(t *testing.T) {
	p, err := ParsePolicy([]string{"API.Example.com.", "*.pkg.dev:8443", "git.example.org:22"})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.String(); got != "api.example.com,*.pkg.dev:8443,git.example.org:22" {
		t.Errorf("String() = %q", got)
	}
	cases := []struct {
		host string
		port int
		want bool
	}{
		{"api.example.com", 443, true},
		{"API.EXAMPLE.COM.", 80, true},
		{"api.example.com", 8080, false},
		{"x.api.example.com", 443, false},
		{"example.com", 443, false},
		{"a.pkg.dev", 8443, true},
		{"a.b.pkg.dev", 8443, true},
		{"pkg.dev", 8443, false},
		{"a.pkg.dev", 443, false},
		{"evilpkg.dev", 8443, false},
		{"git.example.org", 22, true},
		{"git.example.org", 443, false},
		{"1.2.3.4", 443, false},
	}
	for _, c := range cases {
		if got := p.Allows(c.host, c.port); got != c.want {
			t.Errorf("Allows(%q, %d) = %v, want %v", c.host, c.port, got, c.want)
		}
	}
	for _, bad := range []string{"", "*", "*.com", "1.2.3.4", "[::1]:443", "127.1", "a..b", "host:0", "host:99999", "host:", "ex ample.com", "0x7f000001"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
	data, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalPolicy(data)
	if err != nil || back.String() != p.String() {
		t.Errorf("round trip: %v %v", back, err)
	}
	if _, err := UnmarshalPolicy([]byte(`{"allow":[{"host":"10.0.0.1"}]}`)); err == nil {
		t.Error("a recorded policy allowing an IP was accepted")
	}
}

func TestBlockedReason(t *testing.T) {
	loop := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fc00::/7")}
	cases := []struct {
		addr    string
		allow   []netip.Prefix
		blocked string // substring of the reason; "" means allowed
	}{
		{"93.184.215.14", nil, ""},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", nil, ""},
		{"127.0.0.1", nil, "loopback"},
		{"10.0.0.1", nil, "private"},
		{"172.20.0.1", nil, "private"},
		{"192.168.1.1", nil, "private"},
		{"100.64.0.1", nil, "CGNAT"},
		{"169.254.1.1", nil, "link-local"},
		{"169.254.169.254", nil, "metadata"},
		{"169.254.169.254", loop, "metadata"},
		{"fd00:ec2::254", loop, "metadata"},
		{"100.100.100.200", nil, "metadata"},
		{"::ffff:169.254.169.254", nil, "metadata"},
		{"::ffff:10.0.0.1", nil, "private"},
		{"64:ff9b::a9fe:a9fe", nil, "metadata"},
		{"2002:0a00:0001::", nil, "private"},
		{"::1", nil, "loopback"},
		{"fe80::1", nil, "link-local"},
		{"fd12::1", nil, "unique local"},
		{"0.0.0.0", nil, "unspecified"},
		{"224.0.0.1", nil, "multicast"},
		{"255.255.255.255", nil, "reserved"},
		{"127.0.0.1", loop, ""},
	}
	for _, c := range cases {
		got := blockedReason(netip.MustParseAddr(c.addr), c.allow)
		if (c.blocked == "") != (got == "") || !strings.Contains(got, c.blocked) {
			t.Errorf("blockedReason(%s, %v) = %q, want %q", c.addr, c.allow, got, c.blocked)
		}
	}
}
