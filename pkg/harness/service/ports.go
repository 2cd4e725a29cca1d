package service

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// Exposed ports and their preview URLs (SandboxService.ExposePort; the
// manager's ports.go has the tokens, their table and the tunnels). A
// preview URL is served by this service: GET/POST/... and WebSocket
// upgrades to /v1/preview/{token}/{path} (or to any path of
// {token}.<preview host> with Config.PreviewHost) are proxied to
// 127.0.0.1:port inside the sandbox through its daemon
// (httputil.ReverseProxy over a Transport that dials manager.DialPreview).
// No credential is asked for: the token is the capability, so a browser
// opens the URL as it is. A token that is not good (tampered, expired,
// revoked, its sandbox deleted, never issued) gets the same 404 and never
// reaches the sandbox.
//
// What the sandbox sees: the request with the preview prefix taken off its
// path, Host localhost:port, and none of the client's credentials for the
// service: no Authorization, no Proxy-Authorization, no "bearer."
// WebSocket subprotocol (the console's way to carry a token), no
// X-Forwarded-* header. On the service's own origin (path previews) no
// cookie goes either way: every cookie of that origin is the service's
// (or its front proxy's) and one a preview set would reach every other
// preview; and the page is served with "Content-Security-Policy: sandbox
// ..." (an opaque origin: its scripts cannot read the console's storage
// or call the service as the user). A preview host is the preview's own
// origin: cookies pass (give previews a domain apart from the service's,
// so no cookie of the service is scoped to them). Responses always carry
// "Referrer-Policy: no-referrer", so the token does not leak to the sites
// a page links.
//
// Bounds (manager.PreviewPolicy): a request body over MaxRequestBytes is
// refused (413), a sandbox's open proxied connections are bounded (503
// past it), and a connection idle that long is closed.

// previewPrefix is the path of preview URLs on the service's own origin.
const previewPrefix = "/v1/preview/"

// previewPoolDomain names the transport's pools: a dial of
// "<pool>.preview.invalid" is a tunnel to that exposure (the name is never
// resolved nor sent: the Host header is set apart).
const previewPoolDomain = ".preview.invalid"

// previewCSP sandboxes a page served on the service's origin.
const previewCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

// previewHost is a parsed Config.PreviewHost.
type previewHost struct {
	scheme string
	// suffix is what follows {token} in the host name, port dropped,
	// lower case (".preview.example.com").
	suffix string
	// rest is what follows {token} in URLs (host suffix and port).
	rest string
}

// parsePreviewHost reads Config.PreviewHost (nil for "").
func parsePreviewHost(s string) (*previewHost, error) {
	if s == "" {
		return nil, nil
	}
	h := &previewHost{scheme: "https"}
	rest := s
	for _, sch := range []string{"https", "http"} {
		if r, ok := strings.CutPrefix(s, sch+"://"); ok {
			h.scheme, rest = sch, r
			break
		}
	}
	rest, ok := strings.CutPrefix(rest, "{token}")
	rest = strings.TrimSuffix(rest, "/")
	name := rest
	if host, port, err := net.SplitHostPort(rest); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("preview host %q: bad port", s)
		}
		name = host
	}
	if !ok || len(name) < 3 || name[0] != '.' || strings.ContainsAny(name, "{}/@?#:[] ") || strings.Contains(name, "..") {
		return nil, fmt.Errorf("preview host %q: want {token}.DOMAIN (like {token}.preview.example.com), optionally with http:// or https:// and a port", s)
	}
	h.suffix, h.rest = strings.ToLower(name), strings.ToLower(rest)
	return h, nil
}

// ReadPreviewKey reads Config.PreviewKey from a file: its content with
// surrounding white space trimmed, at least manager.MinPreviewKeyBytes
// (e.g. `head -c 32 /dev/urandom | base64 > preview.key`).
func ReadPreviewKey(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("preview key: %w", err)
	}
	key := []byte(strings.TrimSpace(string(data)))
	if len(key) < manager.MinPreviewKeyBytes {
		return nil, fmt.Errorf("preview key %s: %d bytes; it needs at least %d", path, len(key), manager.MinPreviewKeyBytes)
	}
	return key, nil
}

// previewProxy serves preview URLs.
type previewProxy struct {
	m    *manager.Manager
	log  *zap.Logger
	host *previewHost
	rp   *httputil.ReverseProxy
}

// previewRequest is what the proxy's hooks learn of a request.
type previewRequest struct {
	pv *manager.Preview
	// prefix is taken off the path ("" on a preview host).
	prefix string
}

type previewKey struct{}

func newPreviewProxy(m *manager.Manager, host *previewHost, log *zap.Logger) *previewProxy {
	p := &previewProxy{m: m, log: log.Named("preview"), host: host}
	tr := &http.Transport{
		Proxy: nil, // never the environment's proxy
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			name, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return m.DialPreview(ctx, strings.TrimSuffix(name, previewPoolDomain))
		},
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		DisableCompression:    true,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      tr,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.proxyError,
		FlushInterval:  -1, // server-sent events and streams pass at once
	}
	if l, err := zap.NewStdLogAt(p.log, zap.DebugLevel); err == nil {
		p.rp.ErrorLog = l
	}
	return p
}

// url is the preview URL of a token.
func (p *previewProxy) url(token string) string {
	if p.host != nil {
		return p.host.scheme + "://" + token + p.host.rest + "/"
	}
	return previewPrefix + token + "/"
}

// register adds the path routes to mux.
func (p *previewProxy) register(mux *http.ServeMux) {
	mux.HandleFunc(previewPrefix+"{token}/{path...}", func(w http.ResponseWriter, r *http.Request) {
		token := r.PathValue("token")
		p.serve(w, r, token, previewPrefix+token)
	})
	// Without the slash relative links would resolve above the preview.
	mux.HandleFunc(previewPrefix+"{token}", func(w http.ResponseWriter, r *http.Request) {
		u := *r.URL
		u.Path, u.RawPath = u.Path+"/", ""
		w.Header().Set("Referrer-Policy", "no-referrer")
		http.Redirect(w, r, u.RequestURI(), http.StatusFound)
	})
}

// byHost routes the requests of preview hosts to the proxy (with the
// whole path), the others to next.
func (p *previewProxy) byHost(next http.Handler) http.Handler {
	if p.host == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(name); err == nil {
			name = h
		}
		name = strings.TrimSuffix(name, ".")
		if token, ok := strings.CutSuffix(name, p.host.suffix); ok && token != "" && !strings.Contains(token, ".") {
			p.serve(w, r, token, "")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// notFound answers every preview that is not good, alike.
func notFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte("404 page not found\n"))
}

// serve proxies a preview request (prefix is taken off its path).
func (p *previewProxy) serve(w http.ResponseWriter, r *http.Request, token, prefix string) {
	pv, err := p.m.Preview(token)
	if err != nil {
		notFound(w)
		return
	}
	done, err := pv.Begin()
	if err != nil {
		http.Error(w, "the service is shutting down", http.StatusServiceUnavailable)
		return
	}
	defer done()
	limit := p.m.MaxPreviewRequestBytes()
	if r.ContentLength > limit {
		http.Error(w, fmt.Sprintf("request body: %d bytes; the limit is %d", r.ContentLength, limit), http.StatusRequestEntityTooLarge)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, limit)
	}
	ctx := context.WithValue(r.Context(), previewKey{}, &previewRequest{pv: pv, prefix: prefix})
	p.rp.ServeHTTP(&holdWriter{ResponseWriter: w, pv: pv}, r.WithContext(ctx))
}

// holdWriter hands the client's connection of an upgraded request (which
// the proxy hijacks) to the preview: closed when it ends or is idle.
type holdWriter struct {
	http.ResponseWriter
	pv *manager.Preview
}

func (h *holdWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }

func (h *holdWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	return h.pv.Hold(conn), brw, nil
}

// rewrite makes the request the sandbox gets.
func (p *previewProxy) rewrite(pr *httputil.ProxyRequest) {
	preq := pr.In.Context().Value(previewKey{}).(*previewRequest)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = preq.pv.Pool() + previewPoolDomain
	out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, preq.prefix)
	out.URL.RawPath = ""
	if raw := pr.In.URL.RawPath; raw != "" {
		out.URL.RawPath = strings.TrimPrefix(raw, preq.prefix)
	}
	if !strings.HasPrefix(out.URL.Path, "/") {
		out.URL.Path, out.URL.RawPath = "/"+out.URL.Path, ""
	}
	out.Host = "localhost:" + strconv.Itoa(preq.pv.Port())
	h := out.Header
	h.Del("Authorization")
	h.Del("Proxy-Authorization")
	h.Del("Forwarded")
	if preq.prefix != "" {
		h.Del("Cookie")
	}
	if v := h.Values("Sec-WebSocket-Protocol"); len(v) > 0 {
		var keep []string
		for _, s := range v {
			for _, proto := range strings.Split(s, ",") {
				if proto = strings.TrimSpace(proto); proto != "" && !strings.HasPrefix(strings.ToLower(proto), "bearer.") {
					keep = append(keep, proto)
				}
			}
		}
		h.Del("Sec-WebSocket-Protocol")
		if len(keep) > 0 {
			h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
		}
	}
}

// modifyResponse fixes the headers of the sandbox's answer.
func (p *previewProxy) modifyResponse(resp *http.Response) error {
	preq := resp.Request.Context().Value(previewKey{}).(*previewRequest)
	resp.Header.Set("Referrer-Policy", "no-referrer")
	if preq.prefix != "" {
		resp.Header.Del("Set-Cookie")
		resp.Header.Add("Content-Security-Policy", previewCSP)
	}
	return nil
}

// proxyError answers a request the sandbox did not answer.
func (p *previewProxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		http.Error(w, fmt.Sprintf("request body: over the limit of %d bytes", tooBig.Limit), http.StatusRequestEntityTooLarge)
	case errors.Is(err, manager.ErrPreviewNotFound):
		notFound(w)
	case r.Context().Err() != nil:
		// The client left.
	case errors.Is(err, errkind.ErrResourceExhausted):
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many connections to this sandbox", http.StatusServiceUnavailable)
	case errors.Is(err, errkind.ErrUnavailable):
		http.Error(w, "nothing answered on the port in the sandbox", http.StatusBadGateway)
	default:
		p.log.Debug("preview request failed", zap.Error(err))
		http.Error(w, "the sandbox's server did not answer", http.StatusBadGateway)
	}
}

// The SandboxService calls.

func (a *sandboxAPI) ExposePort(ctx context.Context, req *connect.Request[harnessv1.ExposePortRequest]) (*connect.Response[harnessv1.ExposePortResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	ttl, err := durationOf("ttl", req.Msg.GetTtl())
	if err != nil {
		return nil, apiError(err)
	}
	p, err := a.m.ExposePort(ctx, tenant, req.Msg.GetSandboxId(), int(req.Msg.GetPort()), ttl)
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.ExposePortResponse{Port: exposedPortProto(*p, a.previewURL)}), nil
}

func (a *sandboxAPI) RevokePort(ctx context.Context, req *connect.Request[harnessv1.RevokePortRequest]) (*connect.Response[harnessv1.RevokePortResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.m.RevokePort(ctx, tenant, req.Msg.GetSandboxId(), int(req.Msg.GetPort())); err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.RevokePortResponse{}), nil
}

func (a *sandboxAPI) ListPorts(ctx context.Context, req *connect.Request[harnessv1.ListPortsRequest]) (*connect.Response[harnessv1.ListPortsResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	ports, err := a.m.ListPorts(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListPortsResponse{}
	for _, p := range ports {
		out.Ports = append(out.Ports, exposedPortProto(p, a.previewURL))
	}
	return connect.NewResponse(out), nil
}
