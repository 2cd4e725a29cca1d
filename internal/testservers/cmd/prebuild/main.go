// Command prebuild builds the test servers' binaries (versitygw, fake-gcs-server; etcd and Kubernetes on Linux) into the
// user cache directory before the tests run, so that no test binary spends
// its own timeout on a cold build. CI runs it before `make test`.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testservers/gcsserver"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testservers/kube"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/runsc"
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
	// The GCS server of the gcs_mount tests (fake-gcs-server, built from
	// the Go module proxy; about 2.5 minutes cold on 2 cores).
	start = time.Now()
	if bin, err = gcsserver.Binary(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "prebuild:", err)
		os.Exit(1)
	}
	fmt.Printf("fake-gcs-server %s: %s (%s)\n", gcsserver.Version, bin, time.Since(start).Round(time.Second))
	// The Kubernetes cluster of the kubernetes provider's tests (etcd and
	// the Kubernetes binaries, built from the Go module proxy; about 10
	// minutes cold on 2 cores, cached after).
	if runtime.GOOS == "linux" {
		start = time.Now()
		kube, err := kubeserver.Binaries(context.Background(), func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
		if err != nil {
			fmt.Fprintln(os.Stderr, "prebuild:", err)
			os.Exit(1)
		}
		fmt.Printf("kubernetes %s, etcd %s: %s (%s)\n", kubeserver.KubernetesVersion, kubeserver.EtcdVersion, kube.Dir, time.Since(start).Round(time.Second))
	}
	// gVisor's runsc, for the local provider's gvisor isolation tests
	// (about a minute of two cores' time cold).
	if runtime.GOOS == "linux" {
		start = time.Now()
		rbin, err := runsc.Binary(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, "prebuild:", err)
			os.Exit(1)
		}
		fmt.Printf("runsc %s: %s (%s)\n", runsc.Version, rbin, time.Since(start).Round(time.Second))
	}
}
