package docker

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/egresstest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// TestEgressThroughTheProxy: a container on network "none" reaches an
// allowed name (a loopback test server on the host stands in for it) only
// through the daemon's relay and the harness's proxy; other names, IP
// addresses and the metadata address are refused, and direct connections
// go nowhere.
func TestEgressThroughTheProxy(t *testing.T) {
	needDocker(t)
	client := egresstest.Client(t)

	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s%s", r.Host, r.URL.Path) })
	hs := httptest.NewServer(h)
	defer hs.Close()
	ts := httptest.NewTLSServer(h)
	defer ts.Close()
	httpPort, tlsPort := hs.Listener.Addr().(*net.TCPAddr).Port, ts.Listener.Addr().(*net.TCPAddr).Port
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}

	p := newProvider(t, func(c *Config) {
		c.Egress = &egress.Options{
			Policy:     egress.Policy{Allow: []egress.Rule{{Host: "allowed.test", Ports: []int{httpPort, tlsPort}}}},
			Resolver:   egresstest.Resolver{"allowed.test": loop, "other.test": loop},
			AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		}
	})
	sb := launch(t, p, compute.LaunchSpec{})
	ctx := testCtx(t)
	ac := sb.Agent()
	if _, err := ac.WriteFile(ctx, "netclient", compute.WriteFileOptions{Mode: 0o755}, bytes.NewReader(client)); err != nil {
		t.Fatal(err)
	}
	sh := func(command string) (string, int) {
		t.Helper()
		res, err := ac.Exec(ctx, compute.ProcessSpec{Argv: []string{"/bin/sh", "-c", command}}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("%s: %v", command, err)
		}
		return strings.TrimSpace(string(res.Stdout) + string(res.Stderr)), res.Exit.ExitCode
	}
	if out, _ := sh("echo $HTTPS_PROXY"); out != "http://"+EgressRelayAddr {
		t.Errorf("HTTPS_PROXY inside: %q", out)
	}
	for _, u := range []string{"http://allowed.test:" + strconv.Itoa(httpPort) + "/plain", "https://allowed.test:" + strconv.Itoa(tlsPort) + "/tls"} {
		if out, code := sh("./netclient get " + u); code != 0 || !strings.HasPrefix(out, "status 200: hello allowed.test") {
			t.Errorf("allowed %s: exit %d: %s", u, code, out)
		}
	}
	for _, u := range []string{"http://other.test:" + strconv.Itoa(httpPort) + "/", "http://93.184.215.14/", "http://169.254.169.254/latest/meta-data/"} {
		if out, _ := sh("./netclient get " + u); !strings.Contains(out, "403") {
			t.Errorf("refused %s: %s", u, out)
		}
	}
	for _, addr := range []string{"127.0.0.1:" + strconv.Itoa(httpPort), "93.184.215.14:80", "169.254.169.254:80"} {
		if out, code := sh("./netclient dial " + addr); code == 0 {
			t.Errorf("direct connect to %s succeeded: %s", addr, out)
		}
	}
	if st, ok := p.EgressStats(mustDecode(t, mustState(t, sb))); !ok || st.Allowed < 2 || st.Denied < 3 {
		t.Errorf("proxy stats %+v (serving %v)", st, ok)
	}
}

// TestEgressNeedsNetworkNone: a network other than "none" would give the
// container a way around the proxy.
func TestEgressNeedsNetworkNone(t *testing.T) {
	_, err := New(Config{StateDir: t.TempDir(), Network: "bridge", Egress: &egress.Options{}}, nil)
	if err == nil || !strings.Contains(err.Error(), "none") {
		t.Fatalf("New with network bridge and an allow list: %v", err)
	}
	p, err := New(Config{StateDir: t.TempDir(), Egress: &egress.Options{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.cfg.settings(&CreateOptions{Network: "host"}); err == nil {
		t.Fatal("a per-sandbox network override was accepted with an allow list")
	}
}
