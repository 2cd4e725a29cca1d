package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestStartInfoExecClose: Start serves, Info describes this very child,
// Exec runs, and Close leaves nothing behind: no daemon (not even a zombie),
// no private directory, no process of the daemon's group or of a group it
// started (including a background job whose shell already exited).
func TestStartInfoExecClose(t *testing.T) {
	ctx := testCtx(t)
	s := startSandbox(t, Options{})
	daemon := mustStat(t, s.PID())
	if daemon.pgrp != daemon.pid {
		t.Errorf("daemon should lead its own process group: %v", daemon)
	}

	info, err := s.Client.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.Version != testVersion || info.Commit != testCommit {
		t.Errorf("Info version/commit = %q/%q, want %q/%q", info.Version, info.Commit, testVersion, testCommit)
	}
	if info.WorkspaceRoot != s.Workspace {
		t.Errorf("Info workspace root = %q, want %q", info.WorkspaceRoot, s.Workspace)
	}
	if int(info.PID) != s.PID() {
		t.Errorf("Info pid = %d, want the child's pid %d", info.PID, s.PID())
	}
	if fi, err := os.Stat(s.Workspace); err != nil || !fi.IsDir() {
		t.Errorf("workspace %s was not created: %v", s.Workspace, err)
	}
	if fi, err := os.Lstat(s.Socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket %s: %v", s.Socket, err)
	} else if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("socket %s is accessible to others: %v", s.Socket, perm)
	}

	out, errOut, code := execShell(ctx, t, s, "id -u")
	if code != 0 || strings.TrimSpace(out) != strconv.Itoa(os.Geteuid()) {
		t.Errorf("id -u: exit %d stdout %q stderr %q; want 0 and %d", code, out, errOut, os.Geteuid())
	}
	// A failing command is reported as such, not as an RPC error.
	if _, _, code := execShell(ctx, t, s, "exit 7"); code != 7 {
		t.Errorf("exit 7: got exit code %d", code)
	}

	// A background job whose shell exits at once: the job is orphaned to
	// the daemon but still belongs to the started process group.
	st, err := s.Client.Start(ctx, agentclient.ProcessSpec{Command: "sleep 1000 & echo $!; wait"}, agentclient.StartOptions{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	leader := mustStat(t, int(st.Process.PID))
	sleepPID, err := strconv.Atoi(readLine(ctx, t, s, st.Process.ProcessID))
	if err != nil {
		t.Fatalf("background pid: %v", err)
	}
	var sleeper procStat
	eventually(t, 10*time.Second, "background job is a sleep in the started group", func() (bool, string) {
		sleeper, _ = readStat(sleepPID) // the forked shell may not have exec'd sleep yet
		return sleeper.comm == "sleep" && sleeper.pgrp == leader.pid, sleeper.String()
	})
	st2, err := s.Client.Start(ctx, agentclient.ProcessSpec{Command: "sleep 1000 & echo $!"}, agentclient.StartOptions{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	orphanPID, err := strconv.Atoi(readLine(ctx, t, s, st2.Process.ProcessID))
	if err != nil {
		t.Fatalf("orphan pid: %v", err)
	}
	var orphan procStat
	group2 := int(st2.Process.PID)
	// Its shell exits right after the echo; the orphan is the daemon's now.
	eventually(t, 10*time.Second, "orphaned sleep reparented to the daemon", func() (bool, string) {
		orphan, _ = readStat(orphanPID)
		return orphan.comm == "sleep" && orphan.ppid == daemon.pid, orphan.String()
	})

	// Background jobs that no group kill reaches: one whose shell exited
	// and which holds none of the output pipes (so the daemon sees its
	// group as finished), and one that left its group for a new session.
	escapees := []procStat{orphan}
	for _, cmd := range []string{
		"sleep 1000 >/dev/null 2>&1 </dev/null & echo $!",
		"setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!",
	} {
		st, err := s.Client.Start(ctx, agentclient.ProcessSpec{Command: cmd}, agentclient.StartOptions{})
		if err != nil {
			t.Fatalf("Start %q: %v", cmd, err)
		}
		pid, err := strconv.Atoi(readLine(ctx, t, s, st.Process.ProcessID))
		if err != nil {
			t.Fatalf("%q: pid: %v", cmd, err)
		}
		if exit, err := s.Client.Wait(ctx, st.Process.ProcessID); err != nil || exit.ExitCode != 0 {
			t.Fatalf("%q: Wait = %v, %v", cmd, exit, err)
		}
		var p procStat
		eventually(t, 10*time.Second, "a sleep orphaned to the daemon", func() (bool, string) {
			p, _ = readStat(pid)
			return p.comm == "sleep" && p.ppid == daemon.pid, p.String()
		})
		escapees = append(escapees, p)
	}

	closeCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Close(closeCtx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.Exited():
	default:
		t.Fatal("Close returned before the daemon exited")
	}
	if exists(daemon) {
		now, _ := readStat(daemon.pid)
		t.Errorf("daemon still has a /proc entry after Close: %v", now)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("private directory %s not removed: %v", s.Dir, err)
	}
	for _, p := range append([]procStat{leader, sleeper}, escapees...) {
		eventually(t, 10*time.Second, "process "+p.String()+" gone after Close", func() (bool, string) {
			now, _ := readStat(p.pid)
			return !alive(p), now.String()
		})
	}
	for _, pg := range []int{daemon.pid, leader.pid, group2} {
		eventually(t, 10*time.Second, "process group "+strconv.Itoa(pg)+" empty after Close", func() (bool, string) {
			left := procsWhere(func(p procStat) bool { return p.pgrp == pg && p.state != 'Z' })
			return len(left) == 0, fmtProcs(left)
		})
	}
	// A second Close is harmless.
	_ = s.Close(closeCtx)
}

func fmtProcs(ps []procStat) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString(p.String())
		b.WriteString("; ")
	}
	return b.String()
}

// hexRun matches a long hex string: the launcher's token is 64 hex digits.
var hexRun = regexp.MustCompile(`[0-9a-fA-F]{32,}`)

// TestTokenAndEnvironmentStayPrivate: the token is in neither argv nor the
// environment of the daemon, the daemon gets none of the launcher's
// environment beyond PATH, and a process it starts sees neither the
// launcher's environment nor an inherited token descriptor.
func TestTokenAndEnvironmentStayPrivate(t *testing.T) {
	t.Setenv("BULKHEAD_PLANTED", "secret")
	// A descriptor the launcher leaks by mistake (not close-on-exec): the
	// daemon inherits it, but must not hand it on.
	leakR, leakW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer leakR.Close()
	defer leakW.Close()
	// F_DUPFD: a copy at a high number, without close-on-exec.
	leakFD, err := unix.FcntlInt(leakR.Fd(), unix.F_DUPFD, 100)
	if err != nil {
		t.Fatal(err)
	}
	var closeLeak sync.Once
	closeLeakFD := func() { closeLeak.Do(func() { _ = unix.Close(leakFD) }) }
	t.Cleanup(closeLeakFD)
	leaked := strconv.Itoa(leakFD)
	ctx := testCtx(t)
	s := startSandbox(t, Options{})
	closeLeakFD() // no further child may inherit it
	pid := strconv.Itoa(s.PID())
	if _, err := os.Readlink("/proc/" + pid + "/fd/" + leaked); err != nil {
		t.Fatalf("the daemon did not inherit the leaked descriptor %s, so the test proves nothing: %v", leaked, err)
	}

	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	wantArgv := []string{agentdBin, "--listen", "unix://" + s.Socket, "--token-fd", "3", "--workspace", s.Workspace}
	if !slices.Equal(argv, wantArgv) {
		t.Errorf("daemon argv = %q, want %q", argv, wantArgv)
	}
	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(strings.TrimRight(string(environ), "\x00"), "\x00")
	if want := []string{"PATH=" + os.Getenv("PATH")}; !slices.Equal(env, want) {
		t.Errorf("daemon environment = %q, want only %q", env, want)
	}
	if bytes.Contains(environ, []byte("BULKHEAD_PLANTED")) || bytes.Contains(environ, []byte("secret")) {
		t.Errorf("daemon environment carries the launcher's variable: %q", environ)
	}
	// The token descriptor was read and closed: the daemon holds no pipe
	// on fd 3 any more.
	if target, err := os.Readlink("/proc/" + pid + "/fd/3"); err == nil && strings.HasPrefix(target, "pipe:") {
		t.Errorf("daemon still holds the token pipe on fd 3 (%s)", target)
	}

	// A process started through the daemon: the daemon's own environment
	// is either unreadable or free of what the launcher planted, and its
	// own environment is clean too.
	out, errOut, code := execShell(ctx, t, s, "cat /proc/"+pid+"/environ")
	if code == 0 && !strings.HasPrefix(out, "PATH=") {
		t.Errorf("cat /proc/<daemon>/environ succeeded with unexpected content %q", out)
	}
	if strings.Contains(out, "BULKHEAD_PLANTED") || strings.Contains(out, "secret") {
		t.Errorf("sandboxed process read the launcher's variable from the daemon (exit %d): %q", code, out)
	}
	t.Logf("cat /proc/<daemon>/environ: exit %d, %d bytes, stderr %q", code, len(out), errOut)
	out, _, code = execShell(ctx, t, s, "env")
	if code != 0 {
		t.Fatalf("env: exit %d", code)
	}
	if strings.Contains(out, "BULKHEAD_PLANTED") || hexRun.MatchString(out) {
		t.Errorf("sandboxed process environment is not clean: %q", out)
	}
	// Only stdin, stdout and stderr are inherited: no token descriptor.
	// Checked from outside on a started program that opens nothing itself.
	st, err := s.Client.Start(ctx, agentclient.ProcessSpec{Argv: []string{"sleep", "1000"}}, agentclient.StartOptions{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// Until its exec completes, the child still holds Go's exec-status
	// pipe; an inherited descriptor, by contrast, never goes away.
	fdDir := "/proc/" + strconv.Itoa(int(st.Process.PID)) + "/fd"
	eventually(t, 10*time.Second, "sleep holds only descriptors 0, 1 and 2", func() (bool, string) {
		ps, _ := readStat(int(st.Process.PID))
		fds, err := os.ReadDir(fdDir)
		if err != nil || len(fds) == 0 {
			return false, fmt.Sprintf("%s: %v", fdDir, err)
		}
		var extra []string
		for _, fd := range fds {
			if n := fd.Name(); n != "0" && n != "1" && n != "2" {
				target, _ := os.Readlink(filepath.Join(fdDir, n))
				extra = append(extra, n+" -> "+target)
			}
		}
		return ps.comm == "sleep" && len(extra) == 0, fmt.Sprintf("%v; inherited: %q", ps, extra)
	})
	if err := s.Client.Signal(ctx, st.Process.ProcessID, "KILL"); err != nil {
		t.Errorf("Signal: %v", err)
	}
}

// TestSIGTERMDrains: SIGTERM makes the daemon kill its process groups,
// remove its socket and exit 0, without the drain timing out.
func TestSIGTERMDrains(t *testing.T) {
	ctx := testCtx(t)
	var log syncbuf.Buffer
	s := startSandbox(t, Options{Stderr: &log})
	st, err := s.Client.Start(ctx, agentclient.ProcessSpec{Command: "sleep 1000 & echo $!; sleep 1000"}, agentclient.StartOptions{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pgid := int(st.Process.PID)
	bgPID, err := strconv.Atoi(readLine(ctx, t, s, st.Process.ProcessID))
	if err != nil {
		t.Fatal(err)
	}
	var members []procStat
	eventually(t, 10*time.Second, "process group holds a shell and two sleeps", func() (bool, string) {
		members = procsWhere(func(p procStat) bool { return p.pgrp == pgid })
		return len(members) == 3, fmtProcs(members)
	})
	if bg := mustStat(t, bgPID); bg.pgrp != pgid {
		t.Fatalf("background sleep %v is not in group %d", bg, pgid)
	}

	if err := syscall.Kill(s.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Exited():
	case <-time.After(60 * time.Second):
		t.Fatalf("daemon did not exit after SIGTERM; log:\n%s", log.String())
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("daemon exit code after SIGTERM = %d (%s), want 0; log:\n%s", code, s.cmd.ProcessState, log.String())
	}
	if strings.Contains(log.String(), "drain timed out") || strings.Contains(log.String(), "stopping processes") {
		t.Errorf("drain did not complete cleanly; log:\n%s", log.String())
	}
	if _, err := os.Lstat(s.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s not removed after SIGTERM: %v", s.Socket, err)
	}
	for _, m := range members {
		eventually(t, 10*time.Second, "member "+m.String()+" gone", func() (bool, string) {
			now, _ := readStat(m.pid)
			return !alive(m), now.String()
		})
	}
	eventually(t, 10*time.Second, "process group empty", func() (bool, string) {
		left := procsWhere(func(p procStat) bool { return p.pgrp == pgid && p.state != 'Z' })
		return len(left) == 0, fmtProcs(left)
	})
	// Calls after the exit fail as unavailable (and say so), they do not hang.
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.Client.Info(callCtx); err == nil {
		t.Error("Info succeeded after the daemon exited")
	}
}

// gatedReader yields head bytes, then blocks until gate is closed, then
// yields the rest of size bytes.
type gatedReader struct {
	head, size int
	n          int
	reached    chan struct{}
	gate       chan struct{}
	once       sync.Once
}

func (r *gatedReader) Read(p []byte) (int, error) {
	if r.n >= r.size {
		return 0, io.EOF
	}
	if r.n >= r.head {
		r.once.Do(func() { close(r.reached) })
		<-r.gate
	}
	limit := r.size
	if r.n < r.head {
		limit = r.head
	}
	k := min(len(p), limit-r.n)
	for i := range k {
		p[i] = 'B'
	}
	r.n += k
	return k, nil
}

// TestKillDuringWriteKeepsOldContent: a daemon killed in the middle of a
// WriteFile leaves the old file intact, the client sees a retryable
// "unavailable" error, and the next daemon on the workspace removes the
// leftover temporary file at start-up.
func TestKillDuringWriteKeepsOldContent(t *testing.T) {
	ctx := testCtx(t)
	ws := filepath.Join(t.TempDir(), "ws")
	s := startSandbox(t, Options{Workspace: ws})
	const contentA = "content A\n"
	if _, err := s.Client.WriteFile(ctx, "f.txt", agentclient.WriteFileOptions{}, strings.NewReader(contentA)); err != nil {
		t.Fatalf("WriteFile A: %v", err)
	}

	r := &gatedReader{head: 1 << 20, size: 64 << 20, reached: make(chan struct{}), gate: make(chan struct{})}
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(r.gate) }) }
	t.Cleanup(openGate)
	writeErr := make(chan error, 1)
	go func() {
		_, err := s.Client.WriteFile(ctx, "f.txt", agentclient.WriteFileOptions{}, r)
		writeErr <- err
	}()
	select {
	case <-r.reached:
	case err := <-writeErr:
		t.Fatalf("WriteFile ended before the daemon was killed: %v", err)
	case <-ctx.Done():
		t.Fatal("the first MiB was never sent")
	}
	// The daemon has started writing: its temporary file exists.
	var tmpName string
	eventually(t, 30*time.Second, "temporary file appears", func() (bool, string) {
		ents, _ := os.ReadDir(ws)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
			if strings.HasPrefix(e.Name(), workspace.TempPrefix) {
				tmpName = e.Name()
				return true, ""
			}
		}
		return false, strings.Join(names, ",")
	})

	if err := syscall.Kill(s.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.Exited()
	openGate()
	var err error
	select {
	case err = <-writeErr:
	case <-time.After(60 * time.Second):
		t.Fatal("WriteFile did not return after the daemon died")
	}
	if err == nil {
		t.Fatal("WriteFile succeeded although the daemon was killed")
	}
	if !errors.Is(err, errkind.ErrUnavailable) {
		t.Errorf("WriteFile error %v (%T) does not match errkind.ErrUnavailable", err, err)
	}
	if !errkind.Retryable(err) {
		t.Errorf("WriteFile error %v is not Retryable; an atomic write interrupted by a dead daemon is safe to retry", err)
	}
	t.Logf("WriteFile after SIGKILL: %v (ErrUnavailable=%v Retryable=%v)", err, errors.Is(err, errkind.ErrUnavailable), errkind.Retryable(err))

	if got, err := os.ReadFile(filepath.Join(ws, "f.txt")); err != nil || string(got) != contentA {
		t.Fatalf("f.txt after the interrupted write = %q, %v; want %q", got, err, contentA)
	}
	if _, err := os.Stat(filepath.Join(ws, tmpName)); err != nil {
		t.Fatalf("the killed daemon's temporary file %s should still be there: %v", tmpName, err)
	}
	closeCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = s.Close(closeCtx) // the process is gone; this releases the client and private dir
	if _, err := os.Stat(ws); err != nil {
		t.Fatalf("Close removed a workspace it does not own: %v", err)
	}

	s2 := startSandbox(t, Options{Workspace: ws})
	if _, err := os.Stat(filepath.Join(ws, tmpName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file %s not removed by the next daemon's start-up: %v", tmpName, err)
	}
	var buf bytes.Buffer
	if _, err := s2.Client.ReadFile(ctx, "f.txt", agentclient.ReadFileOptions{}, &buf); err != nil || buf.String() != contentA {
		t.Errorf("f.txt through the new daemon = %q, %v; want %q", buf.String(), err, contentA)
	}
	// The retry the error invites succeeds.
	if _, err := s2.Client.WriteFile(ctx, "f.txt", agentclient.WriteFileOptions{}, strings.NewReader("content B\n")); err != nil {
		t.Errorf("retried WriteFile: %v", err)
	}
}

// TestReflectionAndHealth: with the token, server reflection lists every
// service; without it reflection is refused, while health answers.
func TestReflectionAndHealth(t *testing.T) {
	ctx := testCtx(t)
	token, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	s := startSandbox(t, Options{Token: token})

	anon, err := grpc.NewClient("unix://"+s.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	k, v := agentclient.BearerMetadata(token)
	services, err := listServices(metadata.AppendToOutgoingContext(ctx, k, v), anon)
	if err != nil {
		t.Fatalf("reflection with the token: %v", err)
	}
	for _, want := range []string{
		"bulkhead.agentd.v1.ProcessService", "bulkhead.agentd.v1.FileService",
		"bulkhead.agentd.v1.WorkspaceService", "bulkhead.agentd.v1.SystemService",
		"grpc.health.v1.Health",
	} {
		if !slices.Contains(services, want) {
			t.Errorf("reflection lists %q, missing %s", services, want)
		}
	}

	if got, err := listServices(ctx, anon); status.Code(err) != codes.Unauthenticated {
		t.Errorf("reflection without a token: services %q, err %v; want Unauthenticated", got, err)
	}
	if _, err := agentclient.New(anon).Info(ctx); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Errorf("Info without a token: %v; want Unauthenticated", err)
	}
	resp, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a token = %v, %v; want SERVING", resp.GetStatus(), err)
	}
}

// listServices asks server reflection (v1) for the service names.
func listServices(ctx context.Context, conn *grpc.ClientConn) ([]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"},
	}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if e := resp.GetErrorResponse(); e != nil {
		return nil, status.Error(codes.Code(e.GetErrorCode()), e.GetErrorMessage())
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.Name)
	}
	_ = stream.CloseSend()
	return names, nil
}
