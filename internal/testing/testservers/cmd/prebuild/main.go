// Command prebuild builds the test servers' binaries (versitygw,
// fake-gcs-server; on Linux Kubernetes, etcd and a NetworkPolicy enforcer,
// gVisor's runsc and its containerd shim) into the
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
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gcsserver"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
)

// build is one cached binary to make: its name for the report and the
// function that builds it (or finds it cached) and says where it is.
type build struct {
	key   string // what -only names it
	name  string
	linux bool // built on Linux only
	run   func(ctx context.Context) (string, error)
}

func main() {
	only := flag.String("only", "", "build only these (comma-separated: s3, gcs, kube, gvisor)")
	flag.Parse()
	ctx := context.Background()
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	builds := []build{
		{key: "s3", name: "versitygw " + s3server.Version, run: s3server.Binary},
		// The GCS server of the gcs_mount tests (about 2 CPU-minutes cold).
		{key: "gcs", name: "fake-gcs-server " + gcsserver.Version, run: gcsserver.Binary},
		// The Kubernetes cluster of the kubernetes provider's tests, with
		// etcd and its NetworkPolicy enforcer, in one go build (the
		// longest: about 12 CPU-minutes cold).
		{key: "kube", name: "kubernetes " + kubeserver.KubernetesVersion + ", etcd " + kubeserver.EtcdVersion +
			", kube-network-policies " + kubeserver.NetworkPolicyVersion, linux: true,
			run: func(ctx context.Context) (string, error) {
				bins, err := kubeserver.Binaries(ctx, logf)
				return bins.Dir, err
			}},
		// gVisor's runsc, for the local provider's gvisor isolation tests,
		// then its containerd shim (same gVisor version), for the test
		// cluster's gvisor RuntimeClass: one after the other, so that the
		// shim's build finds the gVisor packages the two share compiled
		// in the Go build cache instead of compiling them at the same time.
		{key: "gvisor", name: "runsc and " + runsc.ShimName + " " + runsc.Version, linux: true,
			run: func(ctx context.Context) (string, error) {
				if _, err := runsc.Binary(ctx); err != nil {
					return "", err
				}
				return runsc.ShimBinary(ctx)
			}},
	}
	start := time.Now()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed bool
	)
	// -only: the keys asked for (none: every build).
	wanted := map[string]bool{}
	for _, k := range strings.Split(*only, ",") {
		if k = strings.TrimSpace(k); k != "" {
			wanted[k] = true
		}
	}
	for k := range wanted {
		if !slices.ContainsFunc(builds, func(b build) bool { return b.key == k }) {
			fmt.Fprintf(os.Stderr, "prebuild: -only: no build is called %q (s3, gcs, kube, gvisor)\n", k)
			os.Exit(2)
		}
	}
	for _, b := range builds {
		if b.linux && runtime.GOOS != "linux" || len(wanted) > 0 && !wanted[b.key] {
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
	// The builds' processor time (the go commands and the compilers and
	// linkers they ran): on a machine of N cores a cold prebuild takes at
	// least this divided by N.
	var ru syscall.Rusage
	cpu := ""
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		cpu = fmt.Sprintf(", %s user + %s system CPU", time.Duration(ru.Utime.Nano()).Round(time.Second), time.Duration(ru.Stime.Nano()).Round(time.Second))
	}
	fmt.Printf("prebuild: %s%s\n", time.Since(start).Round(time.Second), cpu)
	if failed {
		os.Exit(1)
	}
}
