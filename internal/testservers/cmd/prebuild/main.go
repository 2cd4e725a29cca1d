// Command prebuild builds the test servers' binaries (versitygw) into the
// user cache directory before the tests run, so that no test binary spends
// its own timeout on a cold build. CI runs it before `make test`.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testservers/s3server"
)

func main() {
	start := time.Now()
	bin, err := s3server.Binary(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "prebuild:", err)
		os.Exit(1)
	}
	fmt.Printf("versitygw %s: %s (%s)\n", s3server.Version, bin, time.Since(start).Round(time.Second))
}
