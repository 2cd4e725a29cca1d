// Command kubetools builds the test cluster's binaries (kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet, etcd, the NetworkPolicy
// enforcer and the pause program) into the user cache directory, the way
// the tests do (kubeserver.Binaries), and prints where they are.
// `make kube-tools` runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
)

func main() {
	start := time.Now()
	bins, err := kubeserver.Binaries(context.Background(), func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubetools:", err)
		os.Exit(1)
	}
	fmt.Printf("kubernetes %s, etcd %s: %s (%s)\n", kubeserver.KubernetesVersion, kubeserver.EtcdVersion, bins.Dir, time.Since(start).Round(time.Second))
}
