// Command harness is Bulkhead's trusted control plane CLI: it runs agents on
// tasks in sandboxes (`harness run`), drives sandboxes directly (`harness
// sandbox ...`) and tours the daemon's API (`harness demo`). The commands
// live in internal/cli; this main only wires the process to them.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/bulkhead-dev/bulkhead/internal/cli"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

func main() {
	// The harness holds every credential (the model API key first): no
	// process of its user, a sandbox's included, may read its environment,
	// memory or descriptors through /proc or ptrace.
	if err := local.MakeNonDumpable(); err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
