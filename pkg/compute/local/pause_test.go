package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/egresstest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// pauseEnv is a gVisor provider on the test root file system (busybox)
// with a local snapshot store.
type pauseEnv struct {
	state string
	store snapshot.Store
	cfg   Config
}

func newPauseEnv(t *testing.T) *pauseEnv {
	t.Helper()
	testenv.Require(t, testenv.Root) // runsc restores only as root
	bin := runsc.Require(t)
	rootfs := agentdtest.RootFS(t)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	state := testenv.SearchableTempDir(t)
	return &pauseEnv{state: state, store: store,
		cfg: Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: bin, RootFS: rootfs}}
}

// client is a new harness's client (a fresh provider, as after a restart).
func (e *pauseEnv) client(t *testing.T) *compute.Client {
	t.Helper()
	c, err := NewClient(e.cfg, compute.ClientOptions{Snapshots: e.store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// counterLine is the last complete "PID COUNT" line of a counter's
// output ("", 0 before the first).
func counterLine(t *testing.T, out string) (pid string, count int) {
	t.Helper()
	i := strings.LastIndexByte(out, '\n')
	if i < 0 {
		return "", 0
	}
	lines := strings.Split(out[:i], "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 2 {
		t.Fatalf("counter output %q", out)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("counter output %q", out)
	}
	return f[0], n
}

// readCounter reads the counter's output from the start and returns its
// last line's pid and count.
func readCounter(ctx context.Context, t *testing.T, s *compute.Session, id string) (string, int) {
	t.Helper()
	var all bytes.Buffer
	var cursor int64
	for {
		out, err := s.ReadOutput(ctx, id, compute.ReadOutputOptions{Cursor: cursor})
		if err != nil {
			t.Fatalf("read the counter: %v", err)
		}
		for _, ch := range out.Chunks {
			all.Write(ch.Data)
		}
		if out.NextCursor == cursor {
			break
		}
		cursor = out.NextCursor
	}
	return counterLine(t, all.String())
}

// waitCount waits until the counter counts above n.
func waitCount(ctx context.Context, t *testing.T, s *compute.Session, id string, n int) (string, int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pid, c := readCounter(ctx, t, s, id)
		if c > n {
			return pid, c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter stays at %d", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGVisorPauseResume pauses a live gVisor sandbox and restores it:
// a process counting in memory goes on (same pid, a larger count, its
// output ring and cursor kept), a loopback TCP server started inside
// serves again (inside and through a forward), files written before are
// there, exec, ReadFile and a PTY work after, ten cycles of one sandbox
// pass, and the times are measured.
func TestGVisorPauseResume(t *testing.T) {
	e := newPauseEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := e.client(t)
	s := createStarted(ctx, t, c, rootManifest)
	if _, err := s.WriteFile(ctx, "before.txt", compute.WriteFileOptions{}, strings.NewReader("written before the pause\n")); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := run(ctx, t, s, "", "mkdir -p www && echo served > www/index.html"); code != 0 {
		t.Fatalf("www: %q %q", out, errOut)
	}
	counter, err := s.StartProcess(ctx, compute.ProcessSpec{Command: `i=0; while :; do i=$((i+1)); echo "$$ $i"; sleep 0.05; done`}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cid := counter.Process.ProcessID
	if _, err := s.StartProcess(ctx, compute.ProcessSpec{Command: "exec httpd -f -p 127.0.0.1:8080 -h www"}, compute.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	pid0, n0 := waitCount(ctx, t, s, cid, 3)
	eventually(t, 10*time.Second, "httpd serves", func() (bool, string) {
		out, errOut, _ := run(ctx, t, s, "", "wget -qO- http://127.0.0.1:8080/index.html")
		return out == "served\n", out + errOut
	})

	var pauses, resumes []time.Duration
	pid, n := pid0, n0
	for cycle := 1; cycle <= 10; cycle++ {
		start := time.Now()
		info, err := s.Pause(ctx)
		if err != nil {
			t.Fatalf("cycle %d: pause: %v", cycle, err)
		}
		pauses = append(pauses, time.Since(start))
		st, dir := sandboxState(t, s)
		var ps providerState
		_ = json.Unmarshal(st.ProviderState, &ps)
		if !st.Paused || !pausedAt(dir) || ps.Checkpoint != info.Checkpoint || info.Bytes == 0 || info.Checkpoint != filepath.Join(dir, gvisorDir, checkpointDir) {
			t.Fatalf("cycle %d: state paused %v, checkpoint %+v", cycle, st.Paused, info)
		}
		if procs := sandboxProcesses(sandboxMarkers(dir)); len(procs) > 0 {
			t.Fatalf("cycle %d: paused, yet the sandbox runs: %+v", cycle, procs)
		}
		if cycle == 1 {
			infos, err := c.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(infos, func(i compute.SandboxInfo) bool { return i.SessionID == s.ID() }); i < 0 || !infos[i].Paused || infos[i].Running {
				t.Fatalf("list: %+v", infos)
			}
			if _, err := s.Exec(ctx, compute.ProcessSpec{Command: "true"}, compute.ExecOptions{}, nil); err == nil {
				t.Fatal("exec on a paused session")
			}
		}
		// A new harness resumes it from the state.
		start = time.Now()
		s, err = e.client(t).Resume(ctx, st)
		if err != nil {
			t.Fatalf("cycle %d: resume: %v", cycle, err)
		}
		res, err := s.Exec(ctx, compute.ProcessSpec{Argv: []string{"true"}}, compute.ExecOptions{}, nil)
		if err != nil || res.Exit.ExitCode != 0 {
			t.Fatalf("cycle %d: first exec after resume: %+v %v", cycle, res, err)
		}
		resumes = append(resumes, time.Since(start))
		if !s.Restored() || pausedAt(dir) {
			t.Fatalf("cycle %d: restored %v, checkpoint left %v", cycle, s.Restored(), pausedAt(dir))
		}
		p2, n2 := waitCount(ctx, t, s, cid, n)
		if p2 != pid0 {
			t.Fatalf("cycle %d: the counter's shell is pid %s, was %s: it restarted", cycle, p2, pid0)
		}
		pid, n = p2, n2
	}
	_ = pid
	t.Logf("pause (workspace snapshot + checkpoint): %v", pauses)
	t.Logf("resume to first exec: %v", resumes)
	t.Logf("pause median %v, resume-to-first-exec median %v", median(pauses), median(resumes))

	// After the cycles: the process list, files, the server (inside and
	// forwarded), a PTY.
	procs, err := s.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(procs, func(p compute.ProcessInfo) bool { return p.ProcessID == cid }); i < 0 || procs[i].State != compute.ProcessRunning {
		t.Fatalf("the counter is not listed running: %+v", procs)
	}
	var b strings.Builder
	if _, err := s.ReadFile(ctx, "before.txt", compute.ReadFileOptions{}, &b); err != nil || b.String() != "written before the pause\n" {
		t.Fatalf("before.txt: %q, %v", b.String(), err)
	}
	if out, errOut, _ := run(ctx, t, s, "", "wget -qO- http://127.0.0.1:8080/index.html"); out != "served\n" {
		t.Fatalf("httpd after resume: %q %q", out, errOut)
	}
	conn, err := s.Forward(ctx, 8080)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /index.html HTTP/1.0\r\n\r\n")
	resp, _ := io.ReadAll(conn)
	conn.Close()
	if !bytes.HasSuffix(resp, []byte("served\n")) {
		t.Fatalf("forwarded to httpd: %q", resp)
	}
	pty, err := s.StartProcess(ctx, compute.ProcessSpec{Command: "sh", Tty: true}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteStdin(ctx, pty.Process.ProcessID, 0, []byte("echo pty-$((6*7)); exit\n")); err != nil {
		t.Fatal(err)
	}
	var ptyOut strings.Builder
	if _, err := s.Follow(ctx, pty.Process.ProcessID, compute.FollowOptions{}, func(o *compute.Output) error {
		for _, ch := range o.Chunks {
			ptyOut.Write(ch.Data)
		}
		return nil
	}); err != nil || !strings.Contains(ptyOut.String(), "pty-42") {
		t.Fatalf("pty: %q, %v", ptyOut.String(), err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestGVisorRestoreFails: a restore whose image is corrupt, missing or
// made by another runsc fails cleanly (FailedPrecondition, nothing left
// running, the checkpoint kept), and the session resumes from its
// workspace with DiscardMemory.
func TestGVisorRestoreFails(t *testing.T) {
	e := newPauseEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := e.client(t)
	s := createStarted(ctx, t, c, rootManifest)
	if _, err := s.WriteFile(ctx, "kept.txt", compute.WriteFileOptions{}, strings.NewReader("kept\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	st, dir := sandboxState(t, s)
	final, _ := checkpointPaths(dir)
	image := filepath.Join(final, checkpointImage)
	good, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(final, checkpointRecord)
	goodRecord, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	fails := func(what, want string) {
		t.Helper()
		_, err := e.client(t).Resume(ctx, st)
		if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--discard-memory") {
			t.Fatalf("%s: resume: %v, want a failed precondition naming %q and the way back", what, err, want)
		}
		t.Logf("%s: %.300s", what, err)
		if procs := sandboxProcesses(sandboxMarkers(dir)); len(procs) > 0 {
			t.Fatalf("%s: a failed restore left %+v", what, procs)
		}
		if !pausedAt(dir) {
			t.Fatalf("%s: the checkpoint is gone", what)
		}
	}
	// Another runsc made it.
	var ck checkpointMeta
	if err := json.Unmarshal(goodRecord, &ck); err != nil {
		t.Fatal(err)
	}
	ck.Runsc = "runsc version release-20990101.0"
	bad, _ := json.Marshal(ck)
	if err := os.WriteFile(record, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	fails("another runsc", "release-20990101.0")
	if err := os.WriteFile(record, goodRecord, 0o600); err != nil {
		t.Fatal(err)
	}
	// Missing.
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}
	fails("a missing image", "missing")
	// Corrupt: runsc fails reading it.
	corrupt := bytes.Repeat([]byte("not a checkpoint "), len(good)/17+1)
	if err := os.WriteFile(image, corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	fails("a corrupt image", "restoring container")
	// The way back: its workspace.
	s2, err := e.client(t).Resume(ctx, st, compute.DiscardMemory())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s2) })
	if s2.Restored() {
		t.Fatal("restored with DiscardMemory")
	}
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if _, err := s2.ReadFile(ctx, "kept.txt", compute.ReadFileOptions{}, &b); err != nil || b.String() != "kept\n" {
		t.Fatalf("kept.txt after the rebuild: %q, %v", b.String(), err)
	}
	if pausedAt(dir) {
		t.Fatal("the checkpoint outlived the rebuild")
	}
}

// TestGVisorPauseInterrupted: a harness killed in the middle of a pause
// leaves the sandbox running or restorable. Its steps are run by hand:
// the daemon prepared and closed but no checkpoint taken (a later harness
// brings it back at once), and a checkpoint written with nothing cleaned
// up after it (a later harness restores it).
func TestGVisorPauseInterrupted(t *testing.T) {
	e := newPauseEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := e.client(t)
	s := createStarted(ctx, t, c, rootManifest)
	counter, err := s.StartProcess(ctx, compute.ProcessSpec{Command: `i=0; while :; do i=$((i+1)); echo "$$ $i"; sleep 0.05; done`}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cid := counter.Process.ProcessID
	pid0, n := waitCount(ctx, t, s, cid, 2)
	st, dir := sandboxState(t, s)
	socket := filepath.Join(dir, runDir, socketName)
	prepare := func() {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, gvisorDir, checkpointPausing), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.Agent().PrepareCheckpoint(ctx, agentclient.PrepareCheckpointOptions{ResumeAfter: 5 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		_ = s.Release()
		if err := waitGone(ctx, socket, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Killed after the daemon closed.
	prepare()
	start := time.Now()
	s, err = e.client(t).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if s.Restored() || time.Since(start) > time.Minute {
		t.Fatalf("a prepared sandbox: restored %v after %s", s.Restored(), time.Since(start))
	}
	pid, n2 := waitCount(ctx, t, s, cid, n)
	if pid != pid0 {
		t.Fatalf("the counter restarted: pid %s, was %s", pid, pid0)
	}
	// Killed after the checkpoint: nothing released, no state saved.
	prepare()
	p, err := New(e.cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	pr, _ := p.running(dir)
	flags, err := runningRunscFlags(pr)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := json.Marshal(checkpointMeta{Version: checkpointVersion, SessionID: st.SessionID, Runsc: mustIdentity(t, p), RunscFlags: flags,
		Bundle: mustDigest(t, dir), Caps: Resources{}})
	if err != nil {
		t.Fatal(err)
	}
	final, tmp := checkpointPaths(dir)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, checkpointRecord), ck, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := p.runCheckpoint(dir, flags, tmp, final); err != nil {
		t.Fatalf("checkpoint: %v: %s", err, out)
	}
	s, err = e.client(t).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if !s.Restored() {
		t.Fatal("not restored from the checkpoint")
	}
	if pid, _ := waitCount(ctx, t, s, cid, n2); pid != pid0 {
		t.Fatalf("the counter restarted: pid %s, was %s", pid, pid0)
	}
}

func mustIdentity(t *testing.T, p *Provider) string {
	t.Helper()
	id, err := p.runscIdentity(p.runsc)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func mustDigest(t *testing.T, dir string) string {
	t.Helper()
	d, err := bundleDigest(dir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// rootManifest runs the sandbox's work as root (of gVisor's sentry): the
// test's state directory lies below /tmp, which a sandbox on a root file
// system of its own gets as a fresh tmpfs that other accounts cannot pass.
var rootManifest = &manifest.Manifest{RunAs: "root"}

// TestPauseUnimplemented: a local sandbox not under gVisor cannot be
// paused: a clear Unimplemented error, and the sandbox goes on untouched.
func TestPauseUnimplemented(t *testing.T) {
	env, _ := providerEnvWith(t, IsolationNone)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := env.NewClient(t, nil)
	s := createStarted(ctx, t, c, nil)
	_, err := s.Pause(ctx)
	if !errors.Is(err, compute.ErrUnimplemented) || !strings.Contains(err.Error(), "gVisor") || !strings.Contains(err.Error(), "none isolation") {
		t.Fatalf("pause of a plain sandbox: %v, want Unimplemented naming gVisor", err)
	}
	if out, _, code := run(ctx, t, s, "", "echo still"); code != 0 || out != "still\n" {
		t.Fatalf("after the refused pause: %q", out)
	}
	if st, _ := sandboxState(t, s); st.Paused {
		t.Fatal("a refused pause marked the state paused")
	}
}

// TestGVisorPauseEgress: a sandbox with egress control (its relay holds
// connections to the harness's proxy, host sockets through runsc
// --host-uds=all) pauses, and reaches the allowed name again after the
// restore, through the proxy a resuming harness serves again.
func TestGVisorPauseEgress(t *testing.T) {
	testenv.Require(t, testenv.Root) // runsc restores only as root
	bin := runsc.Require(t)
	client := egresstest.Client(t)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s%s", r.Host, r.URL.Path) }))
	defer hs.Close()
	port := hs.Listener.Addr().(*net.TCPAddr).Port
	_, stateDir := providerEnvWith(t, IsolationGVisor)
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	cfg := Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: bin,
		Egress: &egress.Options{
			Policy:     egress.Policy{Allow: []egress.Rule{{Host: "allowed.test", Ports: []int{port}}}},
			Resolver:   egresstest.Resolver{"allowed.test": loop},
			AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		}}
	newClient := func() *compute.Client {
		p, err := New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return compute.NewClient(p, compute.ClientOptions{Log: testLogger(t)})
	}
	c := newClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := createStarted(ctx, t, c, nil)
	if _, err := s.WriteFile(ctx, "netclient", compute.WriteFileOptions{Mode: 0o755}, bytes.NewReader(client)); err != nil {
		t.Fatal(err)
	}
	get := func(s *compute.Session) string {
		t.Helper()
		out, errOut, _ := run(ctx, t, s, "", fmt.Sprintf("./netclient get http://allowed.test:%d/x", port))
		return strings.TrimSpace(out + errOut)
	}
	if out := get(s); !strings.HasPrefix(out, "status 200: hello allowed.test") {
		t.Fatalf("before the pause: %s", out)
	}
	if _, err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	st, _ := sandboxState(t, s)
	s, err := newClient().Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if !s.Restored() {
		t.Fatal("not restored")
	}
	if out := get(s); !strings.HasPrefix(out, "status 200: hello allowed.test") {
		t.Fatalf("after the restore: %s", out)
	}
}

// TestGVisorPauseKeepsCaps: a capped sandbox releases its cgroups with the
// pause (nothing of it runs), and the restore makes them again with the
// same caps, the restored sandbox in them.
func TestGVisorPauseKeepsCaps(t *testing.T) {
	requireCaps(t)
	e := newPauseEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e.client(t)
	r := Resources{Memory: 512 << 20, MaxProcesses: 64}
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: rootManifest, ProviderOptions: &CreateOptions{Resources: r}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, dir := sandboxState(t, s)
	memMax := func() (string, int64) {
		t.Helper()
		for _, name := range []string{"memory.max", "memory.limit_in_bytes"} {
			v1, _ := recordedCgroupsV1(dir)
			v2, _ := recordedCgroup(dir)
			for _, cg := range append(v1, v2) {
				if cg == "" {
					continue
				}
				if _, err := os.Stat(filepath.Join(cg, name)); err == nil {
					return cg, readInt(t, filepath.Join(cg, name))
				}
			}
		}
		return "", 0
	}
	before, limit := memMax()
	if limit != r.Memory {
		t.Fatalf("memory cap %d in %s before the pause", limit, before)
	}
	if _, err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(before); !os.IsNotExist(err) {
		t.Fatalf("the paused sandbox's cgroup %s is left: %v", before, err)
	}
	st, _ := sandboxState(t, s)
	s, err = e.client(t).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	after, limit := memMax()
	if limit != r.Memory {
		t.Fatalf("memory cap %d in %s after the restore", limit, after)
	}
	pid, _ := (&Provider{}).running(dir)
	procs, err := os.ReadFile(filepath.Join(after, "cgroup.procs"))
	if err != nil || !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) {
		t.Fatalf("the restored runsc (pid %d) is not in %s: %q, %v", pid, after, procs, err)
	}
	if out, _, code := run(ctx, t, s, "", "echo capped"); code != 0 || out != "capped\n" {
		t.Fatalf("after the restore: %q", out)
	}
}
