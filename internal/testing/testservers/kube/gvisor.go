package kubeserver

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
)

// gVisor on the node. Its containerd always has a runtime handler
// GVisorHandler (runtime type io.containerd.runsc.v1) whose shim and runsc
// are the binaries internal/testing/testservers/runsc builds into the user cache
// directory (the shim reached through a wrapper on containerd's PATH):
// configuration costs nothing at start, and the handler works
// as soon as the binaries are there (containerd looks for the shim when it
// starts a Pod's sandbox, not at its own start). The RuntimeClass
// GVisorRuntimeClass, which is what Pods name, is created only once both
// binaries are available: at start when they are cached (prebuild builds
// them), or by RequireGVisor, which builds them first. A cluster whose
// tests never ask for gVisor starts exactly as fast as before.
const (
	// GVisorRuntimeClass is the RuntimeClass that runs Pods under gVisor.
	GVisorRuntimeClass = "gvisor"
	// GVisorHandler is its containerd runtime handler.
	GVisorHandler = "runsc"
)

// gvisorRoot is runsc's state directory for the node's Pods (runsc adds
// the containerd namespace, k8s.io): under Dir rather than runsc's default
// /run/containerd/runsc, so that clusters side by side do not share it,
// Stop's cleanup (processes naming Dir, mounts under Dir) covers it, and a
// test can ask runsc which containers it runs (GVisorContainers).
func (c *Cluster) gvisorRoot() string { return filepath.Join(c.Dir, "containerd", "runsc") }

// gvisorContainerdConfig is the containerd CRI configuration of the
// runtime handler GVisorHandler, appended to the node's config.toml, and
// writes the shim's own TOML options next to it (the runsc binary, its
// root, the shim's log). On cgroup v1 with the cgroupfs driver runsc takes
// the Pod's cgroup path from the kubelet as runc does; no systemd.
func (c *Cluster) gvisorContainerdConfig() (string, error) {
	runscBin, shimBin, err := runsc.Paths()
	if err != nil {
		return "", fmt.Errorf("kubeserver: gvisor: %w", err)
	}
	d := filepath.Join(c.Dir, "containerd")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", fmt.Errorf("kubeserver: %w", err)
	}
	// containerd 1.6 finds a v2 shim by name on its PATH (its
	// runtime_path setting does not apply to v2 shims): the node's
	// containerd has gvisorBinDir first on its PATH, with the shim linked
	// there (dangling until the shim is built).
	if err := os.MkdirAll(c.gvisorBinDir(), 0o755); err != nil {
		return "", fmt.Errorf("kubeserver: %w", err)
	}
	if err := c.linkGVisorShim(shimBin); err != nil {
		return "", err
	}
	opts := fmt.Sprintf(`binary_name = %q
root = %q
log_path = %q
log_level = "warning"
`, runscBin, c.gvisorRoot(), filepath.Join(c.Dir, "logs", "runsc-shim-%ID%.log"))
	optsFile := filepath.Join(d, "runsc.toml")
	if err := os.WriteFile(optsFile, []byte(opts), 0o644); err != nil {
		return "", fmt.Errorf("kubeserver: %w", err)
	}
	return fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[1]s]
  runtime_type = "io.containerd.runsc.v1"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[1]s.options]
    TypeUrl = "io.containerd.runsc.v1.options"
    ConfigPath = %[2]q
`, GVisorHandler, optsFile), nil
}

// linkGVisorShim puts gVisor's shim in gvisorBinDir, as a wrapper script
// that adapts it to this node, for two reasons:
//
//   - gVisor's shim is built on containerd 2's shim library, whose `start`
//     prints its bootstrap parameters as JSON ({"version":2,"address":...,
//     "protocol":"ttrpc"}); Debian's containerd 1.6 expects the bare
//     address. For `start` the wrapper prints only the address (the task
//     API, version 2 over ttrpc, is the one 1.6 speaks).
//   - On a machine whose root lacks CAP_SYS_RESOURCE (a container, like
//     the CI's), the shim's `start` fails setting its daemon's
//     oom_score_adj to -999, unless it believes it runs in a user
//     namespace (containerd's sys.SetOOMScore then skips EPERM). There the
//     wrapper runs the shim in a mount namespace of its own (slave: the
//     host's later mounts still reach it) where the shim's own
//     /proc/PID/uid_map reads as a user namespace's, so the refused score
//     is skipped, as in a rootless setup; the daemon keeps the default
//     score. The node's containerd sets restrict_oom_score_adj for the
//     same reason.
func (c *Cluster) linkGVisorShim(shimBin string) error {
	link := filepath.Join(c.gvisorBinDir(), runsc.ShimName)
	run := shellQuote(shimBin) + ` "$@"`
	if !hasCapSysResource() {
		fakeMap := filepath.Join(c.gvisorBinDir(), "uid_map")
		if err := os.WriteFile(fakeMap, []byte("         0          0          1\n"), 0o644); err != nil {
			return fmt.Errorf("kubeserver: %w", err)
		}
		run = `unshare --mount --propagation slave /bin/sh -c 'mount --bind "$0" /proc/$$/uid_map && exec "$@"' ` +
			shellQuote(fakeMap) + " " + run
	}
	script := `#!/bin/sh
# gVisor's containerd shim for containerd 1.6 (see gvisor.go, linkGVisorShim).
case " $* " in
*" start "*)
	out=$(` + run + `) || { printf '%s\n' "$out"; exit 1; }
	addr=$(printf '%s' "$out" | sed -n 's/.*"address":"\([^"]*\)".*/\1/p')
	printf '%s' "${addr:-$out}"
	;;
*) exec ` + run + ` ;;
esac
`
	if err := os.WriteFile(link, []byte(script), 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return nil
}

// hasCapSysResource reports whether this process has CAP_SYS_RESOURCE.
func hasCapSysResource() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<24) != 0 // CAP_SYS_RESOURCE is 24
		}
	}
	return false
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// gvisorBinDir holds the link to gVisor's shim, first on the node's
// containerd's PATH.
func (c *Cluster) gvisorBinDir() string { return filepath.Join(c.Dir, "containerd", "bin") }

// containerdPath is the PATH the node's containerd runs with.
func (c *Cluster) containerdPath() string {
	return "PATH=" + c.gvisorBinDir() + string(os.PathListSeparator) + os.Getenv("PATH")
}

// gvisorCached reports whether runsc and its shim are both built.
func gvisorCached() bool {
	_, ok1 := runsc.Cached()
	_, ok2 := runsc.ShimCached()
	return ok1 && ok2
}

// createGVisorRuntimeClass creates the RuntimeClass GVisorRuntimeClass
// (handler GVisorHandler); one already there is fine.
func (c *Cluster) createGVisorRuntimeClass(ctx context.Context) error {
	rc := map[string]any{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
		"metadata": map[string]any{"name": GVisorRuntimeClass}, "handler": GVisorHandler}
	if err := c.Do(ctx, http.MethodPost, "/apis/node.k8s.io/v1/runtimeclasses", rc, nil); err != nil && !IsAlreadyExists(err) {
		return fmt.Errorf("kubeserver: RuntimeClass %s: %w", GVisorRuntimeClass, err)
	}
	return nil
}

// RequireGVisor makes gVisor available to the cluster's Pods and returns
// the RuntimeClass to name (GVisorRuntimeClass). It builds runsc and its
// containerd shim if they are not cached yet (once per machine, several
// minutes cold: `make kube-tools` or prebuild does it ahead), checks that
// runsc runs here, and creates the RuntimeClass. Where gVisor cannot run
// the test skips through testenv (fails under CI=true).
func (c *Cluster) RequireGVisor(t testing.TB) string {
	t.Helper()
	if !gvisorCached() {
		type deadliner interface{ Deadline() (time.Time, bool) }
		if d, ok := t.(deadliner); ok {
			if dl, ok := d.Deadline(); ok && time.Until(dl) < 15*time.Minute {
				testenv.Skip(t, "gVisor's runsc and containerd shim are not built yet, and a cold build (several minutes "+
					"on 2 cores) may not fit this test binary's -timeout: run `go run ./internal/testing/testservers/cmd/prebuild` first")
			}
		}
	}
	// unshare and mount for the shim's wrapper (linkGVisorShim); runsc
	// built and checked to run here.
	testenv.Require(t, testenv.Tool("unshare"), testenv.Tool("mount"))
	runsc.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	_, err := runsc.ShimBinary(ctx)
	testenv.Require(t, testenv.Condition(err == nil, fmt.Sprint("no gVisor containerd shim: ", err)))
	if err := c.createGVisorRuntimeClass(ctx); err != nil {
		t.Fatal(err)
	}
	return GVisorRuntimeClass
}

// GVisorContainers lists the containers (containerd IDs) that the node's
// runsc runs: proof, from the host, that a Pod runs under gVisor.
func (c *Cluster) GVisorContainers(ctx context.Context) ([]string, error) {
	bin, ok := runsc.Cached()
	if !ok {
		return nil, fmt.Errorf("kubeserver: runsc is not built")
	}
	root := filepath.Join(c.gvisorRoot(), "k8s.io")
	if _, err := os.Stat(root); os.IsNotExist(err) {
		return nil, nil // runsc has run nothing yet
	}
	out, err := exec.CommandContext(ctx, bin, "--root", root, "list", "--quiet").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kubeserver: runsc list: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return strings.Fields(string(out)), nil
}
