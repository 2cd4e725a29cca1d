// Package cli is the harness command line: `harness run` runs an agent on
// a task in a sandbox, `harness sandbox ...` drives sandboxes directly, and
// `harness demo` tours the daemon's API. cmd/harness only calls Execute.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/internal/demo"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/remote"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tracing"
)

// Streams are the command's standard streams.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// Execute runs the command line args (without the program name) and
// returns the process exit code. Failures are reported on Err as one line.
func Execute(ctx context.Context, args []string, s Streams) int {
	root := newRoot(s)
	root.SetArgs(args)
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintf(s.Err, "%s: %s\n", cmd.CommandPath(), ee.msg)
		}
		return ee.code
	}
	fmt.Fprintf(s.Err, "%s: %s\n", cmd.CommandPath(), oneLine(err.Error()))
	return 1
}

// exitError ends the command with a specific code.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// oneLine keeps an error on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// globals are the flags every command shares.
type globals struct {
	streams   Streams
	provider  string
	stateDir  string
	agentd    string
	isolation string
	image     string
	verbose   bool
	trace     string
	// hostGrants are host directories absolute local_file/local_dir
	// sources may be read from (materializer.Options.HostGrants).
	hostGrants []string
	remote     remoteFlags
	// tracer is set by setupTracing for the command's run.
	tracer trace.TracerProvider
}

func newRoot(s Streams) *cobra.Command {
	g := &globals{streams: s}
	root := &cobra.Command{
		Use:           "harness",
		Short:         "Run AI agents against sandboxes, with every credential on this side",
		Version:       fmt.Sprintf("%s (%s)", buildinfo.Version(), buildinfo.Commit()),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.provider, "provider", "local", "sandbox provider: local, docker or remote")
	pf.StringVar(&g.stateDir, "state-dir", "", "where sandboxes, session states and snapshots are kept (default: user cache dir/bulkhead)")
	pf.StringVar(&g.agentd, "agentd", "", "sandbox-agentd binary for local sandboxes (default: next to harness, then PATH)")
	pf.StringVar(&g.isolation, "isolation", "auto", "local sandboxes: none, bubblewrap or auto")
	pf.StringVar(&g.image, "image", "", "docker sandboxes: the image (default bulkhead/sandbox:dev)")
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log what the harness does on stderr")
	pf.StringArrayVar(&g.hostGrants, "host-grant", nil, "host directory that absolute local_file/local_dir sources of a manifest may be read from (repeatable; relative sources come from the manifest's directory)")
	pf.StringVar(&g.remote.address, "address", "", "remote sandboxes: the daemon's address (unix:///path.sock or tcp://host:port)")
	pf.StringVar(&g.remote.tokenFile, "token-file", "", "remote sandboxes: file holding the daemon's token")
	pf.StringVar(&g.remote.ca, "tls-ca", "", "remote sandboxes: CA certificates of the daemon (PEM)")
	pf.StringVar(&g.remote.cert, "tls-cert", "", "remote sandboxes: client certificate for mTLS (PEM)")
	pf.StringVar(&g.remote.key, "tls-key", "", "remote sandboxes: client key for mTLS (PEM)")
	pf.StringVar(&g.trace, "trace", "none", "export OpenTelemetry traces: none, otlp (OTEL_EXPORTER_OTLP_* honoured) or stdout (to stderr)")
	root.AddCommand(newRunCmd(g), newDemoCmd(g), newSandboxCmd(g), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "harness %s (%s)\n", buildinfo.Version(), buildinfo.Commit())
		},
	})
	return root
}

// remoteFlags configure the remote provider.
type remoteFlags struct {
	address, tokenFile, ca, cert, key string
}

// setupTracing builds the trace provider --trace asks for and returns the
// function flushing it (call it before the command returns).
func (g *globals) setupTracing(ctx context.Context) (func(), error) {
	if g.trace == "" || g.trace == tracing.ExporterNone {
		return func() {}, nil
	}
	tp, shutdown, err := tracing.NewProvider(ctx, tracing.Config{Exporter: g.trace, Writer: g.streams.Err, ServiceName: "bulkhead-harness"})
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	g.tracer = tp
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			fmt.Fprintf(g.streams.Err, "harness: flushing traces: %v\n", err)
		}
	}, nil
}

// logger returns the command's logger.
func (g *globals) logger() *zap.Logger {
	if !g.verbose {
		return zap.NewNop()
	}
	cfg := zap.NewDevelopmentEncoderConfig()
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(cfg), zapcore.AddSync(g.streams.Err), zap.DebugLevel)
	return zap.New(core)
}

// dir returns the state directory (created).
func (g *globals) dir(sub ...string) (string, error) {
	base := g.stateDir
	if base == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			c = os.TempDir()
		}
		base = filepath.Join(c, "bulkhead")
	}
	p := filepath.Join(append([]string{base}, sub...)...)
	if err := os.MkdirAll(p, 0o711); err != nil {
		return "", fmt.Errorf("state directory: %w", err)
	}
	return p, nil
}

// client returns a compute client for the chosen provider, with the
// state directory's snapshot store, and a function releasing it.
func (g *globals) client(mat materializer.Options) (*compute.Client, func(), error) {
	snaps, err := g.dir("snapshots")
	if err != nil {
		return nil, nil, err
	}
	store, err := snapshot.NewLocal(snaps)
	if err != nil {
		return nil, nil, err
	}
	log := g.logger()
	for _, d := range g.hostGrants {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, nil, usageErr(compute.ErrInvalidArgument, "--host-grant %s: %v", d, err)
		}
		if abs == "/" {
			return nil, nil, usageErr(compute.ErrInvalidArgument, "--host-grant must not be the file system root")
		}
		mat.HostGrants = append(mat.HostGrants, abs)
	}
	opts := compute.ClientOptions{Snapshots: store, Materializer: mat, Log: log, TracerProvider: g.tracer}
	switch g.provider {
	case "local":
		dir, err := g.dir("local")
		if err != nil {
			return nil, nil, err
		}
		iso := local.Isolation(g.isolation)
		if g.isolation == "none" {
			iso = local.IsolationNone
		}
		p, err := local.New(local.Config{StateDir: dir, AgentdPath: g.agentd, Isolation: iso}, log)
		if err != nil {
			return nil, nil, err
		}
		return compute.NewClient(p, opts), func() {}, nil
	case "docker":
		dir, err := g.dir("docker")
		if err != nil {
			return nil, nil, err
		}
		p, err := docker.New(docker.Config{StateDir: dir, Image: g.image}, log)
		if err != nil {
			return nil, nil, err
		}
		return compute.NewClient(p, opts), func() { _ = p.Close() }, nil
	case "remote":
		cfg := remote.Config{Address: g.remote.address, TokenFile: g.remote.tokenFile}
		if g.remote.ca != "" || g.remote.cert != "" || g.remote.key != "" {
			cfg.TLS = &remote.TLSConfig{CAFile: g.remote.ca, CertFile: g.remote.cert, KeyFile: g.remote.key}
		}
		p, err := remote.New(cfg, log)
		if err != nil {
			return nil, nil, err
		}
		return compute.NewClient(p, opts), func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown provider %q (local, docker or remote)", g.provider)
}

func newDemoCmd(g *globals) *cobra.Command {
	var cfg demo.Config
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a local sandbox and drive it through the daemon's API, showing each step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.AgentdPath = g.agentd
			cfg.Verbose = g.verbose
			return demo.Run(cmd.Context(), cfg, cmd.OutOrStdout(), g.logger())
		},
	}
	return cmd
}
