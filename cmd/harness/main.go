// Command harness is Bulkhead's trusted control plane CLI: it runs agents on
// tasks in sandboxes (`harness run`), drives sandboxes directly (`harness
// sandbox ...`) and tours the daemon's API (`harness demo`). The commands
// live in internal/cli; this main only wires the process to them.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/bulkhead-dev/bulkhead/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
