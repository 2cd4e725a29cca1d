package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/egresstest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/computetest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func TestParseIsolationGVisor(t *testing.T) {
	if got, err := ParseIsolation("gvisor"); err != nil || got != IsolationGVisor {
		t.Fatalf("ParseIsolation(gvisor) = %q, %v", got, err)
	}
}

// TestGVisorNeedsRunsc: gVisor isolation asked for by name without runsc
// is refused (never a silent fallback), as is a runsc path that is not
// an executable.
func TestGVisorNeedsRunsc(t *testing.T) {
	state := t.TempDir()
	agentd := filepath.Join(t.TempDir(), "sandbox-agentd") // never started here
	t.Setenv("PATH", t.TempDir())
	_, err := New(Config{StateDir: state, AgentdPath: agentd, Isolation: IsolationGVisor}, zap.NewNop())
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "runsc") {
		t.Fatalf("gvisor without runsc: %v, want a failed precondition naming runsc", err)
	}
	notExec := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{StateDir: state, AgentdPath: agentd, Isolation: IsolationGVisor, Runsc: notExec}, zap.NewNop()); !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Fatalf("gvisor with a runsc that is not executable: %v", err)
	}
}

// TestGVisorSpec checks the OCI bundle a gVisor sandbox runs: the host
// read-only, the sandbox's own directories writable, the workspace at its
// sandbox path only (see wsroot.go), /run (the host's daemons' sockets)
// and the rest of the state directory hidden, no network, the daemon's
// capabilities only; and runsc's flags.
func TestGVisorSpec(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{StateDir: state, AgentdPath: "/bin/true", Isolation: IsolationGVisor, Runsc: fake}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if p.Isolation() != IsolationGVisor || !p.Isolated() {
		t.Fatalf("isolation %q", p.Isolation())
	}
	dir := filepath.Join(state, "sess-1")
	argv := []string{"/opt/bin/sandbox-agentd", "--listen", "unix://" + filepath.Join(dir, runDir, socketName)}
	// A root whose directories all exist on the host: the host's / is
	// bound whole, the workspace over the root.
	hostRoot := t.TempDir()
	spec, err := p.gvisorSpec(dir, hostRoot, argv)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(spec.Process.Args, argv) || spec.Process.User.UID != 0 || !spec.Process.NoNewPrivileges {
		t.Errorf("process %+v, want the daemon as root inside, without set-uid escalation", spec.Process)
	}
	for _, set := range [][]string{spec.Process.Capabilities.Bounding, spec.Process.Capabilities.Effective, spec.Process.Capabilities.Permitted} {
		if !slices.Equal(set, daemonCapabilities) {
			t.Errorf("capabilities %+v, want %v in each set", spec.Process.Capabilities, daemonCapabilities)
		}
	}
	if !spec.Root.Readonly {
		t.Error("root is writable")
	}
	mounts := map[string]ociMount{}
	for i, m := range spec.Mounts {
		if _, dup := mounts[m.Destination]; dup {
			t.Errorf("%s mounted twice", m.Destination)
		}
		mounts[m.Destination] = m
		if i == 0 && (m.Destination != "/" || !slices.Contains(m.Options, "ro")) {
			t.Errorf("first mount %+v, want the host read-only at /", m)
		}
	}
	rw := func(dst string) bool { return slices.Contains(mounts[dst].Options, "rw") }
	for _, d := range []string{filepath.Join(dir, runDir), filepath.Join(dir, "etc"), filepath.Join(dir, homeDir)} {
		if m, ok := mounts[d]; !ok || m.Source != d || !rw(d) {
			t.Errorf("%s: %+v, want a writable bind of itself", d, m)
		}
	}
	if m, ok := mounts[hostRoot]; !ok || m.Source != filepath.Join(dir, "workspace") || !rw(hostRoot) {
		t.Errorf("workspace root %s: %+v, want a writable bind of the workspace", hostRoot, m)
	}
	if m, ok := mounts[filepath.Join(dir, "workspace")]; ok {
		t.Errorf("the workspace is mounted at its host path too: %+v", m)
	}
	for _, d := range []string{"/run", "/tmp"} {
		if mounts[d].Type != "tmpfs" {
			t.Errorf("%s is not a fresh tmpfs: %+v", d, mounts[d])
		}
	}
	if mounts["/etc"].Source != gvisorPathsOf(dir).etcView || rw("/etc") || mounts["/etc/"+hostEtc].Source != "/etc" {
		t.Errorf("/etc: %+v, /etc/.host: %+v", mounts["/etc"], mounts["/etc/"+hostEtc])
	}
	if last := spec.Mounts[len(spec.Mounts)-1]; last.Destination != argv[0] || !slices.Contains(last.Options, "ro") {
		t.Errorf("last mount %+v, want the daemon binary read-only", last)
	}
	if !slices.Contains(spec.Linux.Namespaces, ociNamespace{"network"}) || !slices.Contains(spec.Linux.Namespaces, ociNamespace{"pid"}) {
		t.Errorf("namespaces %v", spec.Linux.Namespaces)
	}
	run := p.gvisorArgv(dir)
	for _, want := range []string{gvisorMarker(dir), "--network=none", "--host-uds=create", "--ignore-cgroups", "run", gvisorContainerID(dir)} {
		if !slices.Contains(run, want) {
			t.Errorf("runsc argv %v lacks %q", run, want)
		}
	}
	if run[0] != fake || !hasMarker([]byte(strings.Join(run, "\x00")), sandboxMarkers(dir)) {
		t.Errorf("runsc argv %v", run)
	}
	if id := gvisorContainerID(filepath.Join(state, "a b/c")); strings.ContainsAny(id, " /") {
		t.Errorf("container id %q", id)
	}

	// A root the host lacks (the usual /workspace): the host's top-level
	// entries bound read-only on an empty root, which holds the mount
	// point.
	missing := "/bulkhead-no-such-dir/app"
	if hostMountPoint(missing) {
		t.Fatalf("%s exists on this host", missing)
	}
	spec, err = p.gvisorSpec(dir, missing, argv)
	if err != nil {
		t.Fatal(err)
	}
	mounts = map[string]ociMount{}
	for _, m := range spec.Mounts {
		if m.Destination == "/" {
			t.Errorf("the host's / is bound whole: %+v", m)
		}
		mounts[m.Destination] = m
	}
	if m := mounts["/usr"]; m.Source != "/usr" || !slices.Contains(m.Options, "ro") {
		t.Errorf("/usr: %+v, want the host's, read-only", m)
	}
	if m := mounts[missing]; m.Source != filepath.Join(dir, "workspace") || !rw(missing) {
		t.Errorf("workspace root %s: %+v, want a writable bind of the workspace", missing, m)
	}
}

// gvisorEnv is providerEnvWith for gVisor sandboxes: its daemons are found
// by their runsc processes, since the daemon itself is not in the host's
// process table.
func gvisorEnv(t *testing.T, bin string) (computetest.Env, string) {
	env, stateDir := providerEnvWith(t, IsolationGVisor)
	env.NewClient = func(t *testing.T, store snapshot.Store) *compute.Client {
		log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
		c, err := NewClient(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: bin},
			compute.ClientOptions{Snapshots: store, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	env.Leaked = func(t *testing.T, sessionID string) []string {
		var left []string
		dir := filepath.Join(stateDir, sessionID)
		if _, err := os.Stat(dir); err == nil {
			left = append(left, "directory "+sessionID)
		}
		for _, pr := range sandboxProcesses(sandboxMarkers(dir)) {
			left = append(left, "process "+pr.argv0)
		}
		return left
	}
	return env, stateDir
}

// TestGVisorSandbox runs sandboxes with gVisor isolation (runsc built
// from the module proxy): the provider conformance suite, a lifecycle with
// a second harness, run_as accounts (which the daemon, root inside gVisor,
// switches to by effective ids: gVisor lacks setfsuid), and what the
// sandbox can reach.
func TestGVisorSandbox(t *testing.T) {
	bin := runsc.Require(t)
	env, stateDir := gvisorEnv(t, bin)
	t.Run("Conformance", func(t *testing.T) { computetest.Run(t, env) })
	t.Run("Lifecycle", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := env.NewClient(t, nil)
		m := &manifest.Manifest{Entries: map[string]*manifest.Entry{"repo/task.md": {Type: manifest.TypeFile, Content: []byte("fix the bug\n")}}}
		s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		deleted := false
		t.Cleanup(func() {
			if !deleted {
				_ = c.Delete(context.Background(), s)
			}
		})
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "cat repo/task.md; id -u; echo note > repo/note"}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Fields(string(res.Stdout))
		if len(lines) < 4 || lines[3] == "0" {
			t.Fatalf("exec: %q %q", res.Stdout, res.Stderr)
		}
		if uid, _ := strconv.Atoi(lines[3]); os.Geteuid() == 0 && uid < minSandboxUID {
			t.Errorf("a root harness's gVisor sandbox runs commands as uid %d, want its own account (>= %d)", uid, minSandboxUID)
		}
		// A second harness reattaches to the running sandbox.
		st, err := s.State()
		if err != nil {
			t.Fatal(err)
		}
		c2 := env.NewClient(t, nil)
		s2, err := c2.Resume(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if _, err := s2.Agent().ReadFile(ctx, "repo/note", compute.ReadFileOptions{}, &b); err != nil || b.String() != "note\n" {
			t.Fatalf("after resume: %q, %v", b.String(), err)
		}
		if err := c2.Delete(ctx, s2); err != nil {
			t.Fatal(err)
		}
		deleted = true
		if left := env.Leaked(t, s.ID()); len(left) > 0 {
			t.Errorf("leaked: %v", left)
		}
		if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), filepath.Join(stateDir, s.ID())) {
			t.Errorf("a mount of the sandbox is left:\n%s", mounts)
		}
	})
	t.Run("RunAs", func(t *testing.T) {
		testenv.Require(t, testenv.Root) // creating accounts needs a root harness
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := env.NewClient(t, nil)
		s, err := c.Create(ctx, compute.CreateOptions{Manifest: &manifest.Manifest{RunAs: "analyst", Users: []manifest.User{{Name: "analyst"}}}})
		if err != nil {
			t.Fatalf("a run_as account under gVisor: %v", err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// A file the daemon writes (for the run_as account, as no user is
		// named) and one a process writes.
		if _, err := s.Agent().WriteFile(ctx, "written.txt", compute.WriteFileOptions{}, strings.NewReader("w\n")); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(stateDir, s.ID())
		script := strings.Join([]string{
			"id -un", "id -u",
			"grep '^CapEff:' /proc/self/status | tr -d '\\t'",
			"grep '^Uid:' /proc/1/status | tr '\\t' ' '",
			"echo made > made.txt && echo made-ok",
			"cat /proc/1/environ >/dev/null 2>&1 && echo read-daemon-environ",
			"ls /proc/1/fd >/dev/null 2>&1 && echo listed-daemon-fds",
			"cat " + filepath.Join(dir, tokenFile) + " >/dev/null 2>&1 && echo read-token",
			"cat /proc/1/cmdline >/dev/null && echo cmdline-ok",
		}, "; ")
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: script}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := string(res.Stdout)
		t.Logf("as the run_as account:\n%s%s", out, res.Stderr)
		lines := strings.Split(out, "\n")
		if len(lines) < 6 || lines[0] != "analyst" || lines[1] == "0" || lines[2] != "CapEff:0000000000000000" ||
			lines[3] != "Uid: 0 0 0 0" || lines[4] != "made-ok" {
			t.Fatalf("want analyst without capabilities beside a root daemon (pid 1) and a writable workspace, got %q (stderr %q)", out, res.Stderr)
		}
		for _, leak := range []string{"read-daemon-environ", "listed-daemon-fds", "read-token"} {
			if strings.Contains(out, leak) {
				t.Errorf("the run_as account could: %s", leak)
			}
		}
		if !strings.Contains(out, "cmdline-ok") {
			t.Errorf("the probes of the daemon did not run: %q", out)
		}
		uid, err := strconv.ParseUint(lines[1], 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		// Writes as analyst and as root, interleaved: the daemon's threads
		// go back to root after each of analyst's (a thread left as
		// analyst would give root's file to analyst, or fail it).
		owners := map[string]uint32{"written.txt": uint32(uid), "made.txt": uint32(uid)}
		for i := range 20 {
			user, owner := "analyst", uint32(uid)
			if i%2 == 1 {
				user, owner = "root", 0
			}
			name := fmt.Sprintf("%s-%d.txt", user, i)
			if _, err := s.Agent().WriteFile(ctx, name, compute.WriteFileOptions{User: user}, strings.NewReader(name)); err != nil {
				t.Fatalf("write %s as %s: %v", name, user, err)
			}
			owners[name] = owner
		}
		for name, want := range owners {
			fi, err := os.Stat(filepath.Join(dir, "workspace", name))
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != want {
				t.Errorf("%s is owned by uid %d on the host, want %d", name, st.Uid, want)
			}
		}
	})
	t.Run("Confined", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := env.NewClient(t, nil)
		s, err := c.Create(ctx, compute.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
		if err := s.Start(ctx); err != nil { // gives the workspace to the sandbox's account
			t.Fatal(err)
		}
		outside := filepath.Join(t.TempDir(), "host-file")
		docker := "/run/docker.sock"
		script := strings.Join([]string{
			"dmesg 2>/dev/null | head -n 1",
			"touch " + outside + " 2>/dev/null && echo wrote-host",
			"test -e " + docker + " && echo sees-host-run",
			"ls " + stateDir + " | wc -l | sed 's/^/sandboxes seen /'",
			"tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ' | sed 's/^/ifaces /'",
			"echo",
			"echo pid $$",
			"echo hello > greeting && cat greeting",
		}, "; ")
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: script}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := string(res.Stdout)
		t.Logf("in the sandbox:\n%s%s", out, res.Stderr)
		if !strings.Contains(out, "gVisor") {
			t.Errorf("not in gVisor (dmesg): %q", out)
		}
		if strings.Contains(out, "wrote-host") {
			t.Errorf("the sandbox wrote to the host: %q", out)
		}
		if _, err := os.Stat(outside); err == nil {
			t.Error("host file created")
		}
		if !strings.Contains(out, "sandboxes seen 1\n") {
			t.Errorf("the sandbox sees more of the state directory than its own: %q", out)
		}
		if strings.Contains(out, "sees-host-run") {
			t.Errorf("the host's /run (and its daemons' sockets) is visible: %q", out)
		}
		if !strings.Contains(out, "ifaces lo \n") {
			t.Errorf("network interfaces besides loopback: %q", out)
		}
		if !strings.Contains(out, "\nhello\n") {
			t.Errorf("the workspace is not writable: %q", out)
		}
	})
}

// TestEgressThroughGVisor: with egress control, a gVisor sandbox reaches
// an allowed name (a loopback test server on the host stands in for it)
// through the daemon's relay (a host socket opened through runsc's
// --host-uds) and the harness's proxy; another name is refused, and the
// host's loopback is not the sandbox's.
func TestEgressThroughGVisor(t *testing.T) {
	bin := runsc.Require(t)
	client := egresstest.Client(t)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s%s", r.Host, r.URL.Path) }))
	defer hs.Close()
	port := strconv.Itoa(hs.Listener.Addr().(*net.TCPAddr).Port)
	_, stateDir := providerEnvWith(t, IsolationGVisor)
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	p, err := New(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: bin,
		Egress: &egress.Options{
			Policy:     egress.Policy{Allow: []egress.Rule{{Host: "allowed.test", Ports: []int{hs.Listener.Addr().(*net.TCPAddr).Port}}}},
			Resolver:   egresstest.Resolver{"allowed.test": loop, "other.test": loop},
			AllowAddrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := compute.NewClient(p, compute.ClientOptions{Log: testLogger(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Agent().WriteFile(ctx, "netclient", compute.WriteFileOptions{Mode: 0o755}, bytes.NewReader(client)); err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) (string, int) {
		t.Helper()
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: cmd}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return strings.TrimSpace(string(res.Stdout) + string(res.Stderr)), res.Exit.ExitCode
	}
	if out, code := run("./netclient get http://allowed.test:" + port + "/plain"); code != 0 || !strings.HasPrefix(out, "status 200: hello allowed.test") {
		t.Errorf("allowed name from inside: exit %d: %s", code, out)
	}
	if out, _ := run("./netclient get http://other.test:" + port + "/"); strings.Contains(out, "status 200") || !strings.Contains(out, "403") {
		t.Errorf("another name from inside: %s", out)
	}
	if out, code := run("./netclient dial 127.0.0.1:" + port); code == 0 {
		t.Errorf("the host's loopback server reached directly: %s", out)
	}
}

// TestGVisorSandboxKilled: when runsc is killed (SIGKILL, as a crash or
// the OOM killer would), nothing of the sandbox survives (runsc's sentry
// and gofer die with it); a resume replaces the sandbox over the kept
// workspace, as its own account still, and a delete then leaves nothing.
func TestGVisorSandboxKilled(t *testing.T) {
	bin := runsc.Require(t)
	env, stateDir := gvisorEnv(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := env.NewClient(t, nil)
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	idOf := func(s *compute.Session) string {
		t.Helper()
		res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo kept >> log; cat log | wc -l; id -u"}, compute.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(res.Stdout)), " ")
	}
	first := idOf(s)
	dir := filepath.Join(stateDir, s.ID())
	m, err := readMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(m.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); len(sandboxProcesses(sandboxMarkers(dir))) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("runsc processes outlive a killed `runsc run`: %v", sandboxProcesses(sandboxMarkers(dir)))
		}
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	c2 := env.NewClient(t, nil)
	s2, err := c2.Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	second := idOf(s2)
	_, uid1, _ := strings.Cut(first, " ")
	if !strings.HasPrefix(first, "1 ") || second != "2 "+uid1 {
		t.Fatalf("before the crash %q, after %q: want the kept workspace and the same account", first, second)
	}
	if err := c2.Delete(ctx, s2); err != nil {
		t.Fatal(err)
	}
	if left := env.Leaked(t, s.ID()); len(left) > 0 {
		t.Errorf("leaked: %v", left)
	}
}
