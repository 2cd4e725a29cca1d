package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
)

// Request is one request the server received, with its body decoded.
type Request struct {
	// N is the request's 1-based position among all requests to the server.
	N      int
	Method string
	Path   string
	Header http.Header
	// Raw is the body as received; Body is the same body decoded.
	Raw  []byte
	Body map[string]any
}

// Stream reports whether the request asked for a server-sent event stream.
func (r *Request) Stream() bool { b, _ := r.Body["stream"].(bool); return b }

// Model returns the requested model name.
func (r *Request) Model() string { s, _ := r.Body["model"].(string); return s }

// Instructions returns the request's instructions, or "".
func (r *Request) Instructions() string { s, _ := r.Body["instructions"].(string); return s }

// Input returns the input items. A string input is returned as one user
// message item.
func (r *Request) Input() []map[string]any {
	switch in := r.Body["input"].(type) {
	case string:
		return []map[string]any{{"type": "message", "role": "user", "content": in}}
	case []any:
		return objects(in)
	}
	return nil
}

// InputOfType returns the input items whose "type" is typ. Messages sent in
// the short form without a type are reported as "message".
func (r *Request) InputOfType(typ string) []map[string]any {
	var out []map[string]any
	for _, it := range r.Input() {
		t, _ := it["type"].(string)
		if t == "" && it["role"] != nil {
			t = "message"
		}
		if t == typ {
			out = append(out, it)
		}
	}
	return out
}

// ContextManagement returns the request's context_management entries
// (e.g. {"type": "compaction", "compact_threshold": json.Number("240000")}),
// or nil when it sent none.
func (r *Request) ContextManagement() []map[string]any {
	in, _ := r.Body["context_management"].([]any)
	if in == nil {
		return nil
	}
	return objects(in)
}

// CompactThreshold returns the compact_threshold of the request's compaction
// context management entry; ok is false when there is no compaction entry.
// A compaction entry without an integer threshold reports 0.
func (r *Request) CompactThreshold() (threshold int64, ok bool) {
	for _, e := range r.ContextManagement() {
		if e["type"] != "compaction" {
			continue
		}
		n, _ := e["compact_threshold"].(json.Number)
		v, _ := n.Int64()
		return v, true
	}
	return 0, false
}

// Tools returns the tool definitions the request offered.
func (r *Request) Tools() []map[string]any {
	in, _ := r.Body["tools"].([]any)
	return objects(in)
}

// Tool returns the tool definition named name, or nil.
func (r *Request) Tool(name string) map[string]any {
	for _, t := range r.Tools() {
		if t["name"] == name {
			return t
		}
	}
	return nil
}

func objects(in []any) []map[string]any {
	out := make([]map[string]any, 0, len(in))
	for _, v := range in {
		if m, ok := v.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// Server is a scripted Responses API server. Create one with [NewServer]; it
// is safe for concurrent use.
type Server struct {
	hs   *httptest.Server
	done chan struct{}

	mu        sync.Mutex
	queue     []Responder
	fallback  Responder
	requests  []*Request
	received  int
	discard   bool
	responses int
	failures  []string
	closeOnce sync.Once
}

// NewServer starts a server on a loopback port whose queue holds turns, in
// order. Close it when done.
func NewServer(turns ...Turn) *Server {
	s := &Server{done: make(chan struct{})}
	s.Enqueue(turns...)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/responses", s.serve)
	mux.HandleFunc("POST /responses", s.serve)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(fmt.Sprintf("unexpected request %s %s", r.Method, r.URL.Path))
		writeError(w, http.StatusNotFound, "no such route: "+r.URL.Path, "", nil)
	})
	s.hs = httptest.NewServer(mux)
	return s
}

// URL is the server's base URL including /v1, the value to give a client as
// its base URL (OPENAI_BASE_URL).
func (s *Server) URL() string { return s.hs.URL + "/v1" }

// Close stops the server, releasing any stalled stream first. It is safe to
// call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.hs.CloseClientConnections()
		s.hs.Close()
	})
}

// Enqueue appends fixed turns to the script.
func (s *Server) Enqueue(turns ...Turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range turns {
		s.queue = append(s.queue, func(*Request) Turn { return t })
	}
}

// EnqueueFunc appends responders to the script; each answers one request.
func (s *Server) EnqueueFunc(rs ...Responder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, rs...)
}

// SetFallback sets the responder used once the queue is empty. Without one, a
// request to an exhausted script is answered 500 and recorded as a failure.
func (s *Server) SetFallback(r Responder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fallback = r
}

// DiscardRequests stops keeping the requests received (Requests returns
// those kept before): a long-lived server, such as the model of `harness
// serve --replay`, would otherwise keep every conversation it was sent.
func (s *Server) DiscardRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.discard = true
}

// Requests returns the requests received so far, in order.
func (s *Server) Requests() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Request(nil), s.requests...)
}

// Remaining returns the number of queued turns not yet used.
func (s *Server) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Err reports script violations seen so far (requests that could not be
// decoded, an exhausted script, unknown routes), or nil.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) == 0 {
		return nil
	}
	return errors.New("replay: " + strings.Join(s.failures, "; "))
}

func (s *Server) fail(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, msg)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		s.fail("reading request body: " + err.Error())
		writeError(w, http.StatusBadRequest, "unreadable body", "", nil)
		return
	}
	req := &Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Raw: raw}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&req.Body); err != nil {
		s.fail("decoding request body: " + err.Error())
		writeError(w, http.StatusBadRequest, "invalid JSON body", "", nil)
		return
	}

	s.mu.Lock()
	s.received++
	req.N = s.received
	if !s.discard {
		s.requests = append(s.requests, req)
	}
	var next Responder
	if len(s.queue) > 0 {
		next, s.queue = s.queue[0], s.queue[1:]
	} else {
		next = s.fallback
	}
	s.mu.Unlock()

	requestID := fmt.Sprintf("req_%d", req.N)
	w.Header().Set("x-request-id", requestID)
	if next == nil {
		s.fail(fmt.Sprintf("request %d: script exhausted", req.N))
		writeError(w, http.StatusInternalServerError, "replay: script exhausted", "server_error", nil)
		return
	}
	turn := next(req)
	if f := turn.Fault; f != nil && f.Status != 0 {
		writeError(w, f.Status, f.Message, "", f)
		return
	}

	s.mu.Lock()
	s.responses++
	n := s.responses
	s.mu.Unlock()
	b := newBuilder(turn, n, req)
	if req.Stream() {
		s.stream(w, r, b, turn.Fault)
		return
	}
	body, _ := json.Marshal(b.final())
	w.Header().Set("Content-Type", "application/json")
	if f := turn.Fault; f != nil && (f.DropAfterEvents > 0 || f.StallAfterEvents > 0) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body[:len(body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		if f.StallAfterEvents > 0 {
			s.stall(r)
		}
		panic(http.ErrAbortHandler)
	}
	_, _ = w.Write(body)
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, b *builder, f *Fault) {
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for i, ev := range b.events() {
		if f != nil && f.DropAfterEvents > 0 && i >= f.DropAfterEvents {
			// Abort without the terminating chunk: the client sees the
			// connection die mid-body, as with a network failure.
			panic(http.ErrAbortHandler)
		}
		if f != nil && f.StallAfterEvents > 0 && i >= f.StallAfterEvents {
			s.stall(r)
			panic(http.ErrAbortHandler)
		}
		data, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], data); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
	}
}

// stall blocks until the client goes away or the server is closed.
func (s *Server) stall(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-s.done:
	}
}

// writeError answers with an OpenAI-style error body.
func writeError(w http.ResponseWriter, status int, msg, typ string, f *Fault) {
	if msg == "" {
		msg = fmt.Sprintf("scripted failure: %d %s", status, http.StatusText(status))
	}
	if typ == "" {
		switch {
		case status == http.StatusTooManyRequests:
			typ = "rate_limit_exceeded"
		case status >= 500:
			typ = "server_error"
		default:
			typ = "invalid_request_error"
		}
	}
	if f != nil {
		if f.RetryAfter != "" {
			w.Header().Set("Retry-After", f.RetryAfter)
		}
		if f.RetryAfterMS != "" {
			w.Header().Set("retry-after-ms", f.RetryAfterMS)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": typ,
	}})
	_, _ = w.Write(body)
}
