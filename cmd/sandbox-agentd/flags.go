package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/server"
)

type logOptions struct {
	level, format string
	version       bool
	procs         procsOption
}

// DefaultGOMAXPROCS is the daemon's GOMAXPROCS unless --gomaxprocs or the
// GOMAXPROCS environment variable says otherwise. One: the daemon's work
// is mostly waiting on sockets, pipes and child processes, and with one P
// the goroutines of a call (gRPC's reader, the handler, the output pumps,
// the exit watcher, gRPC's writer) hand off on one thread instead of waking
// idle ones. Measured on 2 vCPUs in the same run against the Go default
// (make bench, 2026-11-26): 30% less daemon CPU per Exec, Exec's p50
// 50-90 µs lower, 100 concurrent commands 14-22% more per second, stdout
// streaming and file transfers as fast or faster; a large archive (zstd on
// one core instead of two) 15-20% slower. Blocking system calls (fork,
// file I/O) still run in parallel: the runtime hands the P on. Archive and
// Restore raise it while they run (--archive-gomaxprocs, Go's default
// unless set): on one P a large archive was 15-20% slower (the walk and the
// zstd encoder are a pipeline).
const DefaultGOMAXPROCS = 1

// procsOption is --gomaxprocs: explicit when the flag was given.
type procsOption struct {
	n        int
	explicit bool
	// bulk is --archive-gomaxprocs: GOMAXPROCS while an Archive or Restore
	// runs; 0: Go's default.
	bulk int
}

// bulkOr is GOMAXPROCS for Archive and Restore: --archive-gomaxprocs, or
// goDefault (the runtime's count before apply) when it is 0.
func (o procsOption) bulkOr(goDefault int) int {
	if o.bulk > 0 {
		return o.bulk
	}
	return goDefault
}

// apply sets GOMAXPROCS: the flag's value when given (0: the Go default,
// all CPUs or the cgroup's limit), otherwise DefaultGOMAXPROCS unless the
// GOMAXPROCS environment variable is set (the runtime has applied it). It
// returns the value set, 0 when it left the runtime's own.
func (o procsOption) apply() int {
	n := o.n
	if !o.explicit {
		if os.Getenv("GOMAXPROCS") != "" {
			return 0
		}
		n = DefaultGOMAXPROCS
	}
	if n <= 0 {
		return 0
	}
	runtime.GOMAXPROCS(n)
	return n
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func parseFlags(args []string) (server.Config, logOptions, error) {
	cfg := server.DefaultConfig()
	var lo logOptions
	var listen, grants listFlag
	var egressRelay string
	fs := flag.NewFlagSet("sandbox-agentd", flag.ContinueOnError)
	fs.Var(&listen, "listen", "address to serve on: unix:///path.sock or tcp://host:port (repeatable)")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "read the bearer token from this file, then remove it")
	fs.IntVar(&cfg.TokenFD, "token-fd", -1, "read the bearer token from this inherited descriptor, then close it")
	fs.BoolVar(&cfg.InsecureNoAuth, "insecure-no-auth", false, "serve without authentication (local development only)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "TLS server certificate (PEM)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "TLS server key (PEM)")
	fs.StringVar(&cfg.ClientCAFile, "tls-client-ca", "", "require client certificates signed by this CA (mTLS)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "", "serve Prometheus metrics at /metrics on this address (127.0.0.1:9464, tcp://host:port or unix:///path.sock); unauthenticated: bind it to a private address (default: off)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "how long to drain on SIGTERM")
	fs.DurationVar(&cfg.ReclaimIdle, "reclaim-idle", cfg.ReclaimIdle, "give memory back to the system once a burst of calls has been over this long (0: never)")
	fs.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "connections each --listen address keeps open at once; more are closed as soon as they are accepted (0: no cap)")
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", cfg.HandshakeTimeout, "close a connection that has not finished its TLS and HTTP/2 handshakes and made a call with the token (a health check does not count) within this long")
	fs.Int64Var(&cfg.ReclaimGrowth, "reclaim-growth-bytes", cfg.ReclaimGrowth, "under steady load, also give memory back once the runtime's memory grew this much since the last time (at most every 10 s, never during a transfer; 0: only when idle)")
	d := &cfg.Daemon
	fs.StringVar(&d.WorkspaceRoot, "workspace", d.WorkspaceRoot, "workspace root directory")
	fs.Var(&grants, "grant", "extra path outside the workspace: /abs/path or /abs/path:ro (repeatable)")
	fs.StringVar(&d.DefaultUser, "default-user", d.DefaultUser, "run_as user for requests that name none (empty: the daemon's own user)")
	fs.StringVar(&d.Shell, "shell", d.Shell, "shell for command lines")
	fs.IntVar(&d.MaxProcesses, "max-processes", d.MaxProcesses, "maximum processes running at once")
	fs.IntVar(&d.OutputBufferBytes, "output-buffer-bytes", d.OutputBufferBytes, "output kept per process")
	fs.DurationVar(&d.ExitRetention, "exit-retention", d.ExitRetention, "how long an exited process's status and output are kept")
	fs.DurationVar(&d.FollowerStallTimeout, "follower-stall-timeout", d.FollowerStallTimeout, "how long a reader that delivers nothing may hold a process's output back")
	fs.Int64Var(&d.MaxFileBytes, "max-file-bytes", d.MaxFileBytes, "largest file accepted by WriteFile (0: no limit)")
	fs.StringVar(&d.EtcRoot, "etc-root", d.EtcRoot, "directory whose etc/passwd and etc/group hold the sandbox's accounts (a private copy for local sandboxes)")
	fs.StringVar(&egressRelay, "egress-relay", "", "relay TCP connections to a loopback address to the harness's egress proxy, and point processes' HTTP(S)_PROXY at it: 127.0.0.1:3128=unix:///path/egress.sock")
	fs.StringVar(&lo.level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&lo.format, "log-format", "json", "json or console")
	fs.BoolVar(&lo.version, "version", false, "print the version and exit")
	fs.IntVar(&lo.procs.n, "gomaxprocs", DefaultGOMAXPROCS, "threads running Go code at once (0: Go's default, the CPUs or the container's CPU limit); without the flag the GOMAXPROCS environment variable is honoured")
	fs.IntVar(&lo.procs.bulk, "archive-gomaxprocs", 0, "threads running Go code at once while an archive or restore runs, when above --gomaxprocs (0: Go's default, the CPUs or the container's CPU limit)")
	if err := fs.Parse(args); err != nil {
		return cfg, lo, err
	}
	fs.Visit(func(f *flag.Flag) { lo.procs.explicit = lo.procs.explicit || f.Name == "gomaxprocs" })
	if lo.procs.n < 0 {
		return cfg, lo, fmt.Errorf("--gomaxprocs %d: want 0 or more", lo.procs.n)
	}
	if lo.procs.bulk < 0 {
		return cfg, lo, fmt.Errorf("--archive-gomaxprocs %d: want 0 or more", lo.procs.bulk)
	}
	if fs.NArg() > 0 {
		return cfg, lo, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg.Listen = listen
	for _, g := range grants {
		grant, err := agentd.ParseGrant(g)
		if err != nil {
			return cfg, lo, err
		}
		d.Grants = append(d.Grants, grant)
	}
	if egressRelay != "" {
		r, err := agentd.ParseEgressRelay(egressRelay)
		if err != nil {
			return cfg, lo, fmt.Errorf("--egress-relay: %w", err)
		}
		d.EgressRelay = &r
	}
	return cfg, lo, nil
}

func newLogger(o logOptions) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(o.level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var zc zap.Config
	switch o.format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", o.format)
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	zc.DisableStacktrace = true
	return zc.Build(zap.Fields(zap.String("component", "sandbox-agentd")))
}
