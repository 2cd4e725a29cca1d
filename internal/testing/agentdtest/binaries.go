package agentdtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The version and commit stamped into the binaries Binaries builds, so
// that tests can check Info and --version exactly.
const (
	Version = "v0.0.0-agentdtest"
	Commit  = "agentdtest"
)

// The build the Makefile's `make build` does (TestMakefileBuildFlags keeps
// these in step with it): static, path-free, with the production tags.
const (
	buildTags = "grpcnotrace"
	buildinfo = "github.com/bulkhead-dev/bulkhead/internal/buildinfo"
)

// buildFlags returns the go build flags of `make build`, stamped with
// Version and Commit.
func buildFlags() []string {
	return []string{"-trimpath", "-tags", buildTags,
		"-ldflags", "-s -w -X " + buildinfo + ".version=" + Version + " -X " + buildinfo + ".commit=" + Commit}
}

// Bin says where the built binaries are.
type Bin struct {
	// Dir holds them; harness looks for sandbox-agentd beside itself.
	Dir string
	// Agentd is the sandbox-agentd binary.
	Agentd string
}

// Harness is the harness binary beside Agentd. Build it with Harness(tb).
func (b Bin) Harness() string { return filepath.Join(b.Dir, "harness") }

// builds remembers, for one test binary, the directory and what was built
// in it: the go command is run once per command however many tests ask.
var builds struct {
	mu     sync.Mutex
	inMain bool
	dir    string
	done   map[string]error // by command name
	// RootFS's build: the temporary directory holding it, the tree, and
	// whether (and how) it was built.
	rootfsDir   string
	rootfs      string
	rootfsErr   error
	rootfsTried bool
}

// Binaries returns sandbox-agentd built from this checkout with the
// Makefile's flags (CGO_ENABLED=0, -trimpath, -tags grpcnotrace, -s -w,
// stamped with Version and Commit), building it on the first call of the
// test binary. The package's TestMain must run its tests through Run,
// which removes the binaries at the end. A failed build fails tb.
func Binaries(tb testing.TB) Bin {
	tb.Helper()
	return mustBuild(tb, "sandbox-agentd")
}

// Harness is Binaries plus the harness command, built the same way into
// the same directory (Bin.Harness).
func Harness(tb testing.TB) Bin {
	tb.Helper()
	mustBuild(tb, "sandbox-agentd")
	return mustBuild(tb, "harness")
}

// Main is the TestMain of a package whose tests all need the daemon up
// front, as a path in a package variable: it builds sandbox-agentd as
// Binaries does, stores its path in *agentd, runs the tests through Run
// and exits with their code (1 when the build fails).
func Main(m *testing.M, agentd *string) {
	builds.mu.Lock()
	b, err := buildLocked("sandbox-agentd")
	builds.mu.Unlock()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*agentd = b.Agentd
	os.Exit(Run(m))
}

func mustBuild(tb testing.TB, command string) Bin {
	tb.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if !builds.inMain {
		tb.Fatal("agentdtest: Binaries needs the package's TestMain to call agentdtest.Run(m), which removes the binaries")
	}
	b, err := buildLocked(command)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// buildLocked builds command once per test binary; builds.mu is held.
func buildLocked(command string) (Bin, error) {
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "bulkhead-bin-")
		if err != nil {
			return Bin{}, fmt.Errorf("agentdtest: %w", err)
		}
		// Searchable by every user (MkdirTemp makes it 0700): a root
		// harness's bubblewrap sandboxes are set up by their own
		// unprivileged root, which binds the daemon from here.
		if err := os.Chmod(dir, 0o711); err != nil {
			_ = os.RemoveAll(dir)
			return Bin{}, fmt.Errorf("agentdtest: %w", err)
		}
		builds.dir, builds.done = dir, map[string]error{}
	}
	err, tried := builds.done[command]
	if !tried {
		err = goBuild(builds.dir, command)
		builds.done[command] = err
	}
	if err != nil {
		if len(builds.done) == 1 { // nothing else in the directory
			_ = os.RemoveAll(builds.dir)
			builds.dir, builds.done = "", nil
		}
		return Bin{}, fmt.Errorf("agentdtest: %w", err)
	}
	return Bin{Dir: builds.dir, Agentd: filepath.Join(builds.dir, "sandbox-agentd")}, nil
}

// goBuild builds ./cmd/<command> of the module into dir.
func goBuild(dir, command string) error {
	// go test puts its own GOROOT/bin first on the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build %s: no go command on PATH: %w", command, err)
	}
	root, err := moduleRoot()
	if err != nil {
		return fmt.Errorf("build %s: %w", command, err)
	}
	args := append([]string{"build"}, buildFlags()...)
	args = append(args, "-o", filepath.Join(dir, command), "./cmd/"+command)
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Run runs the package's tests (m.Run) and then removes the binaries
// Binaries built, returning m.Run's code. A TestMain of a package that
// uses Binaries is os.Exit(agentdtest.Run(m)), or calls Run where it would
// call m.Run.
func Run(m *testing.M) int {
	builds.mu.Lock()
	builds.inMain = true
	builds.mu.Unlock()
	code := m.Run()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		if err := os.RemoveAll(builds.dir); err != nil {
			fmt.Fprintf(os.Stderr, "agentdtest: removing the test binaries: %v\n", err)
		}
		builds.dir, builds.done = "", nil
	}
	if builds.rootfsDir != "" {
		if err := os.RemoveAll(builds.rootfsDir); err != nil {
			fmt.Fprintf(os.Stderr, "agentdtest: removing the sandbox root file system: %v\n", err)
		}
	}
	builds.rootfsDir, builds.rootfs, builds.rootfsErr, builds.rootfsTried = "", "", nil, false
	return code
}
