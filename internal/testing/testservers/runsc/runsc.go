// Package runsc provides gVisor's runsc for tests of gVisor isolation,
// and gVisor's containerd shim (containerd-shim-runsc-v1) for the test
// Kubernetes cluster's "runsc" runtime handler.
//
// The binary is built from the Go module proxy once per machine (gVisor
// publishes a buildable `go` branch; Version pins one of its
// pseudo-versions), into the user cache directory, under a file lock so
// that test binaries running in parallel wait for one build instead of
// racing. A test that cannot have it skips through internal/testing/testenv (and
// so fails under CI=true).
package runsc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gotool"
)

// Version is the gvisor.dev/gvisor pseudo-version (its `go` branch) the
// tests run.
const Version = "v0.0.0-20260905035102-160fafc42237"

// pkg is what `go install` builds.
const pkg = "gvisor.dev/gvisor/runsc"

// buildTimeout bounds a cold build (module download and compile: about a
// minute of two cores' time).
const buildTimeout = 20 * time.Minute

// program is runsc as gotool builds it (static: runsc re-executes itself
// inside an empty chroot, where no dynamic loader is).
var program = gotool.Program{Name: "runsc", Package: pkg, Version: Version, Timeout: buildTimeout}

// ShimName is the file name containerd looks for on its PATH for the
// runtime type io.containerd.runsc.v1.
const ShimName = "containerd-shim-runsc-v1"

// shim is gVisor's containerd shim, from the same module version as runsc
// (the two speak runsc's command line and state format, so they must
// match). It builds with CGO_ENABLED=0 like runsc. `go install` names it
// after its package, "shim".
var shim = gotool.Program{Name: ShimName, Package: "gvisor.dev/gvisor/shim", Version: Version, Timeout: buildTimeout, Output: "shim"}

// Cached returns the runsc binary Binary built, if it is there.
func Cached() (string, bool) { return program.Cached() }

// ShimCached returns the shim binary ShimBinary built, if it is there.
func ShimCached() (string, bool) { return shim.Cached() }

// Paths are where Binary and ShimBinary put runsc and the shim (whether
// or not they are built yet), for configuration written before a build.
func Paths() (runscBin, shimBin string, err error) {
	if runscBin, err = program.Path(); err != nil {
		return "", "", err
	}
	if shimBin, err = shim.Path(); err != nil {
		return "", "", err
	}
	return runscBin, shimBin, nil
}

// ShimBinary returns the path of containerd-shim-runsc-v1, building it
// first if needed (once per machine, like Binary).
func ShimBinary(ctx context.Context) (string, error) {
	if runtime.GOOS != "linux" {
		return "", fmt.Errorf("runsc: gVisor runs on Linux only, not %s", runtime.GOOS)
	}
	return shim.Install(ctx)
}

// Binary returns the path of the runsc binary, building it first if
// needed (gotool: once per machine, under the user cache directory).
func Binary(ctx context.Context) (string, error) {
	if runtime.GOOS != "linux" {
		return "", fmt.Errorf("runsc: gVisor runs on Linux only, not %s", runtime.GOOS)
	}
	return program.Install(ctx)
}

func tail(b []byte) string { return gotool.Tail(b) }

// Check runs a trivial command in a gVisor sandbox (`runsc do`, no
// network) and says why gVisor cannot run here when it cannot: a machine
// (or container) may refuse what runsc needs (namespaces, ptrace or
// seccomp for its platform).
func Check(ctx context.Context, bin string) error {
	root, err := os.MkdirTemp("", "bulkhead-runsc-check-")
	if err != nil {
		return fmt.Errorf("runsc: %w", err)
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := []string{"--root", root, "--network=none", "--ignore-cgroups"}
	if os.Geteuid() != 0 {
		args = append(args, "--rootless")
	}
	cmd := exec.CommandContext(ctx, bin, append(args, "do", "/bin/true")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc does not run here (`runsc do /bin/true`): %w\n%s", err, tail(out))
	}
	return nil
}

// Require returns the runsc binary, built once and checked to run here,
// or skips the test through testenv (a failure under CI=true).
func Require(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	bin, err := Binary(ctx)
	if err == nil {
		err = Check(ctx, bin)
	}
	testenv.Require(t, testenv.Condition(err == nil, fmt.Sprint("no usable gVisor runsc: ", err)))
	return bin
}
