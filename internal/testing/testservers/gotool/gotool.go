// Package gotool builds the Go programs the tests run as servers (an S3
// gateway, a GCS emulator, gVisor's runsc) from the Go module proxy, once
// per machine: `go install PKG@VERSION` into a cache directory, under a
// file lock so that test binaries running in parallel build it once, and
// renamed into place only when complete. It also starts such a server
// the same way for each (serve.go): on a free loopback port, in a process
// group of its own that dies with the test binary, polled until ready.
package gotool

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Program is a Go program to install: the binary Name of package Package
// at module version Version.
type Program struct {
	Name    string
	Package string
	Version string
	// Timeout bounds the build (default 20 minutes); StartTest's build
	// and start together.
	Timeout time.Duration
	// Output is the file `go install` writes, when it is not Name (go
	// names it after the package's last element: gVisor's shim package
	// "shim" is installed as containerd-shim-runsc-v1).
	Output string
	// Build, when set, builds the program instead of `go install
	// Package@Version` (for a program that needs a main of its own or a
	// patch): it writes the binary to out, working in dir, a fresh
	// directory removed afterwards. The cache and lock are the same.
	Build func(ctx context.Context, dir, out string) error
}

// defaultBuildTimeout bounds a build whose Program sets no Timeout.
const defaultBuildTimeout = 20 * time.Minute

// timeout is p.Timeout, or defaultBuildTimeout when it is not set.
func (p Program) timeout() time.Duration {
	if p.Timeout <= 0 {
		return defaultBuildTimeout
	}
	return p.Timeout
}

// CacheDir is DIR/bulkhead/testservers under the user cache directory
// (BULKHEAD_TESTSERVERS_DIR overrides it).
func CacheDir() (string, error) {
	if base := os.Getenv("BULKHEAD_TESTSERVERS_DIR"); base != "" {
		return base, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("user cache dir: %w", err)
	}
	return filepath.Join(c, "bulkhead", "testservers"), nil
}

// Path is where p's binary lives once built:
// CacheDir/NAME-VERSION-OS-ARCH/NAME.
func (p Program) Path() (string, error) {
	base, err := CacheDir()
	if err != nil {
		return "", fmt.Errorf("%s: %w", p.Name, err)
	}
	return filepath.Join(base, p.Name+"-"+p.Version+"-"+runtime.GOOS+"-"+runtime.GOARCH, p.Name), nil
}

// Cached returns p's binary if it is built.
func (p Program) Cached() (string, bool) {
	bin, err := p.Path()
	if err != nil {
		return "", false
	}
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	return bin, true
}

// Install returns p's binary, building it first if needed (static:
// CGO_ENABLED=0, no VCS stamping, outside any workspace).
func (p Program) Install(ctx context.Context) (string, error) {
	bin, err := p.Path()
	if err != nil {
		return "", err
	}
	base := filepath.Dir(filepath.Dir(bin))
	defer p.tidy(base, filepath.Dir(bin))
	if b, ok := p.Cached(); ok {
		return b, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("%s: %w", p.Name, err)
	}
	lock, err := os.OpenFile(filepath.Join(base, p.Name+"-"+p.Version+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("%s: lock: %w", p.Name, err)
	}
	defer lock.Close() // closing the file unlocks it
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("%s: lock: %w", p.Name, err)
	}
	if b, ok := p.Cached(); ok {
		return b, nil // another process built it while we waited
	}
	tmp, err := os.MkdirTemp(base, ".build-"+p.Name+"-")
	if err != nil {
		return "", fmt.Errorf("%s: %w", p.Name, err)
	}
	defer os.RemoveAll(tmp)
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%s: building it needs the go command on PATH: %w", p.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	out := p.Name
	if p.Output != "" {
		out = p.Output
	}
	start := time.Now()
	if p.Build != nil {
		if err := p.Build(ctx, tmp, filepath.Join(tmp, "bin", out)); err != nil {
			return "", fmt.Errorf("%s %s: build (after %s): %w", p.Name, p.Version, time.Since(start).Round(time.Second), err)
		}
	} else {
		cmd := exec.CommandContext(ctx, goBin, "install", p.Package+"@"+p.Version)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOBIN="+filepath.Join(tmp, "bin"), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("%s: go install %s@%s (after %s): %w\n%s", p.Name, p.Package, p.Version, time.Since(start).Round(time.Second), err, Tail(b))
		}
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("%s: %w", p.Name, err)
	}
	if err := os.Rename(filepath.Join(tmp, "bin", out), bin); err != nil {
		return "", fmt.Errorf("%s: %w", p.Name, err)
	}
	return bin, nil
}

// tidy marks p's cache entry used and removes the entries of p's other
// versions that were not used for StaleAfter. Failures are ignored: the
// cache stays usable.
func (p Program) tidy(base, entry string) {
	now := time.Now()
	if _, err := os.Stat(entry); err == nil {
		MarkUsed(entry, now)
	}
	_, _ = PruneStale(base, p.Name+"-", filepath.Base(entry), StaleAfter, now)
}

// Tail is the last 2,000 characters of a command's output, for errors.
func Tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
