// Package runsc provides gVisor's runsc for tests of gVisor isolation.
//
// The binary is built from the Go module proxy once per machine (gVisor
// publishes a buildable `go` branch; Version pins one of its
// pseudo-versions), into the user cache directory, under a file lock so
// that test binaries running in parallel wait for one build instead of
// racing. A test that cannot have it skips through internal/testenv (and
// so fails under CI=true).
package runsc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testenv"
)

// Version is the gvisor.dev/gvisor pseudo-version (its `go` branch) the
// tests run.
const Version = "v0.0.0-20260905035102-160fafc42237"

// pkg is what `go install` builds.
const pkg = "gvisor.dev/gvisor/runsc"

// buildTimeout bounds a cold build (module download and compile: about a
// minute of two cores' time).
const buildTimeout = 20 * time.Minute

// paths returns the test servers' directory (DIR/bulkhead/testservers
// under the user cache directory; BULKHEAD_TESTSERVERS_DIR overrides it)
// and where runsc is kept in it.
func paths() (base, bin string, err error) {
	base = os.Getenv("BULKHEAD_TESTSERVERS_DIR")
	if base == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", "", fmt.Errorf("runsc: user cache dir: %w", err)
		}
		base = filepath.Join(c, "bulkhead", "testservers")
	}
	return base, filepath.Join(base, "runsc-"+Version+"-"+runtime.GOOS+"-"+runtime.GOARCH, "runsc"), nil
}

// Cached returns the runsc binary Binary built, if it is there.
func Cached() (string, bool) {
	_, bin, err := paths()
	if err != nil {
		return "", false
	}
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	return bin, true
}

// Binary returns the path of the runsc binary, building it first if
// needed: into DIR/bulkhead/testservers/runsc-VERSION-OS-ARCH under the
// user cache directory (BULKHEAD_TESTSERVERS_DIR overrides DIR).
func Binary(ctx context.Context) (string, error) {
	if runtime.GOOS != "linux" {
		return "", fmt.Errorf("runsc: gVisor runs on Linux only, not %s", runtime.GOOS)
	}
	base, bin, err := paths()
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(bin)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(base, "runsc-"+Version+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("runsc: lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("runsc: lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing the file unlocks too
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another process built it while we waited
	}
	tmp, err := os.MkdirTemp(base, ".build-runsc-")
	if err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	defer os.RemoveAll(tmp)
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("runsc: building it needs the go command on PATH: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "install", pkg+"@"+Version)
	cmd.Dir = tmp
	// Static (CGO_ENABLED=0): runsc re-executes itself inside an empty
	// chroot, where no dynamic loader is.
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Join(tmp, "bin"), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("runsc: go install %s@%s (after %s): %w\n%s", pkg, Version, time.Since(start).Round(time.Second), err, tail(out))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, "bin", "runsc"), bin); err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	return bin, nil
}

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

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
