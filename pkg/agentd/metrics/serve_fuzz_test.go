package metrics

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// conn is a request to read and a buffer for the answer.
type conn struct {
	io.Reader
	out bytes.Buffer
}

func (c *conn) Write(p []byte) (int, error) { return c.out.Write(p) }

// FuzzServeConn feeds arbitrary bytes to the responder: whatever arrives, it
// answers with one well-formed HTTP/1.1 response that net/http can read, and
// serves the metrics only for a GET or HEAD of the metrics path.
func FuzzServeConn(f *testing.F) {
	for _, seed := range []string{
		"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
		"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n",
		"POST /metrics HTTP/1.1\r\n\r\n",
		"GET /other HTTP/1.1\r\n\r\n",
		"GET /metrics HTTP/2.0\r\n\r\n",
		"GET /metrics\r\n\r\n",
		"\r\n",
		"",
		"GET /metrics HTTP/1.1\r\n" + strings.Repeat("X-A: b\r\n", 2000),
	} {
		f.Add([]byte(seed))
	}
	s := New("fuzz", func() int { return 0 })
	f.Fuzz(func(t *testing.T, req []byte) {
		c := &conn{Reader: bytes.NewReader(req)}
		if err := s.serveConn(c, "/metrics"); err != nil {
			t.Fatalf("serveConn: %v", err)
		}
		line, _, _ := strings.Cut(string(req), "\n")
		var asked *http.Request
		if strings.HasPrefix(line, "HEAD ") {
			asked = &http.Request{Method: http.MethodHead}
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(c.out.Bytes())), asked)
		if err != nil {
			t.Fatalf("answer is not HTTP: %v\n%q", err, c.out.Bytes())
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading body: %v", err)
		}
		if resp.StatusCode == http.StatusOK {
			if !strings.HasPrefix(line, "GET /metrics") && !strings.HasPrefix(line, "HEAD /metrics") {
				t.Fatalf("200 for %q", line)
			}
			if strings.HasPrefix(line, "GET") && !bytes.Contains(body, []byte("bulkhead_agentd_")) {
				t.Fatalf("200 without metrics: %q", body)
			}
		}
	})
}
