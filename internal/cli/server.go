package cli

// The CLI as a client of `harness serve`: with --server (or
// BULKHEAD_SERVER, or the current context's server) the sandbox commands
// call the service's SandboxService and its file and tar routes instead of
// driving a provider here. The bearer token comes from --server-token-file
// (or BULKHEAD_TOKEN, the token itself); it is sent in the Authorization
// header of every request to the server and never printed or logged.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/pflag"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1/harnessv1connect"
)

// Environment variables of the service client.
const (
	serverEnv = "BULKHEAD_SERVER"
	tokenEnv  = "BULKHEAD_TOKEN"
)

// serverFlags choose the service the sandbox commands talk to.
type serverFlags struct {
	url       string
	tokenFile string
	insecure  bool
}

// add registers the flags.
func (f *serverFlags) add(pf *pflag.FlagSet) {
	pf.StringVar(&f.url, "server", "", "a harness serve to drive sandboxes through (https://host:port; http only on loopback or with --insecure-server) (default: $"+serverEnv+", else the current context's)")
	pf.StringVar(&f.tokenFile, "server-token-file", "", "file holding the bearer token for --server, readable by its owner only (default: the token in $"+tokenEnv+", else the current context's file)")
	pf.BoolVar(&f.insecure, "insecure-server", false, "allow an http:// --server that is not on loopback: the token crosses the network unencrypted")
}

// serverConn is a connection to a service: its Connect client and a plain
// HTTP client for the file and tar routes, both sending the token.
type serverConn struct {
	base      string
	http      *http.Client
	sandboxes harnessv1connect.SandboxServiceClient
}

// server returns the connection the flags, environment and context ask
// for, or nil when none names a server (the commands then work locally).
func (g *globals) server() (*serverConn, error) {
	raw := g.serverFlags.url
	if raw == "" {
		raw = os.Getenv(serverEnv)
	}
	if raw == "" {
		raw = g.ctxDefaults.Server
	}
	if raw == "" {
		return nil, nil
	}
	base, err := checkServerURL(raw, g.serverFlags.insecure)
	if err != nil {
		return nil, err
	}
	// The context's token goes to the context's server only.
	token, err := g.serverToken(raw == g.ctxDefaults.Server)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if strings.HasPrefix(base, "http://") {
		// Plain HTTP/2 (h2c) with prior knowledge: the terminal is a
		// bidirectional stream, which HTTP/1.1 cannot carry.
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	hc := &http.Client{Transport: bearerTransport{next: tr, token: token}}
	return &serverConn{base: base, http: hc, sandboxes: harnessv1connect.NewSandboxServiceClient(hc, base)}, nil
}

// checkServerURL accepts https URLs, and http ones on loopback (or
// anywhere with --insecure-server), and returns it without a final slash.
func checkServerURL(raw string, insecure bool) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", usageErr(compute.ErrInvalidArgument, "--server %q: want https://HOST[:PORT] (or $%s)", raw, serverEnv)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", usageErr(compute.ErrInvalidArgument, "--server %s://%s: no user, query or fragment (the token goes in --server-token-file)", u.Scheme, u.Host)
	}
	if u.Scheme == "http" && !insecure && !isLoopback(u.Hostname()) {
		return "", usageErr(compute.ErrInvalidArgument, "--server %s: http is allowed on loopback only, for the token would cross the network unencrypted (use https, or --insecure-server)", u.Redacted())
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// isLoopback reports whether host is localhost or a loopback address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serverToken reads the bearer token: --server-token-file, else
// $BULKHEAD_TOKEN, else (when ctxServer: the server is the context's) the
// context's token file. A token file
// that its group or others may read is refused, as ssh refuses such a
// private key: whoever reads it acts as the tenant on the server.
func (g *globals) serverToken(ctxServer bool) (string, error) {
	file, flag := g.serverFlags.tokenFile, "--server-token-file"
	if file == "" {
		if t := strings.TrimSpace(os.Getenv(tokenEnv)); t != "" {
			return t, nil
		}
		if ctxServer {
			file, flag = g.ctxDefaults.ServerTokenFile, "the context's server-token-file"
		}
	}
	if file == "" {
		return "", usageErr(compute.ErrInvalidArgument, "--server needs a token: give --server-token-file FILE or set $%s", tokenEnv)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", usageErr(compute.ErrPermissionDenied, "%s %s: readable by group or others (mode %04o); the token must be its owner's alone: chmod 600 %s", flag, file, fi.Mode().Perm(), file)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || strings.ContainsAny(t, " \t\r\n") {
		return "", usageErr(compute.ErrInvalidArgument, "%s %s: want one token on one line", flag, file)
	}
	return t, nil
}

// bearerTransport adds the token to every request (all go to the server).
type bearerTransport struct {
	next  http.RoundTripper
	token string
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// routeURL is the URL of a hand-written route of a sandbox: kind is
// "files" or "tar", p a workspace-relative path (each segment escaped).
func (c *serverConn) routeURL(id, kind, p string, q url.Values) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/" + kind + "/" + strings.Join(segs, "/")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// do sends a request to a route (length: the body's, -1 unknown) and
// returns the response when it succeeded; otherwise its JSON error, as a serverError.
func (c *serverConn) do(ctx context.Context, method, u string, body io.Reader, contentType string, length int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		// The length, when known, lets the service refuse a body over its
		// limit before it is sent.
		req.ContentLength = length
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.base, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct{ Code, Message string }
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e.Message = fmt.Sprintf("%s: %s", resp.Status, oneLine(string(b)))
	}
	return nil, &serverError{code: codeByName(e.Code), msg: e.Message}
}

// serverError is a refusal of the service, as the CLI words it.
type serverError struct {
	code connect.Code
	msg  string
}

func (e *serverError) Error() string { return e.msg }

// codeByName is the Connect code of a JSON error's code name.
func codeByName(name string) connect.Code {
	var c connect.Code
	if c.UnmarshalText([]byte(name)) == nil {
		return c
	}
	return connect.CodeUnknown
}

// serverErr words an error of the service for the command line: what the
// user can do about a refused token or an unknown sandbox.
func (c *serverConn) serverErr(id string, err error) error {
	if err == nil {
		return nil
	}
	code, msg := connect.CodeOf(err), err.Error()
	var ce *connect.Error
	var se *serverError
	switch {
	case errors.As(err, &ce):
		msg = ce.Message()
	case errors.As(err, &se):
		code = se.code
	}
	switch code {
	case connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return usageErr(compute.ErrUnauthenticated, "%s refused the token (--server-token-file or $%s): %s", c.base, tokenEnv, msg)
	case connect.CodeNotFound:
		if id != "" && strings.Contains(msg, "sandbox not found") {
			return usageErr(compute.ErrNotFound, "no sandbox %q on %s (`harness sandbox ls` lists them)", id, c.base)
		}
	case connect.CodeInvalidArgument:
		if id != "" && strings.HasPrefix(msg, "sandbox_id: ") {
			return usageErr(compute.ErrInvalidArgument, "%q is not a sandbox id of %s (they look like sbx-…; `harness sandbox ls` lists them)", id, c.base)
		}
	case connect.CodeUnimplemented:
		return usageErr(compute.ErrUnimplemented, "%s does not offer this call (an older `harness serve`?): %s", c.base, msg)
	case connect.CodeUnavailable:
		if ce != nil && ce.Message() == "" {
			return fmt.Errorf("%s: unreachable: %w", c.base, err)
		}
	}
	return errors.New(msg)
}

// workspacePath is a sandbox path as the service takes it: relative to the
// workspace root, "" for the root itself.
func workspacePath(p string) string {
	c := path.Clean(strings.TrimPrefix(p, "./"))
	if c == "." {
		return ""
	}
	return c
}
