package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits of the responder.
const (
	// maxRequestBytes bounds a request's line and headers.
	maxRequestBytes = 8 << 10
	// connTimeout bounds a connection, from accept to the last byte.
	connTimeout = 10 * time.Second
	// maxConns bounds the connections served at once; more wait in the
	// listener's backlog.
	maxConns = 4
)

// Serve answers HTTP/1.x requests on l until l is closed (then it returns
// an error wrapping net.ErrClosed, after the connections in flight end;
// other accept errors are retried): GET or HEAD of path
// gets the metrics in the text format; any other path 404 and any other
// method 405. Every response closes its connection.
//
// It is deliberately minimal (no keep-alive, no compression, no chunked
// bodies: a scrape is one small GET) so the daemon need not link net/http's
// server; see the package doc for the numbers. The endpoint is
// unauthenticated: bind l to a loopback or private address.
func (s *Set) Serve(l net.Listener, path string) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, maxConns)
	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors, say: the daemon's real work matters
			// more than a scrape, so wait and try again rather than end.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(connTimeout))
			_ = s.serveConn(conn, path)
		}()
	}
}

// serveConn reads one request from c and answers it.
func (s *Set) serveConn(c io.ReadWriter, path string) error {
	r := bufio.NewReaderSize(io.LimitReader(c, maxRequestBytes), 1024)
	line, err := r.ReadString('\n')
	if err != nil {
		return respond(c, 400, "text/plain; charset=utf-8", nil, "bad request\n")
	}
	method, target, proto, ok := parseRequestLine(strings.TrimRight(line, "\r\n"))
	if !ok {
		return respond(c, 400, "text/plain; charset=utf-8", nil, "bad request\n")
	}
	// Skip the headers: nothing in them changes the answer.
	for {
		h, err := r.ReadString('\n')
		if err != nil {
			return respond(c, 431, "text/plain; charset=utf-8", nil, "request header too large\n")
		}
		if h == "\r\n" || h == "\n" {
			break
		}
	}
	if !strings.HasPrefix(proto, "HTTP/1.") {
		return respond(c, 505, "text/plain; charset=utf-8", nil, "HTTP/1.x only\n")
	}
	if p, _, _ := strings.Cut(target, "?"); p != path {
		return respond(c, 404, "text/plain; charset=utf-8", nil, "not found; metrics are at "+path+"\n")
	}
	if method != "GET" && method != "HEAD" {
		return respond(c, 405, "text/plain; charset=utf-8", []string{"Allow: GET, HEAD"}, "method not allowed\n")
	}
	var body bytes.Buffer
	if err := s.WriteText(&body); err != nil {
		return respond(c, 500, "text/plain; charset=utf-8", nil, "metrics: "+err.Error()+"\n")
	}
	if method == "HEAD" {
		return respondHead(c, 200, ContentType, nil, body.Len())
	}
	return respond(c, 200, ContentType, nil, body.String())
}

func parseRequestLine(line string) (method, target, proto string, ok bool) {
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	return method, target, proto, ok1 && ok2 && method != "" && target != ""
}

func statusText(code int) string {
	switch code {
	case 200:
		return "OK"
	case 400:
		return "Bad Request"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 431:
		return "Request Header Fields Too Large"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Internal Server Error"
}

func respondHead(w io.Writer, code int, contentType string, extra []string, length int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %s\r\nConnection: close\r\n", code, statusText(code), contentType, strconv.Itoa(length))
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func respond(w io.Writer, code int, contentType string, extra []string, body string) error {
	if err := respondHead(w, code, contentType, extra, len(body)); err != nil {
		return err
	}
	_, err := io.WriteString(w, body)
	return err
}
