package egresstest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// Servers are an HTTP and an HTTPS server on the host's loopback that a
// sandbox reaches as allowed.test (other.test points at them too, and is
// refused). Each answers "hello HOST PATH".
type Servers struct {
	HTTPPort, TLSPort int
}

// StartServers starts the servers, closed when the test ends.
func StartServers(t testing.TB) *Servers {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s%s", r.Host, r.URL.Path) })
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	return &Servers{HTTPPort: hs.Listener.Addr().(*net.TCPAddr).Port, TLSPort: ts.Listener.Addr().(*net.TCPAddr).Port}
}

// Options are the egress options of a sandbox that may reach allowed.test
// on the servers' ports and nothing else (other.test resolves, and is
// refused).
func (s *Servers) Options() *egress.Options {
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	return &egress.Options{
		Policy:     egress.Policy{Allow: []egress.Rule{{Host: "allowed.test", Ports: []int{s.HTTPPort, s.TLSPort}}}},
		Resolver:   Resolver{"allowed.test": loop, "other.test": loop},
		AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	}
}

// clientCase is one command of an HTTP client and what it must show.
type clientCase struct {
	cmd     string
	ok      bool     // exit 0 (else non-zero)
	contain []string // in its stdout and stderr
}

// clientCases are the commands CheckHTTPClients runs for each client: a
// fetch of allowed.test over HTTP and over HTTPS (a CONNECT tunnel) that
// succeeds, and of other.test that fails showing the proxy's refusal: its
// 403 and the reason in the X-Bulkhead-Egress-Denied header where the
// client shows a refusal's headers.
func (s *Servers) clientCases(client string) []clientCase {
	allowed, allowedTLS := "http://allowed.test:"+strconv.Itoa(s.HTTPPort), "https://allowed.test:"+strconv.Itoa(s.TLSPort)
	other, otherTLS := "http://other.test:"+strconv.Itoa(s.HTTPPort), "https://other.test:"+strconv.Itoa(s.TLSPort)
	denied := egress.DeniedHeader + ": not in the allow list"
	switch client {
	case "wget":
		return []clientCase{
			// -T: busybox's wget applet died of SIGSEGV on it.
			{"wget -q -T 10 -O- " + allowed + "/wget", true, []string{"hello allowed.test:" + strconv.Itoa(s.HTTPPort) + "/wget"}},
			{"wget -q -T 10 --no-check-certificate -O- " + allowedTLS + "/wget-tls", true, []string{"hello allowed.test:" + strconv.Itoa(s.TLSPort) + "/wget-tls"}},
			{"wget -S -T 10 -O- " + other + "/", false, []string{"403 Forbidden", denied}},
			{"wget -T 10 --no-check-certificate -O- " + otherTLS + "/", false, []string{"Forbidden"}},
		}
	case "curl":
		return []clientCase{
			{"curl -sS -m 10 " + allowed + "/curl", true, []string{"hello allowed.test:" + strconv.Itoa(s.HTTPPort) + "/curl"}},
			{"curl -sS -m 10 -k " + allowedTLS + "/curl-tls", true, []string{"hello allowed.test:" + strconv.Itoa(s.TLSPort) + "/curl-tls"}},
			{"curl -sS -m 10 -i --fail-with-body " + other + "/", false, []string{"HTTP/1.1 403 Forbidden", denied, "egress proxy: not in the allow list"}},
			{"curl -sS -m 10 -v -k " + otherTLS + "/", false, []string{"CONNECT tunnel failed, response 403", "< " + denied}},
		}
	}
	panic("egresstest: no cases for HTTP client " + client)
}

// CheckHTTPClients runs each client (wget, curl) in a sandbox served by
// s's Options, through sh (a shell command line: its combined output and
// exit code), the way an agent would: through HTTP_PROXY and HTTPS_PROXY to
// the harness's egress proxy.
func (s *Servers) CheckHTTPClients(t testing.TB, sh func(cmd string) (string, int), clients ...string) {
	t.Helper()
	for _, client := range clients {
		for _, c := range s.clientCases(client) {
			out, code := sh(c.cmd)
			if (code == 0) != c.ok {
				t.Errorf("%s: exit %d (want %s)\n%s", c.cmd, code, map[bool]string{true: "0", false: "non-zero"}[c.ok], out)
				continue
			}
			for _, want := range c.contain {
				if !strings.Contains(out, want) {
					t.Errorf("%s: exit %d; the output lacks %q:\n%s", c.cmd, code, want, out)
				}
			}
		}
	}
}
