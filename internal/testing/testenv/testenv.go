// Package testenv is the one place a test says what it needs from the
// machine it runs on (root, bubblewrap, Docker, a tool on PATH, ...).
//
// On a developer's machine a missing part skips the test with one clear
// line. Under CI=true the same missing part fails the test instead: a green
// CI run never hides a skipped suite. Every skip in the tree goes through
// this package: Require or Skip for a missing part of the machine, Optional
// or Short for a test that is opt-in by design; internal/houserules checks
// that no test calls t.Skip, t.Skipf, t.SkipNow or b.Skip itself.
package testenv

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Need is one thing a test needs from its machine.
type Need interface {
	// missing returns "" when the need is met, else why it is not.
	missing() string
}

// needFunc adapts a function to Need.
type needFunc func() string

func (f needFunc) missing() string { return f() }

// dockerNeed is Docker: the one need CI may lack. The project's rule is
// that Docker tests run whenever a Docker daemon answers; a CI machine
// where `docker info` fails skips them (with one line), but a CI machine
// where it works and the tests still cannot use it fails.
type dockerNeed struct{}

func (dockerNeed) missing() string { return dockerMissing() }

// Needs a test may ask for.
var (
	// Root: the test process runs as uid 0 (switching users, owners).
	Root Need = needFunc(func() string {
		if os.Geteuid() != 0 {
			return "needs root (uid 0)"
		}
		return ""
	})
	// Linux: the test runs on Linux.
	Linux Need = needFunc(func() string {
		if runtime.GOOS != "linux" {
			return "needs Linux"
		}
		return ""
	})
	// Bubblewrap: bwrap is on PATH.
	Bubblewrap Need = Tool("bwrap")
	// Docker: a Docker daemon answers `docker info`. Unlike the other
	// needs, Docker missing skips under CI=true too (see dockerNeed).
	Docker Need = dockerNeed{}
	// Git: git is on PATH.
	Git Need = Tool("git")
)

// Tool needs an executable on PATH.
func Tool(name string) Need {
	return needFunc(func() string {
		if _, err := exec.LookPath(name); err != nil {
			return name + " is not on PATH"
		}
		return ""
	})
}

// Condition needs ok to be true; why says what is missing when it is not.
func Condition(ok bool, why string) Need {
	return needFunc(func() string {
		if ok {
			return ""
		}
		return why
	})
}

// CI reports whether the tests run under CI (CI=true), where a missing
// need fails instead of skipping.
func CI() bool { return os.Getenv("CI") == "true" }

// Require skips t (fails it under CI=true) unless every need is met.
func Require(t testing.TB, needs ...Need) {
	t.Helper()
	var why []string
	ciMaySkip := true
	for _, n := range needs {
		if m := n.missing(); m != "" {
			why = append(why, m)
			if _, ok := n.(dockerNeed); !ok {
				ciMaySkip = false
			}
		}
	}
	if len(why) == 0 {
		return
	}
	if ciMaySkip {
		t.Skip("skipped: " + strings.Join(why, "; "))
		return
	}
	Skip(t, strings.Join(why, "; "))
}

// Skip skips t with reason (a missing part of the machine), or fails it
// under CI=true.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true and this test cannot run here: %s", reason)
		return
	}
	t.Skip("skipped: " + reason)
}

// Optional skips t with reason in every environment, CI included. It is
// for tests that are opt-in by design (a gigabyte moved through a pipe
// under -short, a seed-corpus rewriter), never for a missing part of the
// machine: the reason must say how to run the test.
func Optional(t testing.TB, reason string) {
	t.Helper()
	t.Skip("optional: " + reason)
}

// Short skips t under -short (in every environment, CI included).
func Short(t testing.TB, reason string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: " + reason)
	}
}

var docker struct {
	once sync.Once
	why  string
}

// dockerMissing asks `docker info` once per test binary.
func dockerMissing() string {
	docker.once.Do(func() {
		if _, err := exec.LookPath("docker"); err != nil {
			// No client: the API may still answer, but the tests that
			// need Docker also drive `docker build`.
			docker.why = "docker is not on PATH"
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
		if err != nil {
			docker.why = fmt.Sprintf("Docker does not answer (`docker info`: %v: %s)", err, firstLine(string(out)))
		}
	})
	return docker.why
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// SearchableTempDir returns a fresh directory below os.TempDir() that
// other users may pass through (0711; t.TempDir's parent is 0700), removed
// when the test ends. Sandboxes of a root harness run as accounts of their
// own, which must reach a plain local sandbox's workspace in it.
func SearchableTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bh-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// removeAll removes dir, first making its directories writable (a
// workspace may hold read-only ones).
func removeAll(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}
