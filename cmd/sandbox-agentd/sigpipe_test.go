package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// runningDaemon is the real sandbox-agentd binary started by a test.
type runningDaemon struct {
	client *agentclient.Client
	cmd    *exec.Cmd
	dir    string        // the daemon's fresh directory: its socket, token file and workspace
	ws     string        // its workspace, in dir
	addr   string        // its listen address (unix://...)
	token  string        // the token it accepts
	exited chan struct{} // closed once cmd.Wait returned; then waitErr is set
	// waitErr is cmd.Wait's result, read only after exited is closed.
	waitErr error
}

// startBinary starts the built daemon on a unix socket in a fresh
// directory, with a token file and a workspace there and args added to its
// command line, its stderr going to stderr, and waits until it answers.
// The daemon is interrupted and waited for when the test ends (before any
// cleanup the caller registered earlier runs).
func startBinary(ctx context.Context, t *testing.T, stderr io.Writer, args ...string) *runningDaemon {
	t.Helper()
	bin := agentdtest.Binaries(t)
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	const token = "agentd-test-token-0123456789"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "unix://" + filepath.Join(dir, "agentd.sock")
	cmd := exec.Command(bin.Agentd, append([]string{"--listen", addr, "--token-file", tokenFile, "--workspace", ws}, args...)...)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &runningDaemon{cmd: cmd, dir: dir, ws: ws, addr: addr, token: token, exited: make(chan struct{})}
	go func() { d.waitErr = cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-d.exited
	})
	c, err := agentclient.Dial(agentclient.Options{Address: addr, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	d.client = c
	for {
		if _, err = c.Info(ctx); err == nil {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("the daemon exited before answering: %v", d.waitErr)
		case <-ctx.Done():
			t.Fatalf("daemon not ready: %v", err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// TestSurvivesStderrWithoutReader runs the real daemon with its stderr a
// pipe whose reader goes away once the daemon is up (the harness that
// started it died), then makes it log: every log write now meets a broken
// pipe, and the daemon must go on serving rather than die of SIGPIPE, and
// still shut down cleanly on SIGTERM.
func TestSurvivesStderrWithoutReader(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d := startBinary(ctx, t, w, "--log-level", "info")
	w.Close() // the daemon has its copy

	// The daemon logs to the pipe: read up to its ready line, so the
	// reader is known to be there until now.
	if err := r.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(r)
	for !strings.Contains(lines.Text(), "sandbox-agentd ready") {
		if !lines.Scan() {
			t.Fatalf("no ready line on the daemon's stderr: %v", lines.Err())
		}
	}
	r.Close() // no reader any more: the next write to stderr gets EPIPE

	// A NotFound is logged at info level before the reply is sent, so
	// every call below writes to the broken pipe before it returns.
	for i := range 3 {
		_, err := d.client.Stat(ctx, "missing-"+strconv.Itoa(i), compute.StatOptions{})
		if !errors.Is(err, compute.ErrNotFound) {
			select { // tell a dead daemon from a wrong answer
			case <-d.exited:
				t.Fatalf("stat %d: %v; the daemon died writing its log: %v", i, err, d.waitErr)
			case <-time.After(5 * time.Second):
				t.Fatalf("stat %d: %v, want not found", i, err)
			}
		}
	}
	if _, err := d.client.Info(ctx); err != nil {
		t.Fatalf("the daemon stopped serving after writing to a broken stderr: %v", err)
	}
	res, err := d.client.Exec(ctx, compute.ProcessSpec{Argv: []string{"echo", "still here"}}, compute.ExecOptions{}, nil)
	if err != nil || res.Exit.ExitCode != 0 || string(res.Stdout) != "still here\n" {
		t.Fatalf("exec after the broken stderr: %+v %v", res, err)
	}

	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-ctx.Done():
		t.Fatal("the daemon did not stop on SIGINT")
	}
	if d.waitErr != nil {
		t.Errorf("the daemon's exit with a broken stderr: %v, want a clean exit", d.waitErr)
	}
}

// TestSandboxProcessesGetDefaultSIGPIPE checks that what the daemon does
// about SIGPIPE for itself does not reach the processes it starts: they
// get the default disposition, as under a normal shell, so the writer of
// a pipeline whose reader is gone dies of SIGPIPE (`yes | head -1` ends
// with yes killed, not with yes reporting a write error).
func TestSandboxProcessesGetDefaultSIGPIPE(t *testing.T) {
	testenv.Require(t, testenv.Linux, testenv.Tool("sh"), testenv.Tool("yes"), testenv.Tool("head"), testenv.Tool("cat"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := startBinary(ctx, t, nil, "--log-level", "warn")

	for _, tty := range []bool{false, true} {
		// The disposition itself: SigIgn is a hex mask, bit N-1 for signal N.
		res, err := d.client.Exec(ctx, compute.ProcessSpec{Argv: []string{"cat", "/proc/self/status"}, Tty: tty}, compute.ExecOptions{}, nil)
		if err != nil || res.Exit.ExitCode != 0 {
			t.Fatalf("tty=%v: cat /proc/self/status: %+v %v", tty, res, err)
		}
		var sigIgn string
		for _, line := range strings.Split(string(res.Stdout), "\n") {
			if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
				sigIgn = strings.TrimSpace(v)
			}
		}
		mask, err := strconv.ParseUint(sigIgn, 16, 64)
		if err != nil {
			t.Fatalf("tty=%v: no SigIgn mask in /proc/self/status (%q): %v", tty, sigIgn, err)
		}
		if mask&(1<<(13-1)) != 0 { // SIGPIPE is 13 on Linux
			t.Errorf("tty=%v: a sandbox process starts with SIGPIPE ignored (SigIgn %s)", tty, sigIgn)
		}

		// The behaviour: a shell that sends itself SIGPIPE dies of it.
		res, err = d.client.Exec(ctx, compute.ProcessSpec{Command: "kill -PIPE $$; echo survived", Tty: tty}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("tty=%v: kill -PIPE: %v", tty, err)
		}
		if res.Exit.Signal != "SIGPIPE" || res.Exit.ExitCode != 128+13 {
			t.Errorf("tty=%v: a shell sending itself SIGPIPE ended with %+v (output %q), want killed by SIGPIPE", tty, res.Exit, res.Stdout)
		}
	}

	// And the pipeline: yes is killed by SIGPIPE (status 141) once head is
	// done, instead of seeing EPIPE and exiting 1 with an error message.
	res, err := d.client.Exec(ctx, compute.ProcessSpec{Command: `{ yes; echo "yes exited $?" >&2; } | head -n 1`}, compute.ExecOptions{}, nil)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("yes | head: %+v %v", res, err)
	}
	if string(res.Stdout) != "y\n" || strings.TrimSpace(string(res.Stderr)) != "yes exited 141" {
		t.Errorf("yes | head -n 1: stdout %q, stderr %q; want y and yes killed by SIGPIPE (141)", res.Stdout, res.Stderr)
	}
}

// TestEgressRelayHelp checks that the help text shows the relay address
// the providers pass (egress.RelayAddr), and that their flags parse.
func TestEgressRelayHelp(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t)
	out, err := exec.Command(bin.Agentd, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("sandbox-agentd --help: %v\n%s", err, out)
	}
	if want := egress.RelayAddr + "=unix:///"; !strings.Contains(string(out), want) {
		t.Errorf("--help does not show %q:\n%s", want, out)
	}
	cfg, _, err := parseFlags(append([]string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth"}, egress.RelayArgs("/run/bulkhead/egress.sock")...))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Daemon.EgressRelay; r == nil || r.Listen != egress.RelayAddr || r.Socket != "/run/bulkhead/egress.sock" {
		t.Errorf("egress.RelayArgs parsed to %+v", r)
	}
}
