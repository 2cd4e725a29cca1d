package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// rootBwrapClient returns a client of a root harness's bubblewrap
// provider over stateDir (the test skips, or fails under CI=true, unless
// the test runs as root with bwrap), with cfg's other fields.
func rootBwrapClient(t *testing.T, stateDir string, store snapshot.Store, cfg Config) *compute.Client {
	t.Helper()
	testenv.Require(t, testenv.Root, testenv.Bubblewrap)
	cfg.StateDir, cfg.AgentdPath, cfg.Isolation = stateDir, agentdBin, IsolationBubblewrap
	c, err := NewClient(cfg, compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createStarted creates and starts a session, deleted when the test ends.
func createStarted(ctx context.Context, t *testing.T, c *compute.Client, m *manifest.Manifest) *compute.Session {
	t.Helper()
	return started(ctx, t, c, func() (*compute.Session, error) { return c.Create(ctx, compute.CreateOptions{Manifest: m}) })
}

// resumeStarted resumes the session of st with c and starts it; it is
// deleted when the test ends.
func resumeStarted(ctx context.Context, t *testing.T, c *compute.Client, st *compute.State) *compute.Session {
	t.Helper()
	return started(ctx, t, c, func() (*compute.Session, error) { return c.Resume(ctx, st) })
}

// started starts the session open makes with c, deleted when the test
// ends.
func started(ctx context.Context, t *testing.T, c *compute.Client, open func() (*compute.Session, error)) *compute.Session {
	t.Helper()
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs a shell command line in s as user ("" for the session's) and
// returns its stdout, stderr and exit code.
func run(ctx context.Context, t *testing.T, s *compute.Session, user, command string) (string, string, int) {
	t.Helper()
	res, err := s.Agent().Exec(ctx, compute.ProcessSpec{User: user, Command: command}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatalf("%s (as %q): %v", command, user, err)
	}
	return string(res.Stdout), string(res.Stderr), res.Exit.ExitCode
}

// hostIDs returns the real, effective, saved and file-system uids (or
// gids, with field "Gid") of a host process, from /proc/PID/status.
func hostIDs(t *testing.T, pid int, field string) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return nil
}

// hostPIDOf waits for the host process whose command line holds marker.
func hostPIDOf(t *testing.T, marker string) int {
	t.Helper()
	var pid int
	eventually(t, 20*time.Second, "a process with "+marker, func() (bool, string) {
		for _, pr := range sandboxProcesses([][]byte{[]byte(marker)}) {
			pid = pr.pid
			return true, ""
		}
		return false, "none yet"
	})
	return pid
}

// TestRootInSandboxIsNotHostRoot: in a root harness's bubblewrap sandbox
// (on the host's file system), root inside is uid 0 to itself but an
// unprivileged host uid of the sandbox's own block (its id base) to the
// host: it cannot read a host file only root may read (a 0600 file below
// a directory the sandbox sees, /etc/shadow), though it keeps the
// daemon's capabilities over the sandbox's own files; the sandbox's run_as
// accounts are host ids of the same block; the daemon itself runs as the
// block's root; two sandboxes get blocks of their own.
func TestRootInSandboxIsNotHostRoot(t *testing.T) {
	state := testenv.SearchableTempDir(t)
	c := rootBwrapClient(t, state, nil, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A host secret the sandbox can see (the host's / is bound read-only)
	// but, not being host root, cannot read.
	hostDir, err := os.MkdirTemp("/var/tmp", "bh-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(hostDir) })
	if err := os.Chmod(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(hostDir, "tokens")
	if err := os.WriteFile(secret, []byte("tenant-token-not-yours\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &manifest.Manifest{Users: []manifest.User{{Name: "mate", UID: ptr(uint32(1234))}}, RunAs: "mate"}
	s := createStarted(ctx, t, c, m)
	other := createStarted(ctx, t, c, nil)
	_, dir := sandboxState(t, s)
	_, otherDir := sandboxState(t, other)
	base, ok, err := readIDBase(dir)
	if err != nil || !ok {
		t.Fatalf("no id base recorded in %s: %v", dir, err)
	}
	otherBase, ok, err := readIDBase(otherDir)
	if err != nil || !ok {
		t.Fatalf("no id base recorded in %s: %v", otherDir, err)
	}
	if !validIDBase(base) || !validIDBase(otherBase) || base == otherBase {
		t.Errorf("id bases %d and %d: want two distinct blocks of %d in [%d, %d)", base, otherBase, idBlockSize, minSandboxUID, maxSandboxUID)
	}

	out, errOut, _ := run(ctx, t, s, "root", "id -u; cat "+secret+"; cat /etc/shadow; touch own && chown 77:77 own && echo chowned")
	if out != "0\nchowned\n" {
		t.Errorf("as root inside: stdout %q, want id 0 and no host secret", out)
	}
	if strings.Count(errOut, "Permission denied") != 2 {
		t.Errorf("stderr %q, want both reads denied", errOut)
	}
	// Its capabilities hold over the sandbox's own files: a chown there
	// lands on the host as the block's id.
	if fi, err := os.Stat(filepath.Join(dir, "workspace", "own")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != base+77 {
		t.Errorf("a file chowned to 77 inside: %v (stdout %q, stderr %q), want host uid %d", err, out, errOut, base+77)
	}

	// Of the state directory, root inside sees its own sandbox only.
	if out, errOut, _ := run(ctx, t, s, "root", "ls -A "+state); out != s.ID()+"\n" {
		t.Errorf("as root inside, the state directory shows %q (stderr %q)", out, errOut)
	}

	// A process as root and one as the run_as account, seen from the host.
	for _, tc := range []struct {
		user   string
		inside uint32
	}{{"root", 0}, {"", 1234}} {
		marker := fmt.Sprintf("%d.%d", 4000+tc.inside, time.Now().UnixNano()%1000)
		if _, err := s.Agent().Start(ctx, compute.ProcessSpec{User: tc.user, Argv: []string{"sleep", marker}}, compute.StartOptions{}); err != nil {
			t.Fatal(err)
		}
		pid := hostPIDOf(t, marker)
		want := strconv.FormatUint(uint64(base+tc.inside), 10)
		for _, field := range []string{"Uid", "Gid"} {
			for _, id := range hostIDs(t, pid, field) {
				if id != want {
					t.Errorf("as %q (uid %d inside): host %s %v, want %s", tc.user, tc.inside, field, hostIDs(t, pid, field), want)
					break
				}
			}
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// The daemon itself is the block's root.
	var daemon int
	for _, pr := range sandboxProcesses(sandboxMarkers(dir)) {
		if pr.argv0 == agentdBin {
			daemon = pr.pid
		}
	}
	if daemon == 0 {
		t.Fatal("no daemon process found")
	}
	if got := hostIDs(t, daemon, "Uid"); got[0] != strconv.FormatUint(uint64(base), 10) {
		t.Errorf("the daemon runs as host uid %v, want %d", got, base)
	}
}

// TestManifestIDsOutsideTheSandboxRange: a root harness's bubblewrap
// sandboxes map ids 0 to 65535 only, so a manifest whose user or group
// asks for an id outside is refused when the sandbox is created
// (ErrInvalidArgument naming the entry), and nothing is made.
func TestManifestIDsOutsideTheSandboxRange(t *testing.T) {
	state := testenv.SearchableTempDir(t)
	c := rootBwrapClient(t, state, nil, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, tc := range map[string]struct {
		m    *manifest.Manifest
		want string
	}{
		"uid": {&manifest.Manifest{Users: []manifest.User{{Name: "ok", UID: ptr(uint32(1000))}, {Name: "intruder", UID: ptr(uint32(70000))}}},
			`users[1].uid: user "intruder" has uid 70000`},
		"gid": {&manifest.Manifest{Groups: []manifest.Group{{Name: "crew", GID: ptr(uint32(65536))}}},
			`groups[0].gid: group "crew" has gid 65536`},
	} {
		_, err := c.Create(ctx, compute.CreateOptions{Manifest: tc.m})
		if !errors.Is(err, compute.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", name, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("refused sandboxes left %v", ents)
	}
	// The edge of the range is fine.
	createStarted(ctx, t, c, &manifest.Manifest{Users: []manifest.User{{Name: "edge", UID: ptr(uint32(65533))}}, RunAs: "edge"})
}

// TestUserNamespaceKeptAcrossReplacement: a sandbox whose daemon died is
// replaced in the same id block (recorded in its directory), so its kept
// workspace's files still belong to its users: the run_as account still
// reads and writes what it wrote before.
func TestUserNamespaceKeptAcrossReplacement(t *testing.T) {
	state := testenv.SearchableTempDir(t)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := rootBwrapClient(t, state, store, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := createStarted(ctx, t, c, nil)
	if out, errOut, code := run(ctx, t, s, "", "umask 077; echo mine > mine.txt && id -u"); code != 0 {
		t.Fatalf("write as the default account: exit %d %q %q", code, out, errOut)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st, dir := sandboxState(t, s)
	base, ok, err := readIDBase(dir)
	if err != nil || !ok || !validIDBase(base) {
		t.Fatalf("id base %d (recorded: %v, %v), want a block of its own", base, ok, err)
	}
	m, err := readMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(m.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for alivePID(m.PID) {
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.Release()
	s2, err := rootBwrapClient(t, state, store, Config{}).Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s2) })
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _, _ := readIDBase(dir); again != base {
		t.Errorf("the replacement maps block %d, the sandbox had %d", again, base)
	}
	if out, errOut, code := run(ctx, t, s2, "", "cat mine.txt && echo more >> mine.txt && echo ok"); code != 0 || out != "mine\nok\n" {
		t.Errorf("the account's own file after the replacement: exit %d, %q, %q", code, out, errOut)
	}
}

// TestDefaultRunAsInAUserNamespace: a root harness's bubblewrap sandboxes
// give the default account a uid inside their own id range, away from the
// ids account tools hand out first.
func TestDefaultRunAsInAUserNamespace(t *testing.T) {
	testenv.Require(t, testenv.Root)
	p := &Provider{log: zap.NewNop(), userns: true}
	for range 50 {
		u := p.DefaultRunAs()
		if u == nil || u.UID == nil || *u.UID < minRunAsUID || *u.UID >= maxRunAsUID {
			t.Fatalf("DefaultRunAs = %+v, want a uid in [%d, %d)", u, minRunAsUID, maxRunAsUID)
		}
	}
}

// TestStateDirOthersMayNotReach: a root harness's bubblewrap sandboxes
// are set up by their own unprivileged root, so a state directory below a
// directory other users may not search is refused with a clear error
// naming it, and a daemon binary there (a root harness's ~/go/bin) is used
// through a copy in the state directory, which works.
func TestStateDirOthersMayNotReach(t *testing.T) {
	testenv.Require(t, testenv.Root, testenv.Bubblewrap)
	private, err := os.MkdirTemp("/var/tmp", "bulkhead-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(private) })
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{StateDir: filepath.Join(private, ".cache", "bulkhead", "local"), AgentdPath: agentdBin, Isolation: IsolationBubblewrap}, zap.NewNop())
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), private+", which other users may not search") {
		t.Fatalf("a state directory below a private one: %v", err)
	}
	bin := filepath.Join(private, "go", "bin", AgentdBinary)
	data, err := os.ReadFile(agentdBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	state := testenv.SearchableTempDir(t)
	p, err := New(Config{StateDir: state, AgentdPath: bin, Isolation: IsolationBubblewrap}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(filepath.Dir(p.cfg.AgentdPath)) != state || !strings.HasPrefix(filepath.Base(filepath.Dir(p.cfg.AgentdPath)), agentdCopyPrefix) {
		t.Fatalf("the daemon runs from %s, want a copy in %s", p.cfg.AgentdPath, state)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := compute.NewClient(p, compute.ClientOptions{Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	s := createStarted(ctx, t, c, nil)
	if out, errOut, code := run(ctx, t, s, "", "echo ok"); code != 0 || out != "ok\n" {
		t.Errorf("exit %d, %q, %q", code, out, errOut)
	}
	// A second provider uses the same copy.
	p2, err := New(Config{StateDir: state, AgentdPath: bin, Isolation: IsolationBubblewrap}, zap.NewNop())
	if err != nil || p2.cfg.AgentdPath != p.cfg.AgentdPath {
		t.Errorf("a second provider runs %s (%v), want %s", p2.cfg.AgentdPath, err, p.cfg.AgentdPath)
	}
	// Its directory is no sandbox's.
	if list, err := c.List(ctx); err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v; want the one sandbox", list, err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestReplacingASandboxWithoutAUserNamespace: a sandbox directory made
// before sandboxes had user namespaces (no id base recorded) holds files of
// host ids the new namespace cannot map, so its replacement starts with a
// fresh workspace (the session restores it from its snapshot), says so,
// and records an id base.
func TestReplacingASandboxWithoutAUserNamespace(t *testing.T) {
	testenv.Require(t, testenv.Root, testenv.Bubblewrap)
	state := testenv.SearchableTempDir(t)
	core, logs := observer.New(zap.WarnLevel)
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationBubblewrap}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "old-1")
	if err := os.MkdirAll(filepath.Join(dir, "workspace"), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "workspace", "old.txt"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	prior, _ := json.Marshal(providerState{Dir: dir})
	sb, err := p.Launch(t.Context(), compute.LaunchSpec{SessionID: "old-1", Prior: prior})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(); _ = p.Destroy(context.Background(), prior) })
	if sb.WorkspaceKept() {
		t.Error("the workspace of a sandbox without a user namespace was kept")
	}
	if _, err := os.Stat(filepath.Join(dir, "workspace", "old.txt")); err == nil {
		t.Error("old.txt survived")
	}
	if _, ok, err := readIDBase(dir); !ok || err != nil {
		t.Errorf("no id base recorded: %v", err)
	}
	if logs.FilterMessageSnippet("predates user namespaces").Len() != 1 {
		t.Errorf("no warning: %v", logs.All())
	}
}
