// Command http-backend embeds the Bulkhead harness in a Go HTTP backend.
// POST /runs starts an agent run in a fresh sandbox and streams its events
// as Server-Sent Events. Commands outside a small allow-list stop the run
// for approval, and POST /runs/{id}/approvals approves or rejects them and
// streams the rest. On SIGINT or SIGTERM the server stops taking runs,
// cancels the running ones, deletes every sandbox it made, and exits.
//
// The model is the OpenAI Responses API (OPENAI_API_KEY, OPENAI_BASE_URL),
// or a recorded session served locally with --replay.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// config is what the flags set.
type config struct {
	Addr       string
	Manifest   string // workspace manifest of each run ("" : an empty workspace)
	StateDir   string // local sandboxes ("" : the user cache directory)
	AgentdPath string // sandbox-agentd ("" : next to this program, then PATH)
	Isolation  local.Isolation
	Model      string // model name
	Replay     string // serve this recorded session instead of calling a model
}

func main() {
	var cfg config
	var isolation string
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:8080", "listen address")
	flag.StringVar(&cfg.Manifest, "manifest", "", "workspace manifest of each run's sandbox (default: an empty workspace)")
	flag.StringVar(&cfg.StateDir, "state-dir", "", "where local sandboxes live (default: the user cache directory)")
	flag.StringVar(&cfg.AgentdPath, "agentd", "", "sandbox-agentd binary (default: next to this program, then PATH)")
	flag.StringVar(&isolation, "isolation", "auto", "local sandbox isolation: none, bubblewrap or auto")
	flag.StringVar(&cfg.Model, "model", "gpt-5.1", "model name")
	flag.StringVar(&cfg.Replay, "replay", "", "serve this recorded model session instead of calling a model (offline)")
	flag.Parse()
	iso, err := local.ParseIsolation(isolation)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg.Isolation = iso
	log, err := zap.NewDevelopment(zap.AddStacktrace(zapcore.DPanicLevel))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("http-backend failed", zap.Error(err))
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down gracefully.
func run(ctx context.Context, cfg config, log *zap.Logger) error {
	m := &manifest.Manifest{}
	if cfg.Manifest != "" {
		var err error
		if m, err = manifest.LoadTrustedFile(cfg.Manifest); err != nil {
			return err
		}
	}
	mdl, closeModel, err := newModel(cfg, log)
	if err != nil {
		return err
	}
	defer closeModel()
	client, err := local.NewClient(local.Config{StateDir: cfg.StateDir, AgentdPath: cfg.AgentdPath, Isolation: cfg.Isolation},
		compute.ClientOptions{Log: log.Named("compute")})
	if err != nil {
		return err
	}
	app := NewApp(AppConfig{
		Runner:   &harness.Runner{Model: mdl, ModelName: cfg.Model, Log: log.Named("runner")},
		Client:   client,
		Manifest: m,
		NewAgent: newAgent,
		Log:      log,
	})
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving", zap.String("addr", ln.Addr().String()))

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The runs first (their streams end, their sandboxes are deleted), then
	// the HTTP server (which waits for the handlers).
	err = app.Shutdown(sctx)
	if serr := srv.Shutdown(sctx); serr != nil {
		err = errors.Join(err, serr)
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// newAgent is the agent of every run. Plain ls, cat, head, wc and grep run
// freely; any other command needs a human's approval.
func newAgent() *harness.Agent {
	return &harness.Agent{
		Name:         "assistant",
		Instructions: "Work on the user's task in the sandbox's workspace and finish with a short summary.",
		Approvals: map[string]harness.ApprovalPolicy{
			"exec_command": harness.CommandsOutside(regexp.MustCompile(`(ls|cat|head|wc|grep)( [-\w./]+)*`)),
		},
	}
}

// newModel returns the model: a recorded session served locally, or the
// OpenAI Responses API.
func newModel(cfg config, log *zap.Logger) (model.Model, func(), error) {
	if cfg.Replay == "" {
		m, err := model.NewOpenAI(model.Config{Model: cfg.Model, Logger: log.Named("model")})
		return m, func() {}, err
	}
	rec, err := replay.LoadRecording(cfg.Replay)
	if err != nil {
		return nil, nil, err
	}
	turns := rec.ScriptTurns()
	srv := replay.NewServer(turns...)
	// Each time the recording is used up, it starts over for the next run.
	srv.SetFallback(func(*replay.Request) replay.Turn {
		srv.Enqueue(turns[1:]...)
		return turns[0]
	})
	m, err := model.NewOpenAI(model.Config{Model: cfg.Model, APIKey: "replay", BaseURL: srv.URL(), Logger: log.Named("model"),
		Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	log.Warn("replaying a recorded model session: no model is called; the sandboxes and commands are real", zap.String("recording", cfg.Replay))
	return m, srv.Close, nil
}
