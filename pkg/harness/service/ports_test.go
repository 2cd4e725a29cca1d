package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
)

// Exposed ports and preview URLs, against a real server in a real local
// sandbox (testdata/portserver): the URL is opened with plain net/http and
// a WebSocket client, with no credential.

// portServer builds testdata/portserver as a static binary.
func portServer(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "portserver")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./testdata/portserver")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the sandbox's server: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// startPortServer puts the server in sandbox id (as acme), starts it and
// returns the port it listens on.
func startPortServer(t *testing.T, ctx context.Context, e *env, id string, bin []byte) int {
	t.Helper()
	base := e.url + "/v1/sandboxes/" + id + "/files/"
	if code, body := httpDo(t, ctx, http.MethodPut, base+"portserver?mode=0755", acmeToken, bytes.NewReader(bin)); code != http.StatusOK {
		t.Fatalf("upload the server: %d %s", code, body)
	}
	sbxOK(t, ctx, e, acmeToken, "StartProcess", obj{"sandboxId": id, "argv": []string{"./portserver"}})
	for {
		if code, body := httpDo(t, ctx, http.MethodGet, base+"port", acmeToken, nil); code == http.StatusOK {
			port, err := strconv.Atoi(string(body))
			if err != nil {
				t.Fatal(err)
			}
			return port
		}
		select {
		case <-ctx.Done():
			t.Fatal("the sandbox's server never started")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// seenRequest is a request the sandbox's server logged.
type seenRequest struct {
	Method, Path, Host string
	Header             http.Header
	raw                string
}

// serverSaw returns the requests the sandbox's server got.
func serverSaw(t *testing.T, ctx context.Context, e *env, id string) []seenRequest {
	t.Helper()
	code, body := httpDo(t, ctx, http.MethodGet, e.url+"/v1/sandboxes/"+id+"/files/requests.log", acmeToken, nil)
	if code == http.StatusNotFound {
		return nil
	}
	if code != http.StatusOK {
		t.Fatalf("requests.log: %d %s", code, body)
	}
	var out []seenRequest
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		var r seenRequest
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		r.raw = sc.Text()
		out = append(out, r)
	}
	return out
}

// expose exposes a port of sandbox id as tenant and returns its URL.
func expose(t *testing.T, ctx context.Context, e *env, token, id string, port int, ttl string) string {
	t.Helper()
	req := obj{"sandboxId": id, "port": port}
	if ttl != "" {
		req["ttl"] = ttl
	}
	out := sbxOK(t, ctx, e, token, "ExposePort", req)
	u := fieldStr(out, "port", "url")
	if fieldNum(out, "port", "port") != float64(port) || fieldStr(out, "port", "sandboxId") != id || u == "" || fieldStr(out, "port", "expireTime") == "" {
		t.Fatalf("ExposePort: %v", out)
	}
	return u
}

// previewGet GETs a preview URL with a client that holds no credential
// of its own (headers are the caller's), not following redirects.
func previewGet(t *testing.T, ctx context.Context, u string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func wsURL(e *env, path string) string { return strings.Replace(e.url, "http://", "ws://", 1) + path }

// TestPreviewProxiesHTTPAndWebSocket: a port's preview URL reaches the
// sandbox's server with no credential, for plain requests and a WebSocket
// echo; the sandbox never sees the tenant's bearer token (Authorization,
// the "bearer." subprotocol), the client's cookies or forwarding headers;
// the page is sandboxed on the service's origin and sends no referrer.
func TestPreviewProxiesHTTPAndWebSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newEnv(t, nil, nil)
	bin := portServer(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	port := startPortServer(t, ctx, e, id, bin)

	u := expose(t, ctx, e, acmeToken, id, port, "")
	if !strings.HasPrefix(u, "/v1/preview/") || !strings.HasSuffix(u, "/") {
		t.Fatalf("preview URL %q", u)
	}
	// A browser's plain GET.
	resp, body := previewGet(t, ctx, e.url+u, nil)
	if resp.StatusCode != http.StatusOK || body != "hello from the sandbox: GET /\n" {
		t.Fatalf("GET %s: %d %q", u, resp.StatusCode, body)
	}
	if resp.Header.Get("Referrer-Policy") != "no-referrer" || !strings.HasPrefix(resp.Header.Get("Content-Security-Policy"), "sandbox ") ||
		resp.Header.Get("Set-Cookie") != "" {
		t.Fatalf("preview response headers: %v", resp.Header)
	}
	// The same with the tenant's credentials and cookies on it.
	resp, body = previewGet(t, ctx, e.url+u+"a/b%2Fc?q=1", http.Header{
		"Authorization":       {"Bearer " + acmeToken},
		"Proxy-Authorization": {"Bearer " + acmeToken},
		"Cookie":              {"bulkhead=" + acmeToken + "; other=1"},
		"X-Forwarded-For":     {"10.1.2.3"},
	})
	if resp.StatusCode != http.StatusOK || body != "hello from the sandbox: GET /a/b%2Fc?q=1\n" {
		t.Fatalf("GET with credentials: %d %q", resp.StatusCode, body)
	}
	// Without the final slash: redirected to it.
	resp, _ = previewGet(t, ctx, e.url+strings.TrimSuffix(u, "/"), nil)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != u {
		t.Fatalf("GET without the slash: %d %v", resp.StatusCode, resp.Header)
	}

	// A WebSocket echo, offered the console's credential subprotocol too.
	conn, wsResp, err := websocket.Dial(ctx, wsURL(e, u+"ws"), &websocket.DialOptions{
		Subprotocols: []string{"chat", "bearer." + acmeToken}})
	if err != nil {
		t.Fatalf("WebSocket through the preview: %v (%v)", err, wsResp)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	for _, msg := range []string{"ping", strings.Repeat("x", 100<<10)} {
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := conn.Read(ctx)
		if err != nil || string(got) != "echo: "+msg {
			t.Fatalf("WebSocket echo: %.40q %v", got, err)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")

	seen := serverSaw(t, ctx, e, id)
	if len(seen) != 3 {
		t.Fatalf("the server saw %d requests, want 3: %v", len(seen), seen)
	}
	for _, r := range seen {
		if strings.Contains(r.raw, acmeToken) || strings.Contains(r.raw, strings.TrimPrefix(u, "/v1/preview/")[:20]) {
			t.Errorf("the sandbox saw the tenant's token or the preview prefix: %s", r.raw)
		}
		for _, h := range []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Forwarded-For", "X-Forwarded-Host", "Forwarded"} {
			if r.Header.Get(h) != "" {
				t.Errorf("the sandbox got %s: %s", h, r.raw)
			}
		}
		if r.Host != "localhost:"+strconv.Itoa(port) {
			t.Errorf("Host %q", r.Host)
		}
	}
	if seen[1].Path != "/a/b%2Fc?q=1" || seen[2].Path != "/ws" || seen[2].Header.Get("Sec-WebSocket-Protocol") != "chat" {
		t.Errorf("requests the sandbox saw: %v", seen)
	}

	out := sbxOK(t, ctx, e, acmeToken, "ListPorts", obj{"sandboxId": id})
	ports, _ := out["ports"].([]any)
	if len(ports) != 1 || fieldStr(ports[0].(obj), "url") != u {
		t.Fatalf("ListPorts: %v", out)
	}
}

// TestPreviewRefusesTamperedExpiredRevoked: a token with one character
// changed, one past its ttl, a revoked one and a replaced one are all
// answered the same 404 as a path that does not exist, and none reaches
// the sandbox's server; revoking also closes the WebSocket open through
// the URL at once.
func TestPreviewRefusesTamperedExpiredRevoked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newEnv(t, nil, nil)
	bin := portServer(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	port := startPortServer(t, ctx, e, id, bin)
	served := 0 // requests the server must have seen
	ok := func(u string) {
		t.Helper()
		resp, body := previewGet(t, ctx, e.url+u, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %q", u, resp.StatusCode, body)
		}
		served++
	}
	_, unknownBody := previewGet(t, ctx, e.url+"/v1/nothing-here", nil)
	refused := func(what, u string) {
		t.Helper()
		resp, body := previewGet(t, ctx, e.url+u, nil)
		if resp.StatusCode != http.StatusNotFound || body != unknownBody {
			t.Fatalf("%s token: %d %q, want 404 %q", what, resp.StatusCode, body, unknownBody)
		}
		if conn, resp, err := websocket.Dial(ctx, wsURL(e, u+"ws"), nil); err == nil {
			conn.CloseNow()
			t.Fatalf("%s token: a WebSocket opened", what)
		} else if resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s token: WebSocket %v %v", what, resp, err)
		}
		if n := len(serverSaw(t, ctx, e, id)); n != served {
			t.Fatalf("%s token: the sandbox's server saw %d requests, want %d", what, n, served)
		}
	}

	u := expose(t, ctx, e, acmeToken, id, port, "")
	ok(u)
	token := strings.TrimSuffix(strings.TrimPrefix(u, "/v1/preview/"), "/")
	for _, i := range []int{0, len(token) / 2, len(token) - 1} {
		c := byte('a')
		if token[i] == 'a' {
			c = 'b'
		}
		refused("tampered", "/v1/preview/"+token[:i]+string(c)+token[i+1:]+"/")
	}
	refused("upper-case", "/v1/preview/"+strings.ToUpper(token)+"/")
	refused("made-up", "/v1/preview/"+strings.Repeat("a", len(token))+"/")

	// Revoked: the URL ends, and so does the WebSocket open through it.
	conn, _, err := websocket.Dial(ctx, wsURL(e, u+"ws"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	served++
	if err := conn.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := conn.Read(ctx); err != nil || string(got) != "echo: hi" {
		t.Fatalf("echo: %q %v", got, err)
	}
	sbxOK(t, ctx, e, acmeToken, "RevokePort", obj{"sandboxId": id, "port": port})
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	_, _, err = conn.Read(rctx)
	rcancel()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the WebSocket stayed open after RevokePort: %v", err)
	}
	refused("revoked", u)
	sbxRefused(t, ctx, e, acmeToken, "RevokePort", obj{"sandboxId": id, "port": port}, http.StatusNotFound, "not_found", "not exposed")

	// Expired.
	u = expose(t, ctx, e, acmeToken, id, port, "1s")
	ok(u)
	time.Sleep(1200 * time.Millisecond)
	refused("expired", u)

	// Replaced: exposing the port again ends the earlier URL.
	u1 := expose(t, ctx, e, acmeToken, id, port, "")
	u2 := expose(t, ctx, e, acmeToken, id, port, "")
	if u1 == u2 {
		t.Fatal("exposing a port again gave the same URL")
	}
	refused("replaced", u1)
	ok(u2)
	if n := len(serverSaw(t, ctx, e, id)); n != served {
		t.Fatalf("the sandbox's server saw %d requests, want %d", n, served)
	}
}

// TestPortsAreTheTenants: another tenant can neither expose, revoke nor
// list a sandbox's ports (NotFound, as for a sandbox that does not exist),
// fields are checked, and the URLs end with their sandbox.
func TestPortsAreTheTenants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newEnv(t, nil, nil)
	bin := portServer(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	port := startPortServer(t, ctx, e, id, bin)
	u := expose(t, ctx, e, acmeToken, id, port, "")

	for method, req := range map[string]obj{
		"ExposePort": {"sandboxId": id, "port": port},
		"RevokePort": {"sandboxId": id, "port": port},
		"ListPorts":  {"sandboxId": id},
	} {
		sbxRefused(t, ctx, e, evilToken, method, req, http.StatusNotFound, "not_found")
		code, _ := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.SandboxService/"+method, "", mustJSONString(t, req))
		if code != http.StatusUnauthorized {
			t.Fatalf("%s without a credential: %d", method, code)
		}
	}
	if resp, body := previewGet(t, ctx, e.url+u, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("acme's URL after evil's tries: %d %q", resp.StatusCode, body)
	}
	for _, req := range []obj{
		{"sandboxId": id, "port": 0},
		{"sandboxId": id, "port": 70000},
		{"sandboxId": id, "port": egress.RelayPort}, // an open door to the tenant's egress proxy
		{"sandboxId": id, "port": port, "ttl": "172800s"},
		{"sandboxId": "not-a-sandbox", "port": port},
	} {
		sbxRefused(t, ctx, e, acmeToken, "ExposePort", req, http.StatusBadRequest, "invalid_argument")
	}

	sbxOK(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": id})
	if resp, _ := previewGet(t, ctx, e.url+u, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the URL of a deleted sandbox: %d", resp.StatusCode)
	}
	sbxRefused(t, ctx, e, acmeToken, "ListPorts", obj{"sandboxId": id}, http.StatusNotFound, "not_found")
}

func mustJSONString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPreviewKeptAcrossRestart: with the same preview key a restarted
// service honours the URLs it gave (recorded with the sandbox); a record
// whose expiry was moved behind its back no longer matches its token; a
// service whose key was made at random ends them. Clients that keep
// upgraded connections open do not hold the shutdown.
func TestPreviewKeptAcrossRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	key := []byte(strings.Repeat("preview-key-", 4))
	e := newEnv(t, nil, func(c *service.Config) { c.PreviewKey = key })
	bin := portServer(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	port := startPortServer(t, ctx, e, id, bin)
	u := expose(t, ctx, e, acmeToken, id, port, "")

	// A client keeping a WebSocket open (after the sandbox's side ended
	// cleanly too) does not hold the shutdown: its connection is closed.
	conn, _, err := websocket.Dial(ctx, wsURL(e, u+"ws"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	// And one whose server hung up at once, while the client keeps its
	// side open.
	raw, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := io.WriteString(raw, "GET "+u+"hangup HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(raw), nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	start := time.Now()
	e.restart()
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the restart took %s with a WebSocket open", d)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	_, _, err = conn.Read(rctx)
	rcancel()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the WebSocket stayed open through the restart: %v", err)
	}
	if resp, body := previewGet(t, ctx, e.url+u, nil); resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "hello from the sandbox") {
		t.Fatalf("after a restart with the same key: %d %q", resp.StatusCode, body)
	}
	out := sbxOK(t, ctx, e, acmeToken, "ListPorts", obj{"sandboxId": id})
	if ports, _ := out["ports"].([]any); len(ports) != 1 || fieldStr(ports[0].(obj), "url") != u {
		t.Fatalf("ListPorts after the restart: %v", out)
	}

	// The stored expiry moved an hour on: the token does not match it.
	e.stop()
	rec, err := e.store.GetSandbox(ctx, "token:acme", id)
	if err != nil || len(rec.Ports) != 1 {
		t.Fatalf("stored record: %+v %v", rec, err)
	}
	rec.Ports[0].Expires = rec.Ports[0].Expires.Add(time.Hour)
	if err := e.store.UpdateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	e.start()
	if resp, _ := previewGet(t, ctx, e.url+u, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a token whose record was moved on: %d", resp.StatusCode)
	}

	// A service with a random key: the URLs end with the process.
	u = expose(t, ctx, e, acmeToken, id, port, "")
	e.stop()
	e.cfg = nil
	e.start()
	if resp, _ := previewGet(t, ctx, e.url+u, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("after a restart with another key: %d", resp.StatusCode)
	}
	out = sbxOK(t, ctx, e, acmeToken, "ListPorts", obj{"sandboxId": id})
	if ports, _ := out["ports"].([]any); len(ports) != 0 {
		t.Fatalf("ListPorts after a restart with another key: %v", out)
	}
}

// TestPreviewBoundsAndHost: a preview host serves a preview on a host of
// its own (cookies its own, no sandboxing CSP) and never the API; a body
// over the cap is refused before it reaches the sandbox; a sandbox's
// proxied connections are bounded and closed when idle.
func TestPreviewBoundsAndHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newEnv(t, nil, func(c *service.Config) {
		c.PreviewHost = "http://{token}.preview.test"
		c.Previews = manager.PreviewPolicy{MaxConnsPerSandbox: 2, IdleTimeout: 2 * time.Second, MaxRequestBytes: 1024}
	})
	bin := portServer(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	port := startPortServer(t, ctx, e, id, bin)
	u := expose(t, ctx, e, acmeToken, id, port, "")
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme != "http" || !strings.HasSuffix(pu.Host, ".preview.test") || pu.Path != "/" {
		t.Fatalf("preview URL %q", u)
	}
	hostGet := func(host, path string, body io.Reader) (*http.Response, string) {
		t.Helper()
		method := http.MethodGet
		if body != nil {
			method = http.MethodPost
		}
		req, _ := http.NewRequestWithContext(ctx, method, e.url+path, body)
		req.Host = host
		req.Header.Set("Cookie", "app=1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := hostGet(pu.Host, "/x", nil)
	if resp.StatusCode != http.StatusOK || body != "hello from the sandbox: GET /x\n" ||
		resp.Header.Get("Content-Security-Policy") != "" || resp.Header.Get("Set-Cookie") == "" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Fatalf("GET on the preview host: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	// The API is not served on preview hosts, bad tokens there are 404.
	if resp, _ := hostGet(pu.Host, "/healthz", nil); resp.StatusCode != http.StatusOK || len(serverSaw(t, ctx, e, id)) != 2 {
		t.Fatalf("/healthz on the preview host did not go to the sandbox: %d", resp.StatusCode)
	}
	if resp, _ := hostGet("x"+pu.Host, "/", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a bad token's host: %d", resp.StatusCode)
	}
	if seen := serverSaw(t, ctx, e, id); seen[0].Header.Get("Cookie") != "app=1" {
		t.Fatalf("the preview host's own cookie did not pass: %v", seen[0].Header)
	}

	// Body cap.
	before := len(serverSaw(t, ctx, e, id))
	if resp, _ := hostGet(pu.Host, "/upload", bytes.NewReader(make([]byte, 2048))); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over the cap: %d", resp.StatusCode)
	}
	if n := len(serverSaw(t, ctx, e, id)); n != before {
		t.Fatal("a body over the cap reached the sandbox")
	}
	if resp, _ := hostGet(pu.Host, "/upload", io.MultiReader(strings.NewReader(strings.Repeat("y", 2048)))); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a streamed body over the cap: %d", resp.StatusCode)
	}

	// Two connections at most: two WebSockets hold them (once the kept-
	// alive connections of the requests above were closed, idle).
	ws := wsURL(e, "/v1/preview/"+strings.TrimSuffix(pu.Host, ".preview.test")+"/ws")
	var conns []*websocket.Conn
	for len(conns) < 2 {
		c, resp, err := websocket.Dial(ctx, ws, nil)
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || ctx.Err() != nil {
				t.Fatalf("WebSocket: %v %v", resp, err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		defer c.CloseNow()
		conns = append(conns, c)
	}
	if resp, _ := previewGet(t, ctx, e.url+"/v1/preview/"+strings.TrimSuffix(pu.Host, ".preview.test")+"/", nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a third connection: %d", resp.StatusCode)
	}
	// Idle: both are closed after 2s without a byte, and the slots come back.
	for _, c := range conns {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := c.Read(rctx)
		rcancel()
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("an idle WebSocket stayed open: %v", err)
		}
	}
	for {
		resp, _ := previewGet(t, ctx, e.url+"/v1/preview/"+strings.TrimSuffix(pu.Host, ".preview.test")+"/", nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable || ctx.Err() != nil {
			t.Fatalf("after the idle connections closed: %d", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
