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
	"github.com/bulkhead-dev/bulkhead/internal/cli/demo"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/azuremount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/gcsmount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/s3mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/remote"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tracing/traceexport"
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
			fmt.Fprintf(s.Err, "%s: %s\n", cmd.CommandPath(), userMessage(cmd.CommandPath(), ee.msg))
		}
		return ee.code
	}
	fmt.Fprintf(s.Err, "%s: %s\n", cmd.CommandPath(), userMessage(cmd.CommandPath(), err.Error()))
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
	streams       Streams
	provider      string
	stateDir      string
	agentd        string
	isolation     string
	image         string
	dockerRuntime string // --docker-runtime
	verbose       bool
	trace         string
	// hostGrants are host directories absolute local_file/local_dir
	// sources may be read from (materializer.Options.HostGrants).
	hostGrants []string
	// labels (KEY=VALUE) go on every docker or kubernetes sandbox made,
	// and only sandboxes carrying all of them are listed or found.
	labels []string
	remote remoteFlags
	kube   kubeFlags
	// tracer is set by setupTracing for the command's run.
	tracer trace.TracerProvider
	// announce makes the local provider say on stderr which isolation its
	// sandboxes get (harness run sets it).
	announce bool
	// mountMaxBytes bounds one mount entry's objects (0: the default).
	mountMaxBytes int64
	// mounter is the Mounter of the last client made (sandbox sync and rm
	// sync writable mounts with it).
	mounter *mount.Mounter
	// s3FileSystems (--s3-file-system) say which bucket keeps each S3
	// Files file system's data (see parseS3FileSystems).
	s3FileSystems []string
	// allowDomains is the egress allow list (--allow-domain) of the
	// sandboxes the command creates.
	allowDomains []string
	// storeFlags choose the snapshot store (see snapshots).
	storeFlags storeFlags
	// observer, when set, is the Observer of the compute clients client
	// makes (harness serve sets it to its metrics).
	observer compute.Observer
	// sandboxRootFS (--sandbox-rootfs) is the local sandboxes' own root
	// file system (local.Config.RootFS).
	sandboxRootFS string
	// serverFlags name the service the sandbox commands drive (--server).
	serverFlags serverFlags
	// config (--config) and contextName (--context) choose the config
	// file and its context; ctxDefaults is the chosen context, its paths
	// resolved (see applyContext).
	config, contextName string
	ctxDefaults         namedContext
}

// allowDomainUsage documents --allow-domain.
const allowDomainUsage = "let the sandbox reach this domain through the harness's egress proxy: host, *.domain, optionally :port (default ports 80 and 443; repeatable). " +
	"Without it the sandbox has no network. Needs an isolated sandbox (bubblewrap or docker)"

// addAllowDomainFlag registers --allow-domain on a command that creates
// sandboxes.
func (g *globals) addAllowDomainFlag(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&g.allowDomains, "allow-domain", nil, allowDomainUsage)
}

// egressOptions returns the egress configuration --allow-domain asks for
// (nil when none).
func (g *globals) egressOptions() (*egress.Options, error) {
	if len(g.allowDomains) == 0 {
		return nil, nil
	}
	pol, err := egress.ParsePolicy(g.allowDomains)
	if err != nil {
		return nil, usageErr(compute.ErrInvalidArgument, "--allow-domain: %v", err)
	}
	return &egress.Options{Policy: pol}, nil
}

// localProvider makes the local provider --isolation asks for. auto takes
// bubblewrap, and never falls back to plain processes: without it, it
// fails (local.ErrNoIsolation), and plain processes must be chosen by
// name with --isolation none, which warns. --sandbox-rootfs gives the
// sandboxes a root file system of their own.
func (g *globals) localProvider(dir string, log *zap.Logger) (*local.Provider, error) {
	iso, err := local.ParseIsolation(g.isolation)
	if err != nil {
		return nil, usageErr(compute.ErrInvalidArgument, "--isolation: %v", err)
	}
	eg, err := g.egressOptions()
	if err != nil {
		return nil, err
	}
	cfg := local.Config{StateDir: dir, AgentdPath: g.agentd, Isolation: iso, Egress: eg, RootFS: g.sandboxRootFS}
	p, err := local.New(cfg, log)
	if errors.Is(err, local.ErrNoIsolation) {
		return nil, fmt.Errorf("%w (--isolation none)", err)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case p.Isolation() != local.IsolationNone:
		if g.announce {
			fmt.Fprintf(g.streams.Err, "harness: local sandboxes isolated with %s\n", p.Isolation())
		}
	case g.announce:
		fmt.Fprintln(g.streams.Err, "harness: WARNING: --isolation none: the sandbox runs as plain processes that see this host's files and network")
	default:
		// Commands on existing sandboxes (exec, cp, ls ...) pass their
		// output through: the warning came when the sandbox was made.
	}
	return p, nil
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
	pf.StringVar(&g.provider, "provider", "local", "sandbox provider: local, docker, remote or kubernetes")
	pf.StringVar(&g.stateDir, "state-dir", os.Getenv(stateDirEnv), "where sandboxes, session states and snapshots are kept (default: $"+stateDirEnv+", else the user cache dir/bulkhead; /var/lib/bulkhead for root)")
	pf.StringVar(&g.agentd, "agentd", "", "sandbox-agentd binary for local sandboxes (default: next to harness, then PATH)")
	pf.StringVar(&g.isolation, "isolation", "auto", "local sandboxes: auto (bubblewrap; fails where bwrap is missing, never falling back to plain processes), bubblewrap, gvisor (runsc on PATH), or none (plain processes that see this host's files and network: only by name)")
	pf.StringVar(&g.sandboxRootFS, "sandbox-rootfs", "", "local sandboxes: a directory holding their root file system (make rootfs writes one: bin/rootfs), shared read-only, in place of this host's /; needs bubblewrap or gvisor isolation")
	pf.StringVar(&g.image, "image", "", "docker sandboxes: the image (default bulkhead/sandbox:dev)")
	pf.StringVar(&g.dockerRuntime, "docker-runtime", "", "docker sandboxes: the engine's OCI runtime to use, e.g. runsc for gVisor (registered in the engine's daemon.json)")
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log what the harness does on stderr")
	pf.StringArrayVar(&g.labels, "label", nil, "docker and kubernetes sandboxes: KEY=VALUE label put on every container, volume, Pod and object made; only sandboxes with every --label are listed or found (repeatable)")
	pf.StringArrayVar(&g.hostGrants, "host-grant", nil, "host directory that absolute local_file/local_dir sources of a manifest may be read from (repeatable; relative sources come from the manifest's directory)")
	pf.StringVar(&g.remote.address, "address", "", "remote sandboxes: the daemon's address (unix:///path.sock or tcp://host:port)")
	pf.StringVar(&g.remote.tokenFile, "token-file", "", "remote sandboxes: file holding the daemon's token")
	pf.StringVar(&g.remote.ca, "tls-ca", "", "remote sandboxes: CA certificates of the daemon (PEM)")
	pf.StringVar(&g.remote.cert, "tls-cert", "", "remote sandboxes: client certificate for mTLS (PEM)")
	pf.StringVar(&g.remote.key, "tls-key", "", "remote sandboxes: client key for mTLS (PEM)")
	g.storeFlags.add(pf)
	g.kube.add(pf)
	pf.Int64Var(&g.mountMaxBytes, "mount-max-bytes", 0, "most bytes one s3_mount/r2_mount/gcs_mount entry may bring in (default 10 GiB); a larger bucket prefix is refused before anything is written")
	pf.StringArrayVar(&g.s3FileSystems, "s3-file-system", nil, s3FileSystemUsage)
	pf.StringVar(&g.trace, "trace", "none", "export OpenTelemetry traces: none, otlp (OTEL_EXPORTER_OTLP_* honoured) or stdout (to stderr)")
	g.serverFlags.add(pf)
	pf.StringVar(&g.config, "config", "", "the config file of named contexts (default: $"+configEnv+", else $XDG_CONFIG_HOME/bulkhead/config.yaml, else ~/.config/bulkhead/config.yaml)")
	pf.StringVar(&g.contextName, "context", "", "the named context to take defaults from (default: the config file's current context; see harness context --help)")
	groupFlags(pf)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return g.applyContext(cmd) }
	root.SetUsageFunc(groupedUsage)
	root.AddCommand(newRunCmd(g), newServeCmd(g), newDemoCmd(g), newSandboxCmd(g), newContextCmd(g), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "harness %s (%s)\n", buildinfo.Version(), buildinfo.Commit())
		},
	})
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command that only groups others
// (harness, harness sandbox, ...) print its help when called alone and
// fail with exit 2, "unknown command" and the nearest name, when called
// with a word that names none of its subcommands: cobra's default prints
// the help and exits 0, so a script calling a subcommand this version
// lacks would go on as if it had worked.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if !cmd.HasSubCommands() || cmd.Run != nil || cmd.RunE != nil {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		var names []string
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		msg := fmt.Sprintf("unknown command %q", args[0])
		if near := nearestName(args[0], names); near != "" {
			msg += fmt.Sprintf("; did you mean %q?", near)
		}
		return exitError{code: 2, msg: msg + fmt.Sprintf(" (commands: %s; see %s --help)", strings.Join(names, ", "), c.CommandPath())}
	}
}

// nearestName returns the name closest to word by edit distance, when it
// is close enough to be a plausible slip (at most half the word's length
// away, at least 1), or a name that begins with word or that word begins
// with; otherwise "".
func nearestName(word string, names []string) string {
	best, bestDist := "", max(1, len(word)/2)+1
	for _, n := range names {
		if d := editDistance(word, n); d < bestDist {
			best, bestDist = n, d
		}
	}
	if best == "" {
		for _, n := range names {
			if strings.HasPrefix(n, word) || strings.HasPrefix(word, n) {
				return n
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// remoteFlags configure the remote provider.
type remoteFlags struct {
	address, tokenFile, ca, cert, key string
}

// setupTracing builds the trace provider --trace asks for and returns the
// function flushing it (call it before the command returns).
func (g *globals) setupTracing(ctx context.Context) (func(), error) {
	if g.trace == "" || g.trace == traceexport.ExporterNone {
		return func() {}, nil
	}
	tp, shutdown, err := traceexport.NewProvider(ctx, traceexport.Config{Exporter: g.trace, Writer: g.streams.Err, ServiceName: "bulkhead-harness"})
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

// logger returns the command's logger: everything with --verbose;
// otherwise warnings and errors only (an egress refusal, a sandbox that
// could not be cleaned up), one line each without time or caller, so
// what went wrong inside a sandbox is never silent.
func (g *globals) logger() *zap.Logger {
	cfg := zap.NewDevelopmentEncoderConfig()
	level := zap.DebugLevel
	if !g.verbose {
		level = zap.WarnLevel
		cfg.TimeKey, cfg.CallerKey, cfg.StacktraceKey, cfg.NameKey = "", "", "", ""
		cfg.EncodeLevel = zapcore.LowercaseLevelEncoder
	}
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(cfg), zapcore.AddSync(g.streams.Err), level)
	return zap.New(core)
}

// stateDirEnv names the state directory when --state-dir is not given.
const stateDirEnv = "BULKHEAD_STATE_DIR"

// defaultStateDir is where state lives without --state-dir: the user cache
// directory, or /var/lib/bulkhead for root, whose home is not searchable by
// the accounts plain local sandboxes run as.
func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/bulkhead"
	}
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	return filepath.Join(c, "bulkhead")
}

// dir returns the state directory (created).
func (g *globals) dir(sub ...string) (string, error) {
	base := g.stateDir
	if base == "" {
		base = defaultStateDir()
	}
	p := filepath.Join(append([]string{base}, sub...)...)
	if err := os.MkdirAll(p, 0o711); err != nil {
		return "", fmt.Errorf("state directory: %w", err)
	}
	return p, nil
}

// client returns a compute client for the chosen provider, with the
// snapshot store --snapshot-store names, and a function releasing it.
func (g *globals) client(mat materializer.Options) (*compute.Client, func(), error) {
	store, err := g.snapshots()
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
	// Mount entries (s3_mount, r2_mount, gcs_mount): the harness reads the
	// buckets with credentials the manifest names and this process's
	// environment holds, streams the objects in, and uploads writable
	// mounts back when a session stops.
	// azure_blob_mount works the same way (account_key or sas_token from
	// the environment); s3_files_mount reads the bucket that
	// --s3-file-system names for its file system.
	fileSystems, err := parseS3FileSystems(g.s3FileSystems)
	if err != nil {
		return nil, nil, err
	}
	// Writable mounts' baselines live in the state directory, so that
	// `harness sandbox sync` and `rm` (another process than the one that
	// created the sandbox) can sync them.
	baselines, err := g.dir("mount-baselines")
	if err != nil {
		return nil, nil, err
	}
	backends := []mount.Backend{s3mount.New(s3mount.Config{FileSystems: fileSystems}), gcsmount.New(gcsmount.Config{}), azuremount.New(azuremount.Config{})}
	mounter, err := mount.New(mount.Config{Backends: backends, Secrets: mount.EnvSecrets(), MaxBytes: g.mountMaxBytes, Log: log, Baselines: mount.DirBaselines(baselines)})
	if err != nil {
		return nil, nil, usageErr(compute.ErrInvalidArgument, "--mount-max-bytes: %v", err)
	}
	mat.Mounts = mounter
	// The manifest's environment: secret references are variables of this
	// process's environment, like mount credentials; the values reach the
	// sandbox daemon's memory only.
	if mat.Secrets == nil {
		mat.Secrets = mount.EnvSecrets()
	}
	g.mounter = mounter
	opts := compute.ClientOptions{Snapshots: store, Materializer: mat, Log: log, TracerProvider: g.tracer,
		PreStopHooks: []compute.PreStopHook{mounter.PreStop}, Observer: g.observer}
	switch g.provider {
	case "local":
		dir, err := g.dir("local")
		if err != nil {
			return nil, nil, err
		}
		p, err := g.localProvider(dir, log)
		if err != nil {
			return nil, nil, err
		}
		// Close stops the egress proxies this command served.
		return compute.NewClient(p, opts), func() { _ = p.Close() }, nil
	case "docker":
		dir, err := g.dir("docker")
		if err != nil {
			return nil, nil, err
		}
		labels := map[string]string{}
		for _, l := range g.labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return nil, nil, usageErr(compute.ErrInvalidArgument, "--label %q: want KEY=VALUE", l)
			}
			labels[k] = v
		}
		eg, err := g.egressOptions()
		if err != nil {
			return nil, nil, err
		}
		p, err := docker.New(docker.Config{StateDir: dir, Image: g.image, Labels: labels, Egress: eg, Runtime: g.dockerRuntime}, log)
		if err != nil {
			return nil, nil, err
		}
		return compute.NewClient(p, opts), func() { _ = p.Close() }, nil
	case "remote":
		if len(g.allowDomains) > 0 {
			return nil, nil, usageErr(compute.ErrInvalidArgument, "--allow-domain: a remote sandbox's network is configured where it runs, not by this harness")
		}
		cfg := remote.Config{Address: g.remote.address, TokenFile: g.remote.tokenFile}
		if g.remote.ca != "" || g.remote.cert != "" || g.remote.key != "" {
			cfg.TLS = &remote.TLSConfig{CAFile: g.remote.ca, CertFile: g.remote.cert, KeyFile: g.remote.key}
		}
		p, err := remote.New(cfg, log)
		if err != nil {
			return nil, nil, err
		}
		return compute.NewClient(p, opts), func() {}, nil
	case "kubernetes":
		p, err := g.kubernetesProvider(log)
		if err != nil {
			return nil, nil, err
		}
		return compute.NewClient(p, opts), func() { _ = p.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown provider %q (local, docker, remote or kubernetes)", g.provider)
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
