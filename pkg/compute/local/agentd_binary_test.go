package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// These tests run sandbox-agentd directly, without the launcher, to check
// its own command-line contract.

const directToken = "direct-test-token-0123456789abcdef"

// daemonProc is a sandbox-agentd started with exec.Command.
type daemonProc struct {
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	done   chan struct{}
	socket string
}

// startDirect starts name (the daemon, or a wrapper such as unshare) with
// args and kills it at the end of the test if it still runs.
func startDirect(t *testing.T, socket, name string, args ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{cmd: exec.Command(name, args...), stderr: &syncbuf.Buffer{}, done: make(chan struct{}), socket: socket}
	d.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	d.cmd.Stdout = d.stderr
	d.cmd.Stderr = d.stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
			<-d.done
		}
	})
	return d
}

// wait waits for the process to exit and returns its exit code.
func (d *daemonProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-d.done:
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s still runs after %s; output:\n%s", d.cmd.Path, timeout, d.stderr.String())
		return -1
	}
}

// waitServing polls health (which needs no token) until it says SERVING.
func (d *daemonProc) waitServing(t *testing.T) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-d.done:
			t.Fatalf("daemon exited (%s) before serving; output:\n%s", d.cmd.ProcessState, d.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not serving after 30s (last: %v); output:\n%s", err, d.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dialDirect(t *testing.T, socket, token string) *agentclient.Client {
	t.Helper()
	c, err := agentclient.Dial(agentclient.Options{Address: "unix://" + socket, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// directDirs returns a socket path and a workspace in a fresh directory.
func directDirs(t *testing.T) (dir, socket, ws string) {
	dir = t.TempDir()
	return dir, filepath.Join(dir, "agentd.sock"), filepath.Join(dir, "ws")
}

func writeToken(t *testing.T, dir, token string) string {
	t.Helper()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDaemonTokenSources: without a token the daemon refuses to start;
// a token file is removed once it serves; a short token is refused;
// --insecure-no-auth serves and warns loudly.
func TestDaemonTokenSources(t *testing.T) {
	t.Run("no token", func(t *testing.T) {
		_, socket, ws := directDirs(t)
		d := startDirect(t, socket, agentdBin, "--listen", "unix://"+socket, "--workspace", ws)
		if code := d.wait(t, 30*time.Second); code == 0 {
			t.Errorf("daemon without a token exited 0; output:\n%s", d.stderr.String())
		}
		if !strings.Contains(d.stderr.String(), "no token") {
			t.Errorf("stderr does not say \"no token\":\n%s", d.stderr.String())
		}
		if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a daemon that refused to start created its socket: %v", err)
		}
	})

	t.Run("token file", func(t *testing.T) {
		dir, socket, ws := directDirs(t)
		tokenFile := writeToken(t, dir, directToken)
		d := startDirect(t, socket, agentdBin, "--listen", "unix://"+socket, "--token-file", tokenFile, "--workspace", ws)
		d.waitServing(t)
		if _, err := os.Stat(tokenFile); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("token file still exists while the daemon serves: %v", err)
		}
		ctx := testCtx(t)
		if info, err := dialDirect(t, socket, directToken).Info(ctx); err != nil || info.WorkspaceRoot != ws {
			t.Errorf("Info with the token = %v, %v", info, err)
		}
		_, err := dialDirect(t, socket, "wrong-token-0123456789abcdef").Info(ctx)
		if !errors.Is(err, errkind.ErrUnauthenticated) {
			t.Errorf("Info with a wrong token: %v; want ErrUnauthenticated", err)
		}
		if strings.Contains(d.stderr.String(), directToken) {
			t.Errorf("the daemon's log contains the token:\n%s", d.stderr.String())
		}
		if err := syscall.Kill(d.cmd.Process.Pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := d.wait(t, 60*time.Second); code != 0 {
			t.Errorf("exit code after SIGTERM = %d; output:\n%s", code, d.stderr.String())
		}
	})

	t.Run("short token", func(t *testing.T) {
		dir, socket, ws := directDirs(t)
		tokenFile := writeToken(t, dir, "short-0123456") // 13 bytes < 16
		d := startDirect(t, socket, agentdBin, "--listen", "unix://"+socket, "--token-file", tokenFile, "--workspace", ws)
		if code := d.wait(t, 30*time.Second); code == 0 {
			t.Errorf("daemon with a short token exited 0; output:\n%s", d.stderr.String())
		}
		if !strings.Contains(d.stderr.String(), "shorter than") {
			t.Errorf("stderr does not explain the refusal:\n%s", d.stderr.String())
		}
		if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a daemon that refused to start created its socket: %v", err)
		}
		if _, err := os.Stat(tokenFile); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused token file left readable: %v", err)
		}
	})

	t.Run("token file and insecure together", func(t *testing.T) {
		dir, socket, ws := directDirs(t)
		tokenFile := writeToken(t, dir, directToken)
		d := startDirect(t, socket, agentdBin, "--listen", "unix://"+socket, "--token-file", tokenFile, "--insecure-no-auth", "--workspace", ws)
		if code := d.wait(t, 30*time.Second); code == 0 {
			t.Errorf("contradictory flags accepted; output:\n%s", d.stderr.String())
		}
	})

	t.Run("insecure no auth", func(t *testing.T) {
		_, socket, ws := directDirs(t)
		d := startDirect(t, socket, agentdBin, "--listen", "unix://"+socket, "--insecure-no-auth", "--workspace", ws)
		d.waitServing(t)
		if !strings.Contains(strings.ToLower(d.stderr.String()), "authentication is disabled") {
			t.Errorf("no warning about disabled authentication in the log:\n%s", d.stderr.String())
		}
		if _, err := dialDirect(t, socket, "").Info(testCtx(t)); err != nil {
			t.Errorf("Info without a token against --insecure-no-auth: %v", err)
		}
		if err := syscall.Kill(d.cmd.Process.Pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := d.wait(t, 60*time.Second); code != 0 {
			t.Errorf("exit code after SIGTERM = %d; output:\n%s", code, d.stderr.String())
		}
	})
}

// TestDaemonFlags: --version prints the stamped version and exits 0; an
// unknown flag or a stray argument exits 2 with a message.
func TestDaemonFlags(t *testing.T) {
	out, err := exec.Command(agentdBin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v: %s", err, out)
	}
	if !strings.HasPrefix(string(out), "sandbox-agentd ") || !strings.Contains(string(out), testVersion) || !strings.Contains(string(out), testCommit) {
		t.Errorf("--version printed %q", out)
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"--listen", "unix:///tmp/x.sock", "stray"}} {
		out, err := exec.Command(agentdBin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: err %v, want exit code 2; output %q", args, err, out)
		}
		if len(strings.TrimSpace(string(out))) == 0 {
			t.Errorf("%q: exited without saying why", args)
		}
	}
}

// TestDaemonAsPID1ReapsOrphans: as PID 1 of a PID namespace the daemon
// reports pid 1 and reaps orphaned grandchildren, so no zombie piles up.
func TestDaemonAsPID1ReapsOrphans(t *testing.T) {
	testenv.Require(t, testenv.Tool("unshare"))
	if out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		testenv.Skip(t, fmt.Sprintf("unshare --pid --fork --mount-proc is not permitted here (%v: %s)", err, strings.TrimSpace(string(out))))
	}
	dir, socket, ws := directDirs(t)
	tokenFile := writeToken(t, dir, directToken)
	d := startDirect(t, socket, "unshare", "--pid", "--fork", "--mount-proc",
		agentdBin, "--listen", "unix://"+socket, "--token-file", tokenFile, "--workspace", ws)
	d.waitServing(t)

	// The daemon is unshare's child; find its pid as this namespace sees it.
	var daemonPID int
	eventually(t, 10*time.Second, "daemon's host pid found", func() (bool, string) {
		kids := childrenOf(d.cmd.Process.Pid)
		if len(kids) == 1 {
			daemonPID = kids[0]
			return true, ""
		}
		return false, fmt.Sprintf("children of unshare (pid %d): %v", d.cmd.Process.Pid, kids)
	})
	if comm := mustStat(t, daemonPID).comm; comm != AgentdBinary {
		t.Fatalf("unshare's child is %q, not %s", comm, AgentdBinary)
	}
	// Killing the daemon ends the namespace; do it first at clean-up. While
	// unshare runs, it has not reaped the daemon, so the pid is still its.
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = syscall.Kill(daemonPID, syscall.SIGKILL)
		}
	})

	ctx := testCtx(t)
	c := dialDirect(t, socket, directToken)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.PID != 1 {
		t.Fatalf("Info pid = %d, want 1 inside the PID namespace", info.PID)
	}
	for i := range 20 {
		res, err := c.Exec(ctx, agentclient.ProcessSpec{Command: "sleep 0.05 & exit 0"}, agentclient.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("Exec %d: %v", i, err)
		}
		if res.Exit.ExitCode != 0 {
			t.Fatalf("Exec %d: exit %v", i, res.Exit)
		}
	}
	// Every shell has exited and every orphaned sleep ends within 50ms; once
	// reaped, the daemon has no children left. An unreaped orphan would stay
	// a zombie child of the daemon for good.
	eventually(t, 20*time.Second, "daemon has no children left (orphans reaped)", func() (bool, string) {
		kids := procsWhere(func(p procStat) bool { return p.ppid == daemonPID })
		return len(kids) == 0, fmtProcs(kids)
	})
	if zombies := procsWhere(func(p procStat) bool { return p.ppid == daemonPID && p.state == 'Z' }); len(zombies) > 0 {
		t.Fatalf("zombies under the PID-1 daemon: %s", fmtProcs(zombies))
	}

	if err := syscall.Kill(daemonPID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := d.wait(t, 60*time.Second); code != 0 {
		t.Errorf("unshare (daemon) exit code after SIGTERM = %d; output:\n%s", code, d.stderr.String())
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket not removed after SIGTERM: %v", err)
	}
	if _, err := os.Stat(tokenFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("token file not removed: %v", err)
	}
	if _, err := c.Info(ctx); err == nil {
		t.Error("Info succeeded after the daemon exited")
	}
}

// childrenOf lists pid's children, from /proc/<pid>/task/*/children when
// the kernel has it, else by scanning /proc.
func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	var out []int
	found := false
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		found = true
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	if found {
		return out
	}
	for _, p := range procsWhere(func(p procStat) bool { return p.ppid == pid }) {
		out = append(out, p.pid)
	}
	return out
}
