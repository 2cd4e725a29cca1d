package docker

import (
	"net/netip"
	"testing"

	"github.com/moby/moby/api/types/network"
)

// TestContainerConfigPorts: published ports become the Engine API's exposed
// ports and bindings, on 127.0.0.1 unless a host address is given, tcp
// unless udp is asked for. No Docker needed.
func TestContainerConfigPorts(t *testing.T) {
	c, err := Config{StateDir: "/tmp/x", Network: "bridge", PublishedPorts: []PortBinding{
		{ContainerPort: 8080},
		{ContainerPort: 53, Protocol: "udp", HostIP: "::1", HostPort: 5353},
	}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.settings(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &Provider{cfg: c}
	ccfg, hcfg := p.containerConfig(set, "/workspace", p.privateDir("k"), "", map[string]string{})
	web, dns := network.MustParsePort("8080/tcp"), network.MustParsePort("53/udp")
	if len(ccfg.ExposedPorts) != 2 {
		t.Fatalf("exposed ports %v", ccfg.ExposedPorts)
	}
	for _, port := range []network.Port{web, dns} {
		if _, ok := ccfg.ExposedPorts[port]; !ok {
			t.Errorf("%s not exposed: %v", port, ccfg.ExposedPorts)
		}
	}
	if b := hcfg.PortBindings[web]; len(b) != 1 || b[0].HostIP != netip.MustParseAddr("127.0.0.1") || b[0].HostPort != "" {
		t.Errorf("8080/tcp bindings %+v", b)
	}
	if b := hcfg.PortBindings[dns]; len(b) != 1 || b[0].HostIP != netip.MustParseAddr("::1") || b[0].HostPort != "5353" {
		t.Errorf("53/udp bindings %+v", b)
	}
}
