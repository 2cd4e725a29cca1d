package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
)

// authInterceptor binds every RPC to the tenant of its bearer credential.
type authInterceptor struct{ auth auth.Authenticator }

func (i *authInterceptor) authenticate(ctx context.Context, h http.Header) (context.Context, error) {
	bearer, ok := auth.BearerFrom(h.Get("Authorization"))
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("missing bearer credential (Authorization: Bearer ...)"))
	}
	tenant, err := i.auth.Authenticate(ctx, bearer)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return auth.WithTenant(ctx, tenant), nil
}

func (i *authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := i.authenticate(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (i *authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := i.authenticate(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// httpAuth authenticates a hand-written route with the Authorization header.
func (s *Service) httpAuth(next http.Handler) http.Handler {
	ai := &authInterceptor{auth: s.cfg.Auth}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, err := ai.authenticate(r.Context(), r.Header)
		if err != nil {
			httpError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// wsProtocol is the WebSocket subprotocol of the terminal. Browsers cannot
// set an Authorization header on a WebSocket, so the credential may come as
// a second subprotocol "bearer.<credential>" instead.
const wsProtocol = "bulkhead.terminal.v1"

// wsAuth authenticates the terminal WebSocket: the Authorization header,
// or the bearer subprotocol.
func (s *Service) wsAuth(next http.Handler) http.Handler {
	ai := &authInterceptor{auth: s.cfg.Auth}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		if h.Get("Authorization") == "" {
			for _, p := range websocketProtocols(r) {
				if cred, ok := strings.CutPrefix(p, "bearer."); ok {
					h.Set("Authorization", "Bearer "+cred)
				}
			}
		}
		ctx, err := ai.authenticate(r.Context(), h)
		if err != nil {
			httpError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func websocketProtocols(r *http.Request) []string {
	var out []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			out = append(out, strings.TrimSpace(p))
		}
	}
	return out
}

// sseHeartbeat keeps idle event streams (a run waiting for approval) open
// through proxies.
const sseHeartbeat = 15 * time.Second

// serveSSE serves a run's events as Server-Sent Events: each event's id is
// its sequence (so EventSource's Last-Event-ID resumes), its event name the
// kind (turn_started, model_text, tool_call, ...), its data the RunEvent
// in protobuf JSON. ?after=N starts after sequence N. The events are
// written from the handler's goroutine (the manager's Events calls back),
// heartbeats included: the stream starts no goroutine.
func (s *Service) serveSSE(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	after := uint64(0)
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("after")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			httpError(w, invalid("after/Last-Event-ID", "%q: not a sequence number", v))
			return
		}
		after = n
	}
	runID := r.PathValue("run_id")
	// The run is the tenant's (else 404) before the stream's headers go.
	if _, err := s.m.GetRun(r.Context(), tenant, runID); err != nil {
		httpError(w, err)
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	ctx := r.Context()
	rc := http.NewResponseController(w)
	mo := protojson.MarshalOptions{}
	err := s.m.Events(ctx, tenant, runID, after, manager.EventsOptions{
		KeepAliveEvery: sseHeartbeat,
		KeepAlive: func() error {
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return errClientGone{err}
			}
			_ = rc.Flush()
			return nil
		},
	}, func(ev manager.Event) error {
		pe := eventProto(ev)
		data, err := mo.Marshal(pe)
		if err != nil {
			return errClientGone{err}
		}
		if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Sequence, ev.Kind, data); err != nil {
			return errClientGone{err}
		}
		_ = rc.Flush()
		return nil
	})
	var gone errClientGone
	switch {
	case errors.As(err, &gone) || ctx.Err() != nil:
		return
	case err != nil:
		fmt.Fprintf(w, "event: error\ndata: %s\n\n", mustJSON(map[string]string{"message": err.Error()}))
	default:
		fmt.Fprint(w, "event: end\ndata: {}\n\n")
	}
	_ = rc.Flush()
}

// errClientGone ends an event stream whose client cannot be written to.
type errClientGone struct{ err error }

func (e errClientGone) Error() string { return e.err.Error() }

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// serveFile downloads a sandbox file.
func (s *Service) serveFile(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	started := false
	err := s.m.Download(r.Context(), tenant, r.PathValue("sandbox_id"), r.PathValue("path"), func(fi manager.FileInfo) io.Writer {
		started = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", path.Base(fi.Path)))
		return w
	})
	switch {
	case err == nil:
	case !started:
		httpError(w, err)
	default:
		// Headers are gone: the short body tells the client.
		s.log.Debug("file download cut")
	}
}

// serveUpload writes a sandbox file from a PUT's body (atomically: the
// file is replaced once the whole body arrived): ?mode=0755 sets a new
// file's permission bits (octal), ?parents=false refuses to make missing
// directories. A body over the policy's file cap is refused
// (ResourceExhausted, 429 by the error table), before anything is read
// when its length is declared.
func (s *Service) serveUpload(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	q := r.URL.Query()
	o := manager.WriteFileOptions{CreateParents: true}
	if v := q.Get("mode"); v != "" {
		n, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			httpError(w, invalid("mode", "%q is not octal permission bits", clip(v)))
			return
		}
		o.Mode = uint32(n)
	}
	if v := q.Get("parents"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			httpError(w, invalid("parents", "%q is not true or false", clip(v)))
			return
		}
		o.CreateParents = b
	}
	limit := s.m.MaxFileBytes()
	if r.ContentLength > limit {
		httpError(w, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("file: %d bytes; the limit is %d", r.ContentLength, limit)))
		return
	}
	fe, err := s.m.WriteFile(r.Context(), tenant, r.PathValue("sandbox_id"), r.PathValue("path"), o, r.Body)
	if err != nil {
		httpError(w, err)
		return
	}
	data, err := protojson.Marshal(fileEntryProto(*fe))
	if err != nil {
		httpError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// serveTarDownload downloads a sandbox directory as one tar stream (its
// regular files and directories, named relative to it; manager.DownloadTar).
func (s *Service) serveTarDownload(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	started := false
	err := s.m.DownloadTar(r.Context(), tenant, r.PathValue("sandbox_id"), r.PathValue("path"), func(name string) io.Writer {
		started = true
		if name == "." || name == "/" {
			name = "workspace"
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name+".tar"))
		return w
	})
	switch {
	case err == nil:
	case !started:
		httpError(w, err)
	default:
		// Headers are gone: the cut tar (no end marker) tells the client.
		s.log.Debug("tar download cut")
		panic(http.ErrAbortHandler)
	}
}

// serveTarUpload extracts a POST's body, a tar stream, into a sandbox
// directory (manager.UploadTar: regular files and directories only, no
// path out of it, bounded; a bad member refuses the whole upload and
// nothing under the directory changes). It answers
// {"files":N,"directories":N,"bytes":N}.
func (s *Service) serveTarUpload(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	limit := s.m.MaxTarStreamBytes()
	if r.ContentLength > limit {
		httpError(w, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("tar: %d bytes; the limit is %d", r.ContentLength, limit)))
		return
	}
	res, err := s.m.UploadTar(r.Context(), tenant, r.PathValue("sandbox_id"), r.PathValue("path"), http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		httpError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(mustJSON(map[string]any{"files": res.Files, "directories": res.Dirs, "bytes": res.Bytes})))
}

// serveTerminalWS serves the terminal over a WebSocket: binary messages
// both ways carry terminal bytes; the client's text messages are JSON
// resizes {"cols":N,"rows":N}; the server's last text message is
// {"exit_code":N,"signal":"..."}. ?cols=&rows=&command= (repeatable) start
// it.
func (s *Service) serveTerminalWS(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	q := r.URL.Query()
	var size [2]uint64
	for i, k := range []string{"cols", "rows"} {
		if v := q.Get(k); v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				httpError(w, invalid(k, "%q is not a number", clip(v)))
				return
			}
			size[i] = n
		}
	}
	term, err := s.m.OpenTerminal(r.Context(), tenant, r.PathValue("sandbox_id"),
		manager.TerminalOptions{Command: q["command"], Cols: uint32(size[0]), Rows: uint32(size[1])})
	if err != nil {
		httpError(w, err)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wsProtocol}})
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	var closed atomic.Bool
	err = term.Run(ctx, manager.TerminalIO{
		// The close handshake ends the pending read.
		StopInput: func() { closed.Store(true); _ = conn.Close(websocket.StatusNormalClosure, "") },
		Recv: func() ([]byte, *manager.TerminalSize, error) {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				var ce websocket.CloseError
				if errors.As(err, &ce) {
					return nil, nil, io.EOF
				}
				return nil, nil, err
			}
			if typ == websocket.MessageText {
				var size struct{ Cols, Rows uint32 }
				if json.Unmarshal(data, &size) != nil || size.Cols == 0 || size.Rows == 0 {
					return nil, nil, errors.New(`text messages must be {"cols":N,"rows":N}`)
				}
				return nil, &manager.TerminalSize{Cols: size.Cols, Rows: size.Rows}, nil
			}
			return data, nil, nil
		},
		Output: func(b []byte) error { return conn.Write(ctx, websocket.MessageBinary, b) },
		Exited: func(e manager.TerminalExit) error {
			return conn.Write(ctx, websocket.MessageText, []byte(mustJSON(map[string]any{"exit_code": e.ExitCode, "signal": e.Signal})))
		},
	})
	switch {
	case err != nil:
		_ = conn.Close(websocket.StatusInternalError, oneLine(err.Error()))
	case !closed.Load():
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// oneLine keeps an error on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
