package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// newProvider makes a provider whose containers and volumes carry this test
// run's label, with a private StateDir.
func newProvider(t *testing.T, mutate func(*Config)) *Provider {
	t.Helper()
	needDocker(t)
	cfg := Config{StateDir: t.TempDir(), Labels: map[string]string{runLabelKey: testEnv.runLabel, testLabelKey: sessionID(t)}}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// testLabelKey scopes a provider's List to the test that made it.
const testLabelKey = "test.bulkhead.test"

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sessionID(t *testing.T) string {
	return strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())) + "-" + testEnv.runLabel
}

// launch starts a sandbox and registers its destruction (even when the test
// fails) with a provider that deletes everything.
func launch(t *testing.T, p *Provider, spec compute.LaunchSpec) compute.Sandbox {
	t.Helper()
	if spec.SessionID == "" {
		spec.SessionID = sessionID(t)
	}
	sb, err := p.Launch(testCtx(t), spec)
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	raw := mustState(t, sb)
	t.Cleanup(func() {
		_ = sb.Close()
		destroyAll(t, p, raw)
	})
	return sb
}

// destroyAll destroys a sandbox whatever the provider's delete policy.
func destroyAll(t *testing.T, p *Provider, raw json.RawMessage) {
	cfg := p.Config()
	cfg.DeletePolicy = DeleteAll
	all, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Error(err)
		return
	}
	defer all.Close()
	if err := all.Destroy(context.Background(), raw); err != nil {
		t.Errorf("cleanup: Destroy: %v", err)
	}
}

func mustState(t *testing.T, sb compute.Sandbox) json.RawMessage {
	t.Helper()
	raw, err := sb.State()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func mustDecode(t *testing.T, raw json.RawMessage) State {
	t.Helper()
	st, err := DecodeState(raw)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// run executes a shell command in the sandbox and returns its stdout,
// failing the test on a non-zero exit.
func run(t *testing.T, ac *agentclient.Client, user, command string) string {
	t.Helper()
	res, err := ac.Exec(testCtx(t), compute.ProcessSpec{Argv: []string{"/bin/sh", "-c", command}, User: user}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	if code := res.Exit.ExitCode; code != 0 {
		t.Fatalf("exec %q: exit %d\nstdout: %s\nstderr: %s", command, code, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func writeFile(t *testing.T, ac *agentclient.Client, path, content, user string) {
	t.Helper()
	if _, err := ac.WriteFile(testCtx(t), path, compute.WriteFileOptions{User: user, CreateParents: true}, strings.NewReader(content)); err != nil {
		t.Fatalf("WriteFile %s: %v", path, err)
	}
}

func readFile(t *testing.T, ac *agentclient.Client, path string) string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := ac.ReadFile(testCtx(t), path, compute.ReadFileOptions{}, &buf); err != nil {
		t.Fatalf("ReadFile %s: %v", path, err)
	}
	return buf.String()
}

func inspect(t *testing.T, p *Provider, sb compute.Sandbox) container.InspectResponse {
	t.Helper()
	res, err := p.API().ContainerInspect(testCtx(t), mustDecode(t, mustState(t, sb)).ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Container
}

func TestLaunchExecFilesAndUsers(t *testing.T) {
	t.Parallel()
	p := newProvider(t, nil)
	sb := launch(t, p, compute.LaunchSpec{})
	ac := sb.Agent()
	if sb.WorkspaceKept() {
		t.Error("a new sandbox reports WorkspaceKept")
	}

	res, err := ac.Exec(testCtx(t), compute.ProcessSpec{Argv: []string{"/bin/sh", "-c", "id; echo hi"}}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Exit.ExitCode != 0 || !strings.Contains(string(res.Stdout), "uid=0(root)") || !strings.HasSuffix(string(res.Stdout), "hi\n") {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", res.Exit.ExitCode, res.Stdout, res.Stderr)
	}
	res, err = ac.Exec(testCtx(t), compute.ProcessSpec{Command: "echo out; echo err >&2; exit 3"}, compute.ExecOptions{}, nil)
	if err != nil || res.Exit.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("exec with exit 3: %v %+v", err, res)
	}

	writeFile(t, ac, "notes/a.txt", "hello from the harness\n", "")
	if got := readFile(t, ac, "/workspace/notes/a.txt"); got != "hello from the harness\n" {
		t.Fatalf("read back %q", got)
	}
	if got := run(t, ac, "", "cat notes/a.txt; pwd"); got != "hello from the harness\n/workspace\n" {
		t.Fatalf("the file as the sandbox sees it: %q", got)
	}

	// git (with its helpers) works for local operations.
	run(t, ac, "", `git init -q repo && cd repo && echo x > f && git add f &&
		git -c user.name=t -c user.email=t@example.invalid commit -qm first && git clone -q . ../clone && git -C ../clone log --oneline | grep -q first`)

	// The capabilities the daemon keeps, each exercised (dropping any one
	// of them breaks one of these): run_as another user (SETUID, SETGID),
	// chown (CHOWN), chmod of another user's directory (FOWNER), root
	// reading and writing in another user's private directory
	// (DAC_OVERRIDE), signals to another user's processes (KILL).
	if got := run(t, ac, "nobody", "id -u; id -g"); got != "65534\n65534\n" {
		t.Fatalf("as nobody: %q", got)
	}
	run(t, ac, "", "mkdir owned && chown nobody:nogroup owned && chmod 700 owned")
	writeFile(t, ac, "owned/by-nobody.txt", "x", "nobody")
	if got := run(t, ac, "", "stat -c %U:%G owned/by-nobody.txt"); got != "nobody:nogroup\n" {
		t.Fatalf("owner: %q", got)
	}
	writeFile(t, ac, "owned/by-root.txt", "y", "")
	if got := readFile(t, ac, "owned/by-nobody.txt"); got != "x" {
		t.Fatalf("root reading nobody's file: %q", got)
	}
	start, err := ac.Start(testCtx(t), compute.ProcessSpec{Argv: []string{"sleep", "300"}, User: "nobody"}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ac.Signal(testCtx(t), start.Process.ProcessID, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	waited, err := ac.Wait(testCtx(t), start.Process.ProcessID)
	if err != nil {
		t.Fatal(err)
	}
	if exit := waited; exit.Signal != "SIGKILL" {
		t.Fatalf("sleep as nobody after SIGKILL: %+v", exit)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestTokenNeverExposed(t *testing.T) {
	t.Parallel()
	p := newProvider(t, nil)
	sb := launch(t, p, compute.LaunchSpec{})
	st := mustDecode(t, mustState(t, sb))
	dir := p.privateDir(st.Key)
	token, err := dir.readToken()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(mustState(t, sb), []byte(token)) {
		t.Fatal("the sandbox state contains the token")
	}
	res, err := p.API().ContainerInspect(testCtx(t), st.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(res.Raw, []byte(token)) {
		t.Fatal("docker inspect shows the token")
	}
	info := inspect(t, p, sb)
	for _, s := range append(append(append([]string{}, info.Config.Env...), info.Args...), info.Config.Cmd...) {
		if strings.Contains(s, token) {
			t.Fatalf("token in env/args: %q", s)
		}
	}
	// The daemon read and removed its copy; the harness copy is private.
	if _, err := os.Stat(dir.tokenDrop()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file still in the run directory: %v", err)
	}
	for path, want := range map[string]os.FileMode{string(dir): 0o700, dir.runDir(): 0o700, dir.tokenCopy(): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %o, want %o", path, fi.Mode().Perm(), want)
		}
	}
	// Nothing inside the sandbox holds it either.
	out := run(t, sb.Agent(), "", "ls -a /run/bulkhead; tr '\\0' ' ' </proc/1/cmdline; tr '\\0' ' ' </proc/1/environ; env")
	if strings.Contains(out, token) {
		t.Fatal("the token is visible inside the sandbox")
	}
	if strings.Contains(out, "\ntoken\n") {
		t.Fatalf("a token file is visible inside the sandbox:\n%s", out)
	}
	// A wrong token is refused.
	bad, err := agentclient.Dial(agentclient.Options{Address: "unix://" + dir.socket(), Token: strings.Repeat("0", 64)})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.Info(testCtx(t)); !errors.Is(err, compute.ErrUnauthenticated) {
		t.Fatalf("Info with a wrong token: %v", err)
	}
}

func TestLimitsNetworkAndCapabilities(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) {
		c.Memory = 256 << 20
		c.NanoCPUs = 500_000_000
		c.PidsLimit = 100
	})
	sb := launch(t, p, compute.LaunchSpec{})
	hc := inspect(t, p, sb).HostConfig
	if hc.Memory != 256<<20 || hc.NanoCPUs != 500_000_000 || hc.PidsLimit == nil || *hc.PidsLimit != 100 {
		t.Errorf("limits: memory %d, nanocpus %d, pids %v", hc.Memory, hc.NanoCPUs, hc.PidsLimit)
	}
	if hc.NetworkMode != "none" {
		t.Errorf("network mode %q", hc.NetworkMode)
	}
	if strings.Join(hc.CapDrop, ",") != "ALL" || strings.ReplaceAll(strings.Join(hc.CapAdd, ","), "CAP_", "") != strings.Join(DefaultCapabilities, ",") {
		t.Errorf("capabilities: drop %v add %v", hc.CapDrop, hc.CapAdd)
	}
	if strings.Join(hc.SecurityOpt, ",") != "no-new-privileges:true" {
		t.Errorf("security options %v", hc.SecurityOpt)
	}
	if hc.RestartPolicy.Name != container.RestartPolicyDisabled && hc.RestartPolicy.Name != "" {
		t.Errorf("restart policy %q", hc.RestartPolicy.Name)
	}

	ac := sb.Agent()
	if got := run(t, ac, "", "ls /sys/class/net"); got != "lo\n" {
		t.Errorf("network interfaces inside: %q, want only lo", got)
	}
	// The effective capabilities of a root process are exactly the kept ones:
	// CHOWN(0) DAC_OVERRIDE(1) FOWNER(3) FSETID(4) KILL(5) SETGID(6) SETUID(7).
	status := run(t, ac, "", "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
	if !strings.Contains(status, "CapEff:\t00000000000000fb") || !strings.Contains(status, "NoNewPrivs:\t1") {
		t.Errorf("capabilities inside:\n%s", status)
	}
	if got := run(t, ac, "", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"); got != "100\n" {
		t.Errorf("pids.max inside: %q", got)
	}
}

func TestReattachAfterClose(t *testing.T) {
	t.Parallel()
	p := newProvider(t, nil)
	sb := launch(t, p, compute.LaunchSpec{})
	writeFile(t, sb.Agent(), "keep.txt", "still here", "")
	raw := mustState(t, sb)
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}

	// A new provider, as after a harness restart.
	p2 := newProvider(t, func(c *Config) { *c = p.Config() })
	again, err := p2.Reattach(testCtx(t), compute.LaunchSpec{}, raw)
	if err != nil {
		t.Fatalf("Reattach: %v", err)
	}
	defer again.Close()
	if !again.WorkspaceKept() {
		t.Error("reattached sandbox does not report WorkspaceKept")
	}
	if a, b := mustDecode(t, raw).ContainerID, mustDecode(t, mustState(t, again)).ContainerID; a != b {
		t.Fatalf("reattached to another container: %s vs %s", a, b)
	}
	if got := readFile(t, again.Agent(), "keep.txt"); got != "still here" {
		t.Fatalf("file after reattach: %q", got)
	}
}

func TestReattachRestartsAStoppedContainer(t *testing.T) {
	t.Parallel()
	p := newProvider(t, nil)
	for _, how := range []string{"outside", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			sb := launch(t, p, compute.LaunchSpec{SessionID: sessionID(t)})
			writeFile(t, sb.Agent(), "keep.txt", "survives a stop", "")
			st := mustDecode(t, mustState(t, sb))
			oldToken, _ := p.privateDir(st.Key).readToken()
			switch how {
			case "outside":
				if _, err := p.API().ContainerStop(testCtx(t), st.ContainerID, client.ContainerStopOptions{}); err != nil {
					t.Fatal(err)
				}
			case "shutdown":
				if err := sb.Shutdown(testCtx(t)); err != nil {
					t.Fatal(err)
				}
			}
			if inspect(t, p, sb).State.Running {
				t.Fatal("container still running after stop")
			}
			_ = sb.Close()
			again, err := p.Reattach(testCtx(t), compute.LaunchSpec{}, mustState(t, sb))
			if err != nil {
				t.Fatalf("Reattach: %v", err)
			}
			defer again.Close()
			if !inspect(t, p, again).State.Running || !again.WorkspaceKept() {
				t.Fatal("not restarted")
			}
			if got := readFile(t, again.Agent(), "keep.txt"); got != "survives a stop" {
				t.Fatalf("file after restart: %q", got)
			}
			if newToken, _ := p.privateDir(st.Key).readToken(); newToken == oldToken {
				t.Error("the restarted daemon got the old token")
			}
		})
	}
}

func TestReattachAfterRemovalIsNotFound(t *testing.T) {
	t.Parallel()
	p := newProvider(t, nil)
	sb := launch(t, p, compute.LaunchSpec{})
	raw := mustState(t, sb)
	_ = sb.Close()
	if _, err := p.API().ContainerRemove(testCtx(t), mustDecode(t, raw).ContainerID, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Reattach(testCtx(t), compute.LaunchSpec{}, raw)
	if !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("Reattach after removal: %v, want ErrNotFound", err)
	}
	if _, err := p.Reattach(testCtx(t), compute.LaunchSpec{}, json.RawMessage(`{"version":1}`)); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("Reattach with a bad state: %v", err)
	}
}

func TestLaunchWithPriorReusesVolume(t *testing.T) {
	t.Parallel()
	keep := newProvider(t, func(c *Config) { c.DeletePolicy = DeleteContainer })
	session := sessionID(t)
	first := launch(t, keep, compute.LaunchSpec{SessionID: session})
	writeFile(t, first.Agent(), "work/result.txt", "carried over", "")
	prior := mustState(t, first)
	_ = first.Close()
	if err := keep.Destroy(testCtx(t), prior); err != nil {
		t.Fatal(err)
	}
	st := mustDecode(t, prior)
	if _, err := keep.API().ContainerInspect(testCtx(t), st.ContainerID, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("container after Destroy: %v", err)
	}
	if _, err := keep.API().VolumeInspect(testCtx(t), st.Volume, client.VolumeInspectOptions{}); err != nil {
		t.Fatalf("volume after Destroy with DeleteContainer: %v", err)
	}

	// Without Prior, a leftover volume is not silently reused.
	if _, err := keep.Launch(testCtx(t), compute.LaunchSpec{SessionID: session}); !errors.Is(err, compute.ErrAlreadyExists) {
		t.Fatalf("Launch over a leftover volume without Prior: %v", err)
	}

	second := launch(t, keep, compute.LaunchSpec{SessionID: session, Prior: prior})
	if !second.WorkspaceKept() {
		t.Fatal("Launch with Prior did not report WorkspaceKept")
	}
	if got := readFile(t, second.Agent(), "work/result.txt"); got != "carried over" {
		t.Fatalf("file on the reused volume: %q", got)
	}
	if mustDecode(t, mustState(t, second)).Volume != st.Volume {
		t.Fatal("another volume")
	}
}

func TestLaunchWithPriorInContainerLayer(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) { c.Workspace = WorkspaceInContainer })
	first := launch(t, p, compute.LaunchSpec{})
	writeFile(t, first.Agent(), "x.txt", "gone with the container", "")
	prior := mustState(t, first)
	_ = first.Close()
	if mustDecode(t, prior).Volume != "" {
		t.Fatal("a volume in container-layer mode")
	}
	// Launch with Prior replaces (removes) the earlier container.
	second := launch(t, p, compute.LaunchSpec{SessionID: mustDecode(t, prior).SessionID, Prior: prior})
	if second.WorkspaceKept() {
		t.Fatal("WorkspaceKept without a volume")
	}
	if _, err := p.API().ContainerInspect(testCtx(t), mustDecode(t, prior).ContainerID, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("the replaced container is still there: %v", err)
	}
	if out := run(t, second.Agent(), "", "ls -A"); out != "" {
		t.Fatalf("new workspace not empty: %q", out)
	}
}

func TestDestroyTwice(t *testing.T) {
	t.Parallel()
	p := newProvider(t, nil)
	sb := launch(t, p, compute.LaunchSpec{})
	raw := mustState(t, sb)
	st := mustDecode(t, raw)
	_ = sb.Close()
	for i := 0; i < 2; i++ {
		if err := p.Destroy(testCtx(t), raw); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
	}
	if _, err := p.API().VolumeInspect(testCtx(t), st.Volume, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("volume after Destroy: %v", err)
	}
	if _, err := os.Stat(string(p.privateDir(st.Key))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("private directory after Destroy: %v", err)
	}
	if _, err := p.Reattach(testCtx(t), compute.LaunchSpec{}, raw); !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("Reattach after Destroy: %v", err)
	}
}

func TestListExpiredAndReap(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) { c.Workspace = WorkspaceInContainer })
	now := time.Now()
	old := launch(t, p, compute.LaunchSpec{
		SessionID: sessionID(t) + "-old",
		Lifetime:  compute.Lifetime{CreatedAt: now.Add(-2 * time.Hour), TTL: time.Hour},
		Labels:    map[string]string{"team": "a"},
	})
	idle := launch(t, p, compute.LaunchSpec{
		SessionID: sessionID(t) + "-idle",
		Lifetime:  compute.Lifetime{CreatedAt: now.Add(-3 * time.Hour), IdleTimeout: time.Hour},
	})
	if err := idle.Touch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	infos, err := p.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	bySession := map[string]compute.SandboxInfo{}
	for _, i := range infos {
		bySession[i.SessionID] = i
	}
	if len(infos) != 2 {
		t.Fatalf("List: %d sandboxes, want 2: %+v", len(infos), infos)
	}
	o, ok := bySession[sessionID(t)+"-old"]
	if !ok || o.Provider != "docker" || !o.Running || o.Lifetime.TTL != time.Hour || !o.Lifetime.CreatedAt.Equal(now.Add(-2*time.Hour)) {
		t.Fatalf("old sandbox: %+v", o)
	}
	if !o.Expired(now) {
		t.Error("the old sandbox is not expired")
	}
	i := bySession[sessionID(t)+"-idle"]
	if i.Lifetime.IdleTimeout != time.Hour || i.LastActive.IsZero() || time.Since(i.LastActive) > time.Minute {
		t.Fatalf("idle sandbox: %+v", i)
	}
	if i.Expired(now) || !i.Expired(now.Add(2*time.Hour)) {
		t.Error("the idle sandbox's expiry is wrong")
	}
	if mustDecode(t, o.State).ContainerID != mustDecode(t, mustState(t, old)).ContainerID {
		t.Error("List's state finds another container")
	}
	labels := inspect(t, p, old).Config.Labels
	for k, want := range map[string]string{LabelSandbox: "1", LabelSession: sessionID(t) + "-old", LabelTTL: "1h0m0s", LabelStateVersion: "1", "team": "a", runLabelKey: testEnv.runLabel} {
		if labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, labels[k], want)
		}
	}

	_ = old.Close()
	reaped, err := compute.NewClient(p, compute.ClientOptions{}).Reap(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(reaped) != 1 || reaped[0].SessionID != sessionID(t)+"-old" {
		t.Fatalf("Reap: %+v", reaped)
	}
	if infos, _ := p.List(testCtx(t)); len(infos) != 1 {
		t.Fatalf("after Reap: %+v", infos)
	}
}

func TestMissingImage(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) { c.Image = "bulkhead/no-such-image:dev" })
	_, err := p.Launch(testCtx(t), compute.LaunchSpec{SessionID: sessionID(t)})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "make image") {
		t.Fatalf("Launch with a missing image: %v", err)
	}
	if _, err := p.API().VolumeInspect(testCtx(t), VolumeName(sessionID(t)), client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("a failed Launch left a volume: %v", err)
	}
}

func TestFailedStartCleansUp(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) {
		c.AgentdArgs = []string{"--no-such-flag"}
		c.ReadyTimeout = 20 * time.Second
	})
	_, err := p.Launch(testCtx(t), compute.LaunchSpec{SessionID: sessionID(t)})
	if !errors.Is(err, compute.ErrUnavailable) || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("Launch with a daemon that cannot start: %v", err)
	}
	if infos, _ := p.List(testCtx(t)); len(infos) != 0 {
		t.Fatalf("a failed Launch left containers: %+v", infos)
	}
	if ents, _ := os.ReadDir(p.Config().StateDir); len(ents) != 0 {
		t.Fatalf("a failed Launch left private directories: %v", ents)
	}
}

func TestFullImage(t *testing.T) {
	t.Parallel()
	needFullImage(t)
	p := newProvider(t, func(c *Config) { c.Image = "bulkhead/sandbox-full:dev"; c.Workspace = WorkspaceInContainer })
	sb := launch(t, p, compute.LaunchSpec{Manifest: &manifest.Manifest{Root: "/srv/work"}})
	out := run(t, sb.Agent(), "", `pwd; bash -c 'echo $BASH_VERSION' | cut -d. -f1; python3 -c 'print(6*7)'; git --version | cut -d' ' -f1-2;
		useradd -m agent && id -un agent`)
	if want := "/srv/work\n5\n42\ngit version\nagent\n"; out != want {
		t.Fatalf("full image: %q, want %q", out, want)
	}
	if got := run(t, sb.Agent(), "agent", "id -un; touch /home/agent/x && echo ok"); got != "agent\nok\n" {
		t.Fatalf("as agent: %q", got)
	}
}

// Unit tests (no Docker).

func TestStateRoundTripAndValidation(t *testing.T) {
	st := State{Version: StateVersion, ContainerID: "abc", Name: "bulkhead-s-01234567", Key: "0123456789abcdef", SessionID: "s", Image: DefaultImage, Volume: "bulkhead-ws-s", Workspace: "/workspace"}
	raw, err := st.encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeState(raw)
	if err != nil || back != st {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for _, bad := range []string{``, `{`, `{"version":2,"container_id":"a","key":"0123456789abcdef"}`,
		`{"version":1,"key":"0123456789abcdef"}`, `{"version":1,"container_id":"a","key":"../../etc"}`,
		`{"version":1,"container_id":"a","key":"0123456789abcdef","volume":"../x"}`} {
		if _, err := DecodeState(json.RawMessage(bad)); !errors.Is(err, compute.ErrInvalidArgument) {
			t.Errorf("DecodeState(%q): %v", bad, err)
		}
	}
}

func TestNamesAndLabels(t *testing.T) {
	if got := VolumeName("sess-1"); got != "bulkhead-ws-sess-1" {
		t.Errorf("VolumeName: %q", got)
	}
	a, b := VolumeName("a/b"), VolumeName("a:b")
	if a == b || !nameRE.MatchString(a) || !nameRE.MatchString(strings.TrimPrefix(containerName(strings.Repeat("x", 100), "0123456789abcdef"), "/")) {
		t.Errorf("sanitized names: %q %q", a, b)
	}
	l := compute.Lifetime{CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), TTL: time.Hour, IdleTimeout: 90 * time.Second}
	m := map[string]string{}
	lifetimeLabels(l, m)
	if back := lifetimeFromLabels(m); back != l {
		t.Errorf("lifetime labels: %+v -> %v -> %+v", l, m, back)
	}
}

func TestConfigDefaultsAndChecks(t *testing.T) {
	c, err := Config{StateDir: "/tmp/x"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Image != DefaultImage || c.Network != "none" || c.Workspace != WorkspaceOnVolume || c.DeletePolicy != DeleteAll {
		t.Errorf("defaults: %+v", c)
	}
	s, err := c.settings(&CreateOptions{Memory: -1, PidsLimit: 7})
	if err != nil || s.memory != 0 || s.pidsLim != 7 || s.nanoCPUs != DefaultNanoCPUs {
		t.Errorf("settings: %+v %v", s, err)
	}
	for name, bad := range map[string]Config{
		"long state dir":    {StateDir: "/" + strings.Repeat("d", 100)},
		"ports without net": {StateDir: "/tmp/x", PublishedPorts: []PortBinding{{ContainerPort: 80}}},
		"bad host address":  {StateDir: "/tmp/x", Network: "bridge", PublishedPorts: []PortBinding{{ContainerPort: 80, HostIP: "localhost"}}},
		"reserved label":    {StateDir: "/tmp/x", Labels: map[string]string{LabelSession: "x"}},
		"bad policy":        {StateDir: "/tmp/x", DeletePolicy: 9},
	} {
		if _, err := bad.withDefaults(); !errors.Is(err, compute.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := c.settings(&CreateOptions{AgentdArgs: []string{"--token-file=/x"}}); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("token flag in AgentdArgs: %v", err)
	}
	if _, err := c.settings("nope"); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("bad options type: %v", err)
	}
}

// TestRuntime: a runtime the engine does not list is refused before
// anything is made, naming what the engine has; one it lists (runsc, when
// the engine has gVisor registered) runs the sandbox under it.
func TestRuntime(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) { c.Runtime = "bulkhead-no-such-runtime" })
	_, err := p.Launch(testCtx(t), compute.LaunchSpec{SessionID: sessionID(t)})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), `"bulkhead-no-such-runtime"`) || !strings.Contains(err.Error(), "runc") {
		t.Fatalf("Launch with an unknown runtime: %v", err)
	}
	if infos, _ := p.List(testCtx(t)); len(infos) != 0 {
		t.Fatalf("a refused Launch left containers: %+v", infos)
	}
	if _, err := p.API().VolumeInspect(testCtx(t), VolumeName(sessionID(t)), client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("a refused Launch left a volume: %v", err)
	}

	info, err := p.API().Info(testCtx(t), client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := info.Info.Runtimes["runsc"]; !ok {
		// Registering a runtime needs the engine's configuration changed
		// and the engine restarted, which no test may do to the machine's
		// engine.
		testenv.Optional(t, "the Docker engine has no runsc runtime registered (daemon.json \"runtimes\"); register gVisor's runsc and restart the engine to run this part")
	}
	g := newProvider(t, func(c *Config) { c.Runtime = "runsc" })
	sb := launch(t, g, compute.LaunchSpec{})
	if rt := inspect(t, g, sb).HostConfig.Runtime; rt != "runsc" {
		t.Fatalf("container runtime %q, want runsc", rt)
	}
}
