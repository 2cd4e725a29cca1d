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
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
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

// httpError writes a JSON error in Connect's shape ({"code","message"}).
func httpError(w http.ResponseWriter, err error) {
	code := connect.CodeOf(apiError(err))
	status := map[connect.Code]int{connect.CodeUnauthenticated: 401, connect.CodeNotFound: 404, connect.CodeInvalidArgument: 400,
		connect.CodePermissionDenied: 403, connect.CodeFailedPrecondition: 412, connect.CodeUnavailable: 503,
		connect.CodeResourceExhausted: 429}[code]
	if status == 0 {
		status = 500
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code.String(), "message": msg})
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
// in protobuf JSON. ?after=N starts after sequence N.
func (s *Service) serveSSE(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	after := uint64(0)
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("after")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			httpError(w, invalid("after/Last-Event-ID %q: not a sequence number", v))
			return
		}
		after = n
	}
	runID := r.PathValue("run_id")
	if err := checkRunID("run_id", runID); err != nil {
		httpError(w, err)
		return
	}
	if _, err := s.cfg.Store.GetRun(r.Context(), tenant, runID); err != nil {
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
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rc := http.NewResponseController(w)
	events := make(chan *harnessv1.RunEvent)
	errc := make(chan error, 1)
	go func() {
		errc <- s.streamEvents(ctx, tenant, runID, after, func(ev *harnessv1.RunEvent) error {
			select {
			case events <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	tick := time.NewTicker(sseHeartbeat)
	defer tick.Stop()
	mo := protojson.MarshalOptions{}
	for {
		select {
		case ev := <-events:
			data, err := mo.Marshal(ev)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.GetSequence(), eventName(ev), data); err != nil {
				return
			}
			_ = rc.Flush()
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			_ = rc.Flush()
		case err := <-errc:
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(w, "event: error\ndata: %s\n\n", mustJSON(map[string]string{"message": err.Error()}))
			} else if err == nil {
				fmt.Fprint(w, "event: end\ndata: {}\n\n")
			}
			_ = rc.Flush()
			return
		}
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// eventName is the SSE event name of an event: its kind's field name.
func eventName(ev *harnessv1.RunEvent) string {
	if od := ev.ProtoReflect().WhichOneof(ev.ProtoReflect().Descriptor().Oneofs().ByName("kind")); od != nil {
		return string(od.Name())
	}
	return "unknown"
}

// serveFile downloads a sandbox file.
func (s *Service) serveFile(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	sess, err := s.sandbox(r.Context(), tenant, r.PathValue("sandbox_id"))
	if err != nil {
		httpError(w, err)
		return
	}
	p, err := cleanPath(r.PathValue("path"))
	if err != nil {
		httpError(w, err)
		return
	}
	info, err := sess.Stat(r.Context(), p, compute.StatOptions{User: sess.Manifest().RunAs})
	if err != nil {
		httpError(w, err)
		return
	}
	if info.Type != compute.FileRegular {
		httpError(w, invalid("%s is not a regular file", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", path.Base(p)))
	if _, err := sess.ReadFile(r.Context(), p, compute.ReadFileOptions{User: sess.Manifest().RunAs}, w); err != nil {
		// Headers are gone: the short body tells the client.
		s.log.Debug("file download cut")
	}
}

// serveTerminalWS serves the terminal over a WebSocket: binary messages
// both ways carry terminal bytes; the client's text messages are JSON
// resizes {"cols":N,"rows":N}; the server's last text message is
// {"exit_code":N,"signal":"..."}. ?cols=&rows=&command= (repeatable) start
// it.
func (s *Service) serveTerminalWS(w http.ResponseWriter, r *http.Request) {
	tenant, _ := auth.Tenant(r.Context())
	sess, err := s.sandbox(r.Context(), tenant, r.PathValue("sandbox_id"))
	if err != nil {
		httpError(w, err)
		return
	}
	q := r.URL.Query()
	var size [2]uint64
	for i, k := range []string{"cols", "rows"} {
		if v := q.Get(k); v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				httpError(w, badField(k, "%q is not a number", clip(v)))
				return
			}
			size[i] = n
		}
	}
	start := &harnessv1.TerminalStart{SandboxId: r.PathValue("sandbox_id"), Command: q["command"], Cols: uint32(size[0]), Rows: uint32(size[1])}
	if err := checkTerminalStart(start); err != nil {
		httpError(w, err)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wsProtocol}})
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	closed := false
	err = s.runTerminal(ctx, sess, start, terminalIO{
		// The close handshake ends the pending read.
		stopInput: func() { closed = true; _ = conn.Close(websocket.StatusNormalClosure, "") },
		recv: func() ([]byte, *harnessv1.TerminalSize, error) {
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
				return nil, &harnessv1.TerminalSize{Cols: size.Cols, Rows: size.Rows}, nil
			}
			return data, nil, nil
		},
		output: func(b []byte) error { return conn.Write(ctx, websocket.MessageBinary, b) },
		exited: func(e *harnessv1.TerminalExited) error {
			return conn.Write(ctx, websocket.MessageText, []byte(mustJSON(map[string]any{"exit_code": e.GetExitCode(), "signal": e.GetSignal()})))
		},
	})
	switch {
	case err != nil:
		_ = conn.Close(websocket.StatusInternalError, oneLine(err.Error()))
	case !closed:
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
}
