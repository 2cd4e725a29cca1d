package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// AppConfig is what the backend needs. Everything is passed in; nothing is
// global.
type AppConfig struct {
	// Runner runs the agents (it holds the model).
	Runner *harness.Runner
	// Client makes each run's sandbox.
	Client *compute.Client
	// Manifest is the workspace of each run's fresh sandbox.
	Manifest *manifest.Manifest
	// NewAgent returns a fresh agent value for a run. An Agent runs one run
	// at a time, and a resumed run needs an agent with the same name.
	NewAgent func() *harness.Agent
	// MaxTurns bounds each run (0: the harness default).
	MaxTurns int
	Log      *zap.Logger
}

// App is the backend: POST /runs starts a run and streams its events as
// Server-Sent Events. A run that reaches a call needing approval ends its
// stream with an approval_required event and waits. POST
// /runs/{id}/approvals records the decisions and streams the rest of the
// run.
type App struct {
	cfg AppConfig
	log *zap.Logger

	// ctx is the parent of every run's context; Shutdown cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closing bool
	active  sync.WaitGroup               // handlers streaming a run
	parked  map[string]*harness.RunState // runs waiting for approval, by run id
}

// NewApp returns the backend.
func NewApp(cfg AppConfig) *App {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &App{cfg: cfg, log: cfg.Log, ctx: ctx, cancel: cancel, parked: map[string]*harness.RunState{}}
}

// Handler routes the backend's requests.
func (a *App) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /runs", a.startRun)
	mux.HandleFunc("POST /runs/{id}/approvals", a.decide)
	return mux
}

// startRunRequest is the body of POST /runs.
type startRunRequest struct {
	Task string `json:"task"`
}

// decisionsRequest is the body of POST /runs/{id}/approvals: one decision
// per pending call.
type decisionsRequest struct {
	Decisions []struct {
		CallID   string `json:"call_id"`
		Approved bool   `json:"approved"`
		// Message is shown to the model when the call is rejected.
		Message string `json:"message,omitempty"`
	} `json:"decisions"`
}

func (a *App) startRun(w http.ResponseWriter, r *http.Request) {
	var req startRunRequest
	if err := decode(w, r, &req); err != nil || req.Task == "" {
		httpError(w, http.StatusBadRequest, "the body must be JSON with a non-empty \"task\"")
		return
	}
	if !a.begin() {
		httpError(w, http.StatusServiceUnavailable, "the server is shutting down")
		return
	}
	defer a.active.Done()
	id := newRunID()
	ctx, cancel := a.runContext(r.Context())
	defer cancel()
	log := a.log.With(zap.String("run", id))
	log.Info("run started")
	out := newSSE(w)
	_ = out.send("run", map[string]string{"run_id": id})
	a.relay(out, id, a.cfg.Runner.RunStreamed(ctx, a.cfg.NewAgent(), req.Task, a.runConfig()), log)
}

func (a *App) decide(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req decisionsRequest
	if err := decode(w, r, &req); err != nil || len(req.Decisions) == 0 {
		httpError(w, http.StatusBadRequest, "the body must be JSON with a non-empty \"decisions\" list")
		return
	}
	if !a.begin() {
		httpError(w, http.StatusServiceUnavailable, "the server is shutting down")
		return
	}
	defer a.active.Done()
	// Take the run out of the parked set, so two requests cannot resume it
	// twice; it goes back if the decisions are incomplete.
	a.mu.Lock()
	st := a.parked[id]
	delete(a.parked, id)
	a.mu.Unlock()
	if st == nil {
		httpError(w, http.StatusNotFound, "no run "+id+" is waiting for approval")
		return
	}
	if err := apply(st, req); err != nil {
		a.park(id, st)
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := a.runContext(r.Context())
	defer cancel()
	log := a.log.With(zap.String("run", id))
	log.Info("run resumed")
	a.relay(newSSE(w), id, a.cfg.Runner.ResumeStreamed(ctx, a.cfg.NewAgent(), st, a.runConfig()), log)
}

// apply records the decisions on the run state, all or none: every
// decision must name a pending call, and every pending call needs one.
func apply(st *harness.RunState, req decisionsRequest) error {
	decided := map[string]bool{}
	for _, d := range req.Decisions {
		decided[d.CallID] = true
	}
	pending := map[string]bool{}
	for _, p := range st.Undecided() {
		pending[p.Call.ID] = true
		if !decided[p.Call.ID] {
			return fmt.Errorf("call %s needs a decision too", p.Call.ID)
		}
	}
	for id := range decided {
		if !pending[id] {
			return fmt.Errorf("no call %s is waiting for a decision", id)
		}
	}
	for _, d := range req.Decisions {
		var err error
		if d.Approved {
			err = st.Approve(d.CallID)
		} else {
			err = st.Reject(d.CallID, d.Message)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// relay streams a run's events to the client, then its outcome: done,
// approval_required (the run is parked until POST .../approvals) or error.
// A client that goes away cancels the run; the runner then cleans up its
// sandbox.
func (a *App) relay(out *sseWriter, id string, stream *harness.Stream, log *zap.Logger) {
	for ev := range stream.Events() {
		if err := out.send(string(ev.Kind), wireEvent(ev)); err != nil {
			log.Info("client went away; cancelling the run", zap.Error(err))
			break // stops the run
		}
	}
	res, err := stream.Wait()
	switch {
	case err != nil:
		msg := err.Error()
		if a.ctx.Err() != nil {
			msg = "the server is shutting down; the run was cancelled"
		}
		log.Warn("run failed", zap.Error(err))
		_ = out.send("error", map[string]string{"run_id": id, "message": msg})
	case len(res.Interruptions) > 0:
		a.park(id, res.State)
		calls := make([]harness.ToolCall, len(res.Interruptions))
		for i, p := range res.Interruptions {
			calls[i] = p.Call
		}
		log.Info("run waiting for approval", zap.Int("calls", len(calls)))
		_ = out.send("approval_required", map[string]any{"run_id": id, "calls": calls})
	default:
		log.Info("run finished", zap.Int("turns", res.Turns))
		_ = out.send("done", map[string]any{"run_id": id, "final_output": res.FinalOutput, "turns": res.Turns,
			"input_tokens": res.Usage.InputTokens, "output_tokens": res.Usage.OutputTokens})
	}
}

// wireEvent is a run event as sent to clients: tool output as text.
func wireEvent(ev harness.Event) any {
	type event struct {
		Agent  string            `json:"agent,omitempty"`
		Turn   int               `json:"turn,omitempty"`
		Text   string            `json:"text,omitempty"`
		Call   *harness.ToolCall `json:"call,omitempty"`
		Output string            `json:"output,omitempty"`
		Result *harness.ToolOut  `json:"result,omitempty"`
	}
	return event{Agent: ev.Agent, Turn: ev.Turn, Text: ev.Text, Call: ev.Call, Output: string(ev.Output), Result: ev.Result}
}

// runConfig is the configuration of every run: a fresh sandbox from the
// manifest, owned (and cleaned up) by the runner. A run stopped for
// approval keeps its sandbox, released, until it is resumed.
func (a *App) runConfig() harness.RunConfig {
	return harness.RunConfig{MaxTurns: a.cfg.MaxTurns, Sandbox: &harness.SandboxConfig{Client: a.cfg.Client, Manifest: a.cfg.Manifest}}
}

// runContext is a run's context: it ends with the request (the client
// went away) or when the server shuts down.
func (a *App) runContext(req context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(req)
	stop := context.AfterFunc(a.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// begin counts a streaming handler in, unless the server is shutting down.
func (a *App) begin() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return false
	}
	a.active.Add(1)
	return true
}

func (a *App) park(id string, st *harness.RunState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.parked[id] = st
}

// Shutdown stops taking runs, cancels the running ones and waits for
// their handlers (the runner deletes their sandboxes), then deletes the
// sandboxes of the runs waiting for approval. Call it before
// http.Server.Shutdown, which waits for the streams to end.
func (a *App) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	a.closing = true
	a.mu.Unlock()
	a.cancel()
	done := make(chan struct{})
	go func() { a.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the runs to end: %w", ctx.Err())
	}
	a.mu.Lock()
	parked := a.parked
	a.parked = map[string]*harness.RunState{}
	a.mu.Unlock()
	var errs []error
	for id, st := range parked {
		for _, ss := range st.Sessions {
			sess, err := a.cfg.Client.Resume(ctx, ss)
			if err == nil {
				err = a.cfg.Client.Delete(ctx, sess)
			}
			if err != nil && !errors.Is(err, compute.ErrNotFound) {
				errs = append(errs, fmt.Errorf("run %s: delete sandbox %s: %w", id, ss.SessionID, err))
				continue
			}
			a.log.Info("deleted the sandbox of a run waiting for approval", zap.String("run", id), zap.String("session", ss.SessionID))
		}
	}
	return errors.Join(errs...)
}

// sseWriter writes Server-Sent Events, flushing each one.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // no proxy buffering
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// send writes one event; the data is one line of JSON.
func (s *sseWriter) send(event string, data any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // keep commands readable: > and & stay as they are
	if err := enc.Encode(data); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n", event, b.Bytes()); err != nil { // Encode ended the line
		return err
	}
	return s.rc.Flush()
}

func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "run_" + hex.EncodeToString(b[:])
}
