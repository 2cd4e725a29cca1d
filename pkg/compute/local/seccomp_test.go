package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local/seccomp"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// seccompProbe builds testdata/seccompprobe (static), once per test
// binary, and returns its bytes.
var seccompProbe = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "bulkhead-seccompprobe-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "seccompprobe")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./testdata/seccompprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build seccompprobe: %w\n%s", err, b)
	}
	return os.ReadFile(out)
})

// probeReport is what testdata/seccompprobe prints.
type probeReport struct {
	Errno   map[string]int    `json:"errno"`
	Allowed map[string]string `json:"allowed"`
	Seccomp string            `json:"seccomp"`
}

// seccompSandbox starts a bubblewrap sandbox (the filter off with
// noSeccomp) with the probe in its workspace, and returns a function that
// runs a shell command in it as user.
func seccompSandbox(t *testing.T, noSeccomp bool) (run func(user, cmd string) *compute.ExitStatus, output func() []byte) {
	t.Helper()
	probe, err := seccompProbe()
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	for d := stateDir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	c, err := NewClient(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: IsolationBubblewrap, NoSeccomp: noSeccomp},
		compute.ClientOptions{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	var m *manifest.Manifest
	if os.Geteuid() == 0 {
		m = &manifest.Manifest{Users: []manifest.User{{Name: "mate"}}, RunAs: "mate"}
	}
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Agent().WriteFile(ctx, "seccompprobe", compute.WriteFileOptions{Mode: 0o755}, bytes.NewReader(probe)); err != nil {
		t.Fatal(err)
	}
	var last []byte
	run = func(user, cmd string) *compute.ExitStatus {
		t.Helper()
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{User: user, Command: cmd}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("%s (as %q): %v", cmd, user, err)
		}
		last = res.Stdout
		if len(res.Stderr) > 0 {
			t.Logf("%s (as %q) stderr: %s", cmd, user, res.Stderr)
		}
		return &res.Exit
	}
	return run, func() []byte { return last }
}

// runProbe runs the probe as user and decodes its report.
func runProbe(t *testing.T, run func(user, cmd string) *compute.ExitStatus, output func() []byte, user string) probeReport {
	t.Helper()
	if exit := run(user, "exec ./seccompprobe"); exit.ExitCode != 0 || exit.Signal != "" {
		t.Fatalf("probe as %q: exit %v, output %q", user, exit, output())
	}
	var r probeReport
	if err := json.Unmarshal(output(), &r); err != nil {
		t.Fatalf("probe as %q: %v in %q", user, err, output())
	}
	return r
}

// probeUsers are the accounts the probe runs as: the sandbox's own (the
// manifest's run_as with a root harness, else the harness's user), and,
// with a root harness, root inside, which keeps the daemon's capabilities
// (in the sandbox's user namespace): the filter must refuse its calls too.
func probeUsers() []string {
	if os.Geteuid() == 0 {
		return []string{"mate", "root"}
	}
	return []string{""}
}

// TestSeccompInBubblewrap runs testdata/seccompprobe in a real bubblewrap
// sandbox, through the daemon: every call of the deny list (seccomp.Rules)
// fails with its errno, clone3 with ENOSYS, clone with each namespace
// flag with EPERM, x32 calls with EPERM and an i386 call (int 0x80) kills
// the process; getpid, fork and exec, a shell pipeline, pidfd_open, local
// and IP sockets and terminal ioctls still work.
func TestSeccompInBubblewrap(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	rules := map[string]seccomp.Rule{}
	for _, r := range seccomp.Rules() {
		rules[r.Name] = r
	}
	run, output := seccompSandbox(t, false)
	for _, user := range probeUsers() {
		r := runProbe(t, run, output, user)
		if r.Seccomp != "2" {
			t.Errorf("as %q: Seccomp %q in /proc/self/status, want 2 (filter)", user, r.Seccomp)
		}
		tried := map[string]bool{}
		for key := range r.Errno {
			kind, _, _ := strings.Cut(key, ":")
			tried[kind] = true
		}
		for name := range rules {
			if !tried[name] && (runtime.GOARCH == "amd64" || name != "iopl" && name != "ioperm") {
				t.Errorf("the probe does not try %s", name)
			}
		}
		for key, got := range r.Errno {
			kind, _, _ := strings.Cut(key, ":")
			want := syscall.EPERM
			if kind != "x32" {
				rule, ok := rules[kind]
				if !ok {
					t.Errorf("the probe tries %s, which the deny list does not name", key)
					continue
				}
				want = rule.Errno
			}
			if got != int(want) {
				t.Errorf("as %q, %s: errno %d (%v), want %d (%v)", user, key, got, syscall.Errno(got), int(want), want)
			}
		}
		for name, res := range r.Allowed {
			if res != "ok" {
				t.Errorf("as %q, %s (must stay allowed): %s", user, name, res)
			}
		}
		if runtime.GOARCH == "amd64" {
			exit := run(user, "exec ./seccompprobe int80")
			switch {
			case exit.Signal == "SIGSYS":
			case !hostHasInt80(t):
				// A kernel without IA32 emulation offers no i386 entry
				// point at all (the call faults before any filter runs):
				// then it must not return inside either.
				if exit.ExitCode == 0 || bytes.Contains(output(), []byte("int80 returned")) {
					t.Errorf("as %q, a call through int 0x80 returned on a kernel that has no i386 entry point: exit %v, output %q", user, exit, output())
				}
			default:
				t.Errorf("as %q, a call through int 0x80: exit %v, output %q; want killed by SIGSYS", user, exit, output())
			}
		}
	}
	// The daemon itself works under the filter: run_as accounts (setuid,
	// setgroups...), PTYs.
	if exit := run("", "tty >/dev/null || true; id -u"); exit.ExitCode != 0 {
		t.Errorf("a command: exit %v", exit)
	}
}

// TestSeccompOff: Config.NoSeccomp leaves the filter out, and the
// probe's calls that need no capability then fail otherwise (never with
// EPERM), so the errnos TestSeccompInBubblewrap sees for them are the
// filter's. (A root harness's sandbox also drops every capability the
// daemon does not need, so mount, reboot, swapon and the like fail with
// EPERM from the kernel too: two walls, checked separately.)
func TestSeccompOff(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	run, output := seccompSandbox(t, true)
	user := probeUsers()[len(probeUsers())-1]
	r := runProbe(t, run, output, user)
	if r.Seccomp != "0" {
		t.Errorf("Seccomp %q in /proc/self/status, want 0 (none)", r.Seccomp)
	}
	if user != "root" {
		return // without capabilities, many calls fail with EPERM anyway
	}
	// Calls the kernel allows a process without capabilities (on its own
	// children, its own keyring, its own memory).
	for _, key := range []string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "keyctl", "add_key", "request_key",
		"io_uring_setup", "clone:CLONE_NEWUSER", "unshare"} {
		got, ok := r.Errno[key]
		if !ok {
			continue
		}
		if got == int(syscall.EPERM) {
			t.Errorf("without the filter, %s still fails with EPERM: the probe does not tell the filter's answer from the kernel's", key)
		}
	}
	// And the capabilities a root harness's sandbox keeps are the
	// daemon's few: reboot needs CAP_SYS_BOOT, which it lacks.
	if got := r.Errno["reboot"]; got != int(syscall.EPERM) {
		t.Errorf("without the filter, reboot as root inside: errno %d, want EPERM (CAP_SYS_BOOT dropped)", got)
	}
}

// TestBubblewrapHidesHostRun: the host's /run (where its daemons' sockets
// live, Docker's among them) is an empty tmpfs inside the sandbox, for the
// sandbox's account and for root alike.
func TestBubblewrapHidesHostRun(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	host, err := os.ReadDir("/run")
	testenv.Require(t, testenv.Condition(err == nil && len(host) > 0, "the host's /run has entries to hide"))
	run, output := seccompSandbox(t, false)
	for _, user := range probeUsers() {
		if exit := run(user, "ls -A /run"); exit.ExitCode != 0 {
			t.Fatalf("as %q: ls /run: exit %v, output %q", user, exit, output())
		}
		if got := strings.TrimSpace(string(output())); got != "" {
			t.Errorf("as %q: the sandbox sees the host's /run: %q", user, got)
		}
	}
}

// hostHasInt80 reports whether this kernel serves system calls through
// the i386 entry point (int $0x80) at all: the probe, unfiltered on the
// host, returns from one. Kernels built without IA32 emulation, or booted
// with ia32_emulation=0, fault the instruction instead.
func hostHasInt80(t *testing.T) bool {
	t.Helper()
	probe, err := seccompProbe()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "seccompprobe")
	if err := os.WriteFile(path, probe, 0o755); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(path, "int80").CombinedOutput()
	return strings.Contains(string(out), "int80 returned")
}
