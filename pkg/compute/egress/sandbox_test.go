package egress_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// TestRelayArgsParsedByTheDaemon: the flags RelayArgs makes are the ones
// sandbox-agentd takes (--egress-relay), relaying RelayAddr to the socket.
func TestRelayArgsParsedByTheDaemon(t *testing.T) {
	args := egress.RelayArgs("/run/bulkhead/" + egress.SocketName)
	if len(args) != 2 || args[0] != "--egress-relay" {
		t.Fatalf("RelayArgs = %q, want --egress-relay and its value", args)
	}
	r, err := agentd.ParseEgressRelay(args[1])
	if err != nil {
		t.Fatal(err)
	}
	if r.Listen != egress.RelayAddr || r.Socket != "/run/bulkhead/egress.sock" {
		t.Errorf("the daemon reads %+v", r)
	}
}

// TestRelayPortIsRelayAddrs: the port the service never exposes is the
// one the relay listens on.
func TestRelayPortIsRelayAddrs(t *testing.T) {
	_, port, err := net.SplitHostPort(egress.RelayAddr)
	if err != nil || port != strconv.Itoa(egress.RelayPort) {
		t.Fatalf("RelayAddr %q, RelayPort %d", egress.RelayAddr, egress.RelayPort)
	}
}
