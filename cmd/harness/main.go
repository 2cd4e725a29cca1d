// Command harness is Bulkhead's trusted control plane CLI. Today it has one
// subcommand, `demo`, which starts a local sandbox and drives it through the
// agentd API; the agent runner (`harness run`) and sandbox management
// (`harness sandbox ...`) build on the same packages.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/internal/demo"
)

func usage() {
	fmt.Fprintf(os.Stderr, `harness %s

usage:
  harness demo [--agentd PATH] [--verbose]   start a local sandbox and drive it through sandbox-agentd
  harness version
`, buildinfo.Version())
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "demo":
		var cfg demo.Config
		fs := flag.NewFlagSet("demo", flag.ExitOnError)
		fs.StringVar(&cfg.AgentdPath, "agentd", "", "path to sandbox-agentd (default: next to harness, then PATH)")
		fs.BoolVar(&cfg.Verbose, "verbose", false, "show the daemon's log")
		_ = fs.Parse(os.Args[2:])
		log := zap.NewNop()
		if cfg.Verbose {
			log, _ = zap.NewDevelopment()
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := demo.Run(ctx, cfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "harness demo:", err)
			os.Exit(1)
		}
	case "version", "--version":
		fmt.Printf("harness %s (%s)\n", buildinfo.Version(), buildinfo.Commit())
	case "help", "-h", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "harness: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
}
