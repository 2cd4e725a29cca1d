package agentdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// rootfsTimeout bounds images/build.sh rootfs (a few seconds on an idle
// machine; each of its few hundred processes costs on a busy one).
const rootfsTimeout = 5 * time.Minute

// RootFS returns the directory of the sandbox root filesystem `make
// rootfs` writes (the small image's tree: busybox-static's applets, git and
// GNU wget with their libraries, the CA bundle, etc/passwd and etc/group;
// see images/build.sh rootfs), built by the script on the first call of
// the test binary into a temporary directory that Run removes at the end: a
// root file system for local sandboxes (local.Config.RootFS). It needs
// busybox-static, git, wget and ca-certificates (tb skips, or fails under
// CI=true, without them); a failed build fails tb. The package's TestMain
// must run its tests through Run (or Main).
func RootFS(tb testing.TB) string {
	tb.Helper()
	testenv.Require(tb, testenv.Condition(staticBusybox(), "busybox-static (`apt-get install busybox-static`: a static busybox on PATH) for the sandbox root file system"),
		testenv.Condition(executable("/usr/bin/git"), "/usr/bin/git (`apt-get install git`) for the sandbox root file system"),
		testenv.Condition(gnuWget(), "GNU wget at /usr/bin/wget (`apt-get install wget`) for the sandbox root file system"),
		testenv.Condition(fileExists("/etc/ssl/certs/ca-certificates.crt"), "/etc/ssl/certs/ca-certificates.crt (`apt-get install ca-certificates`) for the sandbox root file system"))
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if !builds.inMain {
		tb.Fatal("agentdtest: RootFS needs the package's TestMain to call agentdtest.Run(m), which removes the root file system")
	}
	if !builds.rootfsTried {
		builds.rootfsTried = true
		builds.rootfs, builds.rootfsErr = buildRootFS()
	}
	if builds.rootfsErr != nil {
		tb.Fatal(builds.rootfsErr)
	}
	return builds.rootfs
}

// staticBusybox reports whether busybox on PATH is a static executable
// (the root file system has no C library for it).
func staticBusybox() bool {
	p, err := exec.LookPath("busybox")
	if err != nil {
		return false
	}
	// ldd fails on a static executable.
	return exec.Command("ldd", p).Run() != nil
}

// gnuWget reports whether /usr/bin/wget is GNU wget (images/build.sh
// copies it into the tree in place of busybox's applet).
func gnuWget() bool {
	out, err := exec.Command("/usr/bin/wget", "--version").Output()
	return err == nil && strings.HasPrefix(string(out), "GNU Wget")
}

// fileExists reports whether path is a regular file.
func fileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// executable reports whether path is an executable file.
func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// buildRootFS runs images/build.sh rootfs into a fresh temporary directory
// and returns the tree's path; builds.mu is held.
func buildRootFS() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", fmt.Errorf("agentdtest: sandbox root file system: %w", err)
	}
	dir, err := os.MkdirTemp("", "bulkhead-rootfs-")
	if err != nil {
		return "", fmt.Errorf("agentdtest: sandbox root file system: %w", err)
	}
	builds.rootfsDir = dir
	// Searchable by every user (MkdirTemp makes it 0700): a root
	// harness's bubblewrap sandboxes are set up by their own unprivileged
	// root, which binds the tree from here.
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("agentdtest: sandbox root file system: %w", err)
	}
	out := filepath.Join(dir, "rootfs")
	ctx, cancel := context.WithTimeout(context.Background(), rootfsTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "images", "build.sh"), "rootfs", out)
	cmd.Dir = root
	if log, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("agentdtest: images/build.sh rootfs %s: %w\n%s", out, err, log)
	}
	// The tree itself (out is a symbolic link to it).
	tree, err := filepath.EvalSymlinks(out)
	if err != nil {
		return "", fmt.Errorf("agentdtest: sandbox root file system: %w", err)
	}
	return tree, nil
}

// moduleRoot returns the directory of the module the test runs in.
func moduleRoot() (string, error) {
	// go test puts its own GOROOT/bin first on the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no go command on PATH: %w", err)
	}
	// Tests run in their package's directory, inside the module.
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(gomod))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("the test does not run inside the module (go env GOMOD: %q, %v)", gomod, err)
	}
	return filepath.Dir(mod), nil
}
