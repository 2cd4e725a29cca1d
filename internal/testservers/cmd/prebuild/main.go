// Command prebuild builds the test servers' binaries (versitygw,
// fake-gcs-server; etcd, Kubernetes and gVisor's runsc on Linux) into the
// user cache directory before the tests run, so that no test binary spends
// its own timeout on a cold build. CI runs it before `make test`.
//
// The builds run at once: each is a `go build` of its own module graph,
// and on a cold machine much of their time is spent fetching modules and
// linking, which one build alone leaves the cores idle for. Each build
// holds its own file lock (gotool, kube), so a test binary that starts
// while prebuild runs waits for the same build instead of repeating it.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testservers/gcsserver"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testservers/kube"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/s3server"
)

// build is one cached binary to make: its name for the report and the
// function that builds it (or finds it cached) and says where it is.
type build struct {
	name  string
	linux bool // built on Linux only
	run   func(ctx context.Context) (string, error)
}

func main() {
	ctx := context.Background()
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	builds := []build{
		{name: "versitygw " + s3server.Version, run: s3server.Binary},
		// The GCS server of the gcs_mount tests (about 2.5 minutes cold on 2 cores).
		{name: "fake-gcs-server " + gcsserver.Version, run: gcsserver.Binary},
		// The Kubernetes cluster of the kubernetes provider's tests (the
		// longest build: about 10 minutes cold on 2 cores).
		{name: "kubernetes " + kubeserver.KubernetesVersion + ", etcd " + kubeserver.EtcdVersion, linux: true,
			run: func(ctx context.Context) (string, error) {
				bins, err := kubeserver.Binaries(ctx, logf)
				return bins.Dir, err
			}},
		// gVisor's runsc, for the local provider's gvisor isolation tests.
		{name: "runsc " + runsc.Version, linux: true, run: runsc.Binary},
		// gVisor's containerd shim (same gVisor version), for the test
		// cluster's gvisor RuntimeClass (kubernetes provider's tests).
		{name: runsc.ShimName + " " + runsc.Version, linux: true, run: runsc.ShimBinary},
		// The test cluster's NetworkPolicy enforcer (kube-network-policies).
		{name: "kube-network-policies " + kubeserver.NetworkPolicyVersion, linux: true, run: kubeserver.NetworkPolicyBinary},
	}
	start := time.Now()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed bool
	)
	for _, b := range builds {
		if b.linux && runtime.GOOS != "linux" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			where, err := b.run(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Fprintf(os.Stderr, "prebuild: %s: %v\n", b.name, err)
				failed = true
				return
			}
			fmt.Printf("%s: %s (%s)\n", b.name, where, time.Since(began).Round(time.Second))
		}()
	}
	wg.Wait()
	fmt.Printf("prebuild: %s\n", time.Since(start).Round(time.Second))
	if failed {
		os.Exit(1)
	}
}
