// Command sandbox-agentd is the daemon baked into every Bulkhead sandbox
// image. It serves the agentd gRPC API (processes, files, patches) over a
// unix socket or TCP, authenticated by a per-sandbox token.
//
// The main is thin: flags (flags.go) become a server.Config, then
// server.Run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/server"
)

func main() {
	surviveBrokenStdio()
	cfg, logOpts, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agentd:", err)
		os.Exit(2)
	}
	if logOpts.version {
		fmt.Printf("sandbox-agentd %s (%s)\n", buildinfo.Version(), buildinfo.Commit())
		return
	}
	log, err := newLogger(logOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agentd:", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	// Before apply: the CPUs, the cgroup's limit or $GOMAXPROCS.
	goDefault := runtime.GOMAXPROCS(0)
	if n := logOpts.procs.apply(); n > 0 {
		log.Debug("scheduler", zap.Int("gomaxprocs", n))
	}
	cfg.BulkGOMAXPROCS = logOpts.procs.bulkOr(goDefault)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := server.Run(ctx, cfg, log); err != nil {
		log.Error("sandbox-agentd failed", zap.Error(err))
		log.Sync() //nolint:errcheck
		os.Exit(1)
	}
}

// surviveBrokenStdio keeps the daemon alive when its stdout or stderr is a
// pipe nobody reads any more (the harness that started it died): without
// it, Go's runtime kills the process with SIGPIPE on the next log write to
// descriptor 1 or 2. With SIGPIPE delivered to a channel (never read: the
// runtime drops what does not fit), such a write fails with EPIPE instead,
// which the logger drops.
//
// signal.Notify, not signal.Ignore: Ignore sets SIG_IGN, which survives
// fork and exec, so every process the daemon starts would ignore SIGPIPE
// too and `yes | head -1` would no longer end the way it does in a normal
// shell. A signal the runtime handles is reset to SIG_DFL in the child
// before exec, so sandbox processes keep the default disposition.
func surviveBrokenStdio() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}
