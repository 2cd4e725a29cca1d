package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/bulkhead-dev/bulkhead/internal/testing/egresstest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// TestEgressThroughBubblewrap: a command in a bubblewrap sandbox reaches
// an allowed name (a loopback test server on the host stands in for it)
// through the daemon's relay and the harness's proxy, over plain HTTP and
// over TLS; other names, IP addresses and the metadata address are
// refused by the proxy (and logged with the host); connecting directly
// goes nowhere, as the sandbox's network namespace holds only loopback.
func TestEgressThroughBubblewrap(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	client := egresstest.Client(t)

	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s%s", r.Host, r.URL.Path) })
	hs := httptest.NewServer(h)
	defer hs.Close()
	ts := httptest.NewTLSServer(h)
	defer ts.Close()
	httpPort, tlsPort := hs.Listener.Addr().(*net.TCPAddr).Port, ts.Listener.Addr().(*net.TCPAddr).Port

	core, logs := observer.New(zap.InfoLevel)
	stateDir := t.TempDir()
	for d := stateDir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	p, err := New(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: IsolationBubblewrap,
		Egress: &egress.Options{
			Policy:     egress.Policy{Allow: []egress.Rule{{Host: "allowed.test", Ports: []int{httpPort, tlsPort}}}},
			Resolver:   egresstest.Resolver{"allowed.test": loop, "other.test": loop},
			AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		}}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := compute.NewClient(p, compute.ClientOptions{Log: zap.New(core)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Agent().WriteFile(ctx, "netclient", compute.WriteFileOptions{Mode: 0o755}, bytes.NewReader(client)); err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) (string, int) {
		t.Helper()
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: cmd}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return strings.TrimSpace(string(res.Stdout) + string(res.Stderr)), res.Exit.ExitCode
	}

	if out, _ := run("echo $HTTPS_PROXY $http_proxy"); out != "http://"+EgressRelayAddr+" http://"+EgressRelayAddr {
		t.Errorf("proxy environment inside the sandbox: %q", out)
	}
	for _, u := range []string{
		"http://allowed.test:" + strconv.Itoa(httpPort) + "/plain",
		"https://allowed.test:" + strconv.Itoa(tlsPort) + "/tls",
	} {
		out, code := run("./netclient get " + u)
		if code != 0 || !strings.HasPrefix(out, "status 200: hello allowed.test") {
			t.Errorf("allowed %s from inside: exit %d: %s", u, code, out)
		}
	}
	for _, u := range []string{
		"http://other.test:" + strconv.Itoa(httpPort) + "/",
		"https://other.test:" + strconv.Itoa(tlsPort) + "/",
		"http://93.184.215.14/",
		"http://169.254.169.254/latest/meta-data/",
		"https://169.254.169.254/",
	} {
		out, _ := run("./netclient get " + u)
		if strings.Contains(out, "status 200") || !(strings.Contains(out, "403") || strings.Contains(out, "Forbidden")) {
			t.Errorf("refused %s from inside: %s", u, out)
		}
	}
	// Around the proxy: no route anywhere (the host's loopback server is
	// not the sandbox's loopback, and there is no other interface).
	for _, addr := range []string{"127.0.0.1:" + strconv.Itoa(httpPort), "93.184.215.14:80", "169.254.169.254:80", "10.0.0.1:80"} {
		if out, code := run("./netclient dial " + addr); code == 0 {
			t.Errorf("direct connect to %s from inside succeeded: %s", addr, out)
		}
	}

	denied := map[string]bool{}
	for _, e := range logs.FilterMessage("egress denied").All() {
		host, _ := e.ContextMap()["host"].(string)
		denied[host] = true
	}
	for _, h := range []string{"other.test", "93.184.215.14", "169.254.169.254"} {
		if !denied[h] {
			t.Errorf("no denial of %s logged; denials: %v", h, denied)
		}
	}
	if stats, ok := p.EgressStats(filepath.Join(stateDir, s.ID())); !ok || stats.Allowed < 2 || stats.Denied < 5 {
		t.Errorf("proxy stats %+v (serving %v)", stats, ok)
	}

	// The harness goes away: the sandbox's way out fails, closed.
	allowed := "./netclient get http://allowed.test:" + strconv.Itoa(httpPort) + "/again"
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if out, code := run(allowed); code == 0 && strings.Contains(out, "status 200") {
		t.Errorf("reached the allowed name with no harness serving the proxy: %s", out)
	}
	// A later harness resumes the sandbox and serves the policy recorded
	// with it (its own configuration allows nothing).
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	p2, err := New(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: IsolationBubblewrap,
		Egress: &egress.Options{Resolver: egresstest.Resolver{"allowed.test": loop, "other.test": loop},
			AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	s2, err := compute.NewClient(p2, compute.ClientOptions{Log: zap.New(core)}).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	s = s2
	if out, code := run(allowed); code != 0 || !strings.HasPrefix(out, "status 200") {
		t.Errorf("allowed name after resume: exit %d: %s", code, out)
	}
	if out, _ := run("./netclient get http://other.test:" + strconv.Itoa(httpPort) + "/"); !strings.Contains(out, "403") {
		t.Errorf("other name after resume: %s", out)
	}
}

// TestEgressRefusedWithoutIsolation: a plain local sandbox has the host's
// network, so an allow list cannot be enforced there and is refused.
func TestEgressRefusedWithoutIsolation(t *testing.T) {
	_, err := New(Config{StateDir: t.TempDir(), AgentdPath: agentdBin, Isolation: IsolationNone,
		Egress: &egress.Options{Policy: egress.Policy{Allow: []egress.Rule{{Host: "example.com"}}}}}, zap.NewNop())
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "bubblewrap") {
		t.Fatalf("New with isolation none and an allow list: %v", err)
	}
	if _, lerr := exec.LookPath("bwrap"); lerr == nil {
		_, err = New(Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: agentdBin, Isolation: IsolationBubblewrap, Network: true,
			Egress: &egress.Options{}}, zap.NewNop())
		if !errors.Is(err, compute.ErrInvalidArgument) {
			t.Fatalf("New with Network and an allow list: %v", err)
		}
	}
}
