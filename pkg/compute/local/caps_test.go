package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// ---- unit tests: parsing, planning, options ----

// A hybrid host as this project's CI machines: v1 controllers (cpu and
// cpuacct apart, memory in a nested cgroup), an empty v2 hierarchy.
const mountinfoHybridFull = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

const procCgroupHybrid = `9:name=systemd:/
8:pids:/
4:memory:/process_api/f4f5
2:cpuacct:/
1:cpu:/
0::/
`

func TestParseCgroup1Mounts(t *testing.T) {
	got := parseCgroup1Mounts([]byte(mountinfoHybridFull + mountinfoV1 +
		"50 31 0:40 /docker/abc /mnt/ro ro,relatime - cgroup cgroup rw,pids\n" +
		"51 31 0:41 / /mnt/cg\\040x rw - cgroup cgroup ro,memory,memory\n"))
	want := []cgroupV1Mount{
		{point: "/sys/fs/cgroup/cpu", root: "/", controllers: []string{"cpu"}},
		{point: "/sys/fs/cgroup/cpuacct", root: "/", controllers: []string{"cpuacct"}},
		{point: "/sys/fs/cgroup/memory", root: "/", controllers: []string{"memory"}},
		{point: "/sys/fs/cgroup/pids", root: "/", controllers: []string{"pids"}},
		{point: "/sys/fs/cgroup/cpu,cpuacct", root: "/", controllers: []string{"cpu", "cpuacct"}},
		{point: "/mnt/ro", root: "/docker/abc", controllers: []string{"pids"}, readOnly: true},
		{point: "/mnt/cg x", root: "/", controllers: []string{"memory"}, readOnly: true},
	}
	if len(got) != len(want) {
		t.Fatalf("parseCgroup1Mounts = %+v\nwant %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.point != w.point || g.root != w.root || g.readOnly != w.readOnly || !slices.Equal(g.controllers, w.controllers) {
			t.Errorf("mount %d = %+v, want %+v", i, g, w)
		}
	}
}

func TestFindCgroupV1Places(t *testing.T) {
	places := findCgroupV1Places([]byte(mountinfoHybridFull), []byte(procCgroupHybrid))
	dirs := map[string]string{}
	for _, pl := range places {
		dirs[strings.Join(pl.controllers, ",")] = pl.dir
	}
	want := map[string]string{"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
		"memory": "/sys/fs/cgroup/memory/process_api/f4f5", "pids": "/sys/fs/cgroup/pids"}
	if fmt.Sprint(dirs) != fmt.Sprint(want) {
		t.Errorf("places %v, want %v", dirs, want)
	}
	// A container's view: its own subtree mounted at the point.
	container := "60 31 0:40 /docker/abc /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
	places = findCgroupV1Places([]byte(container), []byte("3:pids:/docker/abc/init\n0::/\n"))
	if len(places) != 1 || places[0].dir != "/sys/fs/cgroup/pids/init" {
		t.Errorf("container places %+v", places)
	}
	// A hierarchy the harness is outside of is none of its places.
	if places := findCgroupV1Places([]byte(container), []byte("3:pids:/other\n")); len(places) != 0 {
		t.Errorf("places outside the mounted subtree: %+v", places)
	}
}

func TestPlanCaps(t *testing.T) {
	all := []string{ctrlCPU, ctrlMemory, ctrlPids}
	hybrid := cgroupHost{v2: cgroupPlace{mount: "/sys/fs/cgroup/unified", dir: "/sys/fs/cgroup/unified"},
		v1: findCgroupV1Places([]byte(mountinfoHybridFull), []byte(procCgroupHybrid))}
	plan, err := planCaps(all, hybrid)
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for _, pl := range plan.v1 {
		mounts = append(mounts, pl.mount)
	}
	if len(plan.v2) != 0 || !slices.Equal(mounts, []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpuacct"}) {
		t.Errorf("hybrid plan: v2 %v, v1 %v", plan.v2, mounts)
	}
	// Pure v2 with the controllers: all there, no v1.
	v2 := cgroupHost{v2: cgroupPlace{mount: "/sys/fs/cgroup", dir: "/sys/fs/cgroup/bulkhead.service"}, v2Controllers: []string{"cpuset", "cpu", "io", "memory", "pids"}}
	if plan, err := planCaps(all, v2); err != nil || !slices.Equal(plan.v2, all) || len(plan.v1) != 0 {
		t.Errorf("v2 plan %+v, %v", plan, err)
	}
	// Only the pids cap, on the hybrid host: one v1 hierarchy, no cpuacct.
	if plan, err := planCaps([]string{ctrlPids}, hybrid); err != nil || len(plan.v1) != 1 || plan.v1[0].mount != "/sys/fs/cgroup/pids" {
		t.Errorf("pids-only plan %+v, %v", plan, err)
	}
	// A controller nowhere: refused, naming it.
	v2NoPids := cgroupHost{v2: v2.v2, v2Controllers: []string{"cpu", "memory"}}
	if _, err := planCaps(all, v2NoPids); !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pids controller") {
		t.Errorf("missing pids: %v", err)
	}
	noCgroups := cgroupHost{v2Err: errors.New("no cgroup2 file system is mounted")}
	if _, err := planCaps([]string{ctrlMemory}, noCgroups); !errors.Is(err, compute.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "memory controller") || !strings.Contains(err.Error(), "no cgroup2 file system") {
		t.Errorf("no cgroups: %v", err)
	}
	// A read-only v1 hierarchy: refused, naming it.
	ro := hybrid
	ro.v1 = slices.Clone(hybrid.v1)
	for i := range ro.v1 {
		ro.v1[i].readOnly = ro.v1[i].mount == "/sys/fs/cgroup/memory"
	}
	if _, err := planCaps(all, ro); !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("read-only memory hierarchy: %v", err)
	}
}

func TestResourcesOptions(t *testing.T) {
	p := &Provider{cfg: Config{Resources: Resources{CPUs: 1, Memory: 1 << 30, MaxProcesses: 512}}}
	for _, tc := range []struct {
		name string
		opts any
		want Resources
		err  error
	}{
		{"config", nil, Resources{CPUs: 1, Memory: 1 << 30, MaxProcesses: 512}, nil},
		{"override", &CreateOptions{Resources{CPUs: 0.25, Memory: 64 << 20}}, Resources{CPUs: 0.25, Memory: 64 << 20, MaxProcesses: 512}, nil},
		{"value", CreateOptions{Resources{MaxProcesses: 8}}, Resources{CPUs: 1, Memory: 1 << 30, MaxProcesses: 8}, nil},
		{"lift", &CreateOptions{Resources{CPUs: -1, Memory: -1, MaxProcesses: -1}}, Resources{}, nil},
		{"wrong type", struct{}{}, Resources{}, compute.ErrInvalidArgument},
		{"NaN", &CreateOptions{Resources{CPUs: math.NaN()}}, Resources{}, compute.ErrInvalidArgument},
		{"tiny CPU", &CreateOptions{Resources{CPUs: 0.001}}, Resources{}, compute.ErrInvalidArgument},
		{"tiny memory", &CreateOptions{Resources{Memory: 1 << 20}}, Resources{}, compute.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.resources(tc.opts)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("resources(%v) = %+v, %v; want %v", tc.opts, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resources(%v) = %+v, %v; want %+v", tc.opts, got, err, tc.want)
			}
		})
	}
	if cpuQuota(0.2) != 20_000 || cpuQuota(1.5) != 150_000 || cpuQuota(0.01) != 1000 {
		t.Errorf("cpuQuota: %d %d %d", cpuQuota(0.2), cpuQuota(1.5), cpuQuota(0.01))
	}
	if !slices.Equal(Resources{CPUs: 1, MaxProcesses: 3}.controllers(), []string{ctrlCPU, ctrlPids}) {
		t.Errorf("controllers %v", Resources{CPUs: 1, MaxProcesses: 3}.controllers())
	}
}

func TestCheckCgroupV1Record(t *testing.T) {
	mounts := parseCgroup1Mounts([]byte(mountinfoHybridFull))
	const dir = "/state/s-0123"
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/sys/fs/cgroup/memory/process_api/f4f5/bulkhead-s-0123-0123456789abcdef", true},
		{"/sys/fs/cgroup/pids/bulkhead-s-0123-0123456789abcdef", true},
		{"/sys/fs/cgroup/unified/bulkhead-s-0123-0123456789abcdef", false}, // the v2 hierarchy
		{"/sys/fs/cgroup/systemd/bulkhead-s-0123-0123456789abcdef", false}, // no controller
		{"/sys/fs/cgroup/pids/../bulkhead-s-0123-0123456789abcdef", false},
		{"/sys/fs/cgroup/pids", false},
		{"/sys/fs/cgroup/pids/bulkhead-s-9999-0123456789abcdef", false},
		{"/tmp/bulkhead-s-0123-0123456789abcdef", false},
		{"sys/fs/cgroup/pids/bulkhead-s-0123-0123456789abcdef", false},
	} {
		if err := checkCgroupV1Record(tc.path, mounts, dir); (err == nil) != tc.ok {
			t.Errorf("checkCgroupV1Record(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
	}
}

// TestGVisorProcessCap: a gVisor sandbox's process cap is RLIMIT_NPROC in
// its OCI spec (the sentry enforces it per uid).
func TestGVisorProcessCap(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{StateDir: state, AgentdPath: "/bin/true", Isolation: IsolationGVisor, Runsc: fake}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "sess-1")
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o711); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{0, 77} {
		if err := p.gvisorPrepare(dir, manifest.DefaultRoot, []string{"/bin/true"}, n); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(gvisorPathsOf(dir).bundle, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var spec ociSpec
		if err := json.Unmarshal(data, &spec); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(spec.Process.Rlimits, func(r ociRlimit) bool { return r.Type == "RLIMIT_NPROC" })
		switch {
		case n == 0 && i >= 0:
			t.Errorf("uncapped: rlimits %+v", spec.Process.Rlimits)
		case n > 0 && (i < 0 || spec.Process.Rlimits[i].Hard != uint64(n) || spec.Process.Rlimits[i].Soft != uint64(n)):
			t.Errorf("capped at %d: rlimits %+v", n, spec.Process.Rlimits)
		}
	}
}

// ---- real cgroups, real sandboxes ----

// requireCaps skips the test unless this process can cap sandboxes (a
// root harness with the controllers: CI's machines are).
func requireCaps(t *testing.T) {
	t.Helper()
	err := CheckResources(Resources{CPUs: 1, Memory: 1 << 30, MaxProcesses: 64})
	testenv.Require(t, testenv.Linux, testenv.Root, testenv.Condition(err == nil, fmt.Sprint("sandbox caps cannot be applied here: ", err)))
}

// capsEnv is a client factory for isolation iso (runscBin for gVisor)
// over one state directory.
func capsClient(t *testing.T, stateDir string, iso Isolation, runscBin string) *compute.Client {
	t.Helper()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	c, err := NewClient(Config{StateDir: stateDir, AgentdPath: agentdBin, Isolation: iso, Runsc: runscBin}, compute.ClientOptions{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// capsStateDir is a state directory sandbox accounts can pass through.
func capsStateDir(t *testing.T) string {
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// isolations are the isolations the cap tests run under: none and
// bubblewrap, and gVisor where runsc is available (a gVisor test that
// cannot have it skips through testenv, as the other gVisor tests).
func forIsolations(t *testing.T, run func(t *testing.T, iso Isolation, runscBin string)) {
	t.Run("none", func(t *testing.T) { run(t, IsolationNone, "") })
	t.Run("bubblewrap", func(t *testing.T) {
		testenv.Require(t, testenv.Bubblewrap)
		run(t, IsolationBubblewrap, "")
	})
	t.Run("gvisor", func(t *testing.T) {
		bin := runsc.Require(t)
		run(t, IsolationGVisor, bin)
	})
}

// cappedSandbox creates a sandbox with caps r and deletes it when the
// test ends; it returns the session and its private directory.
func cappedSandbox(t *testing.T, ctx context.Context, c *compute.Client, r Resources) (*compute.Session, string) {
	t.Helper()
	s, err := c.Create(ctx, compute.CreateOptions{ProviderOptions: &CreateOptions{Resources: r}})
	if err != nil {
		t.Fatalf("create a sandbox capped at %+v: %v", r, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	_, dir := sandboxState(t, s)
	return s, dir
}

// sandboxCgroupFile finds, among the cgroups recorded in dir (v1 and v2),
// the one holding the control file name, and returns its path.
func sandboxCgroupFile(t *testing.T, dir, name string) string {
	t.Helper()
	var cgs []string
	v1, err := recordedCgroupsV1(dir)
	if err != nil {
		t.Fatal(err)
	}
	cgs = append(cgs, v1...)
	if v2, err := recordedCgroup(dir); err != nil {
		t.Fatal(err)
	} else if v2 != "" {
		cgs = append(cgs, v2)
	}
	for _, cg := range cgs {
		if _, err := os.Stat(filepath.Join(cg, name)); err == nil {
			return filepath.Join(cg, name)
		}
	}
	t.Fatalf("no cgroup of the sandbox (%v) has %s", cgs, name)
	return ""
}

// cgroupKey reads "key value" lines of a cgroup file (cpu.stat,
// pids.events, memory.events) and returns key's value.
func cgroupKey(t *testing.T, file, key string) int64 {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", file, line)
			}
			return n
		}
	}
	t.Fatalf("%s has no %s: %s", file, key, data)
	return 0
}

// readInt reads a cgroup file holding one number.
func readInt(t *testing.T, file string) int64 {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q", file, data)
	}
	return n
}

// execIn runs a command line in the sandbox to completion.
func execIn(ctx context.Context, t *testing.T, s *compute.Session, command string) (string, string, int, error) {
	t.Helper()
	res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: command}, compute.ExecOptions{}, nil)
	if err != nil {
		return "", "", 0, err
	}
	return string(res.Stdout), string(res.Stderr), res.Exit.ExitCode, nil
}

// answers waits until the sandbox's daemon runs a command again.
func answers(ctx context.Context, t *testing.T, s *compute.Session) {
	t.Helper()
	var last string
	eventually(t, 30*time.Second, "the sandbox answers an exec", func() (bool, string) {
		out, errOut, code, err := execIn(ctx, t, s, "echo alive")
		last = fmt.Sprintf("%q %q %d %v", out, errOut, code, err)
		return err == nil && out == "alive\n" && code == 0, last
	})
}

// TestCapsMemory: a sandbox capped at some memory whose process asks for
// far more does not get it (the kernel kills it, or the allocation
// fails), the cgroup records the cap being hit, and the harness is
// unaffected.
func TestCapsMemory(t *testing.T) {
	requireCaps(t)
	forIsolations(t, func(t *testing.T, iso Isolation, runscBin string) {
		ctx := testCtx(t)
		c := capsClient(t, capsStateDir(t), iso, runscBin)
		// gVisor's sentry lives inside the cap: give it room to boot.
		limit, ask := int64(64<<20), int64(200<<20)
		if iso == IsolationGVisor {
			limit, ask = 256<<20, 800<<20
		}
		s, dir := cappedSandbox(t, ctx, c, Resources{Memory: limit})
		max := "memory.limit_in_bytes"
		if _, err := os.Stat(filepath.Join(filepath.Dir(sandboxCgroupFile(t, dir, "cgroup.procs")), max)); err != nil {
			max = "memory.max"
		}
		if got := readInt(t, sandboxCgroupFile(t, dir, max)); got != limit {
			t.Fatalf("%s = %d, want %d", max, got, limit)
		}
		// One read of ask bytes of zeros into one buffer: dd touches every
		// page of it at once (a shell string built through a pipe took
		// minutes under gVisor on a loaded machine).
		cmd := fmt.Sprintf("dd if=/dev/zero of=/dev/null bs=%d count=1 2>/dev/null && echo held", ask)
		start := time.Now()
		out, errOut, code, err := execIn(ctx, t, s, cmd)
		t.Logf("allocating %d bytes under a cap of %d: %q %q exit %d, %v (%v)", ask, limit, out, errOut, code, err, time.Since(start).Round(time.Millisecond))
		if err == nil && code == 0 && strings.TrimSpace(out) == "held" {
			t.Fatalf("a sandbox capped at %d bytes held %d", limit, ask)
		}
		// The cgroup saw the cap hit: v1 counts OOM kills in
		// memory.oom_control (its failcnt is not kept by every kernel), v2
		// the times usage reached memory.max.
		if max == "memory.limit_in_bytes" {
			kills := cgroupKey(t, sandboxCgroupFile(t, dir, "memory.oom_control"), "oom_kill")
			fails := readInt(t, sandboxCgroupFile(t, dir, "memory.failcnt"))
			if kills == 0 && fails == 0 {
				t.Errorf("memory.oom_control oom_kill = 0 and memory.failcnt = 0: the cap was never hit")
			}
			// The peak may pass the limit by a charge batch (pages charged
			// ahead per CPU), never by the allocation.
			if peak := readInt(t, sandboxCgroupFile(t, dir, "memory.max_usage_in_bytes")); peak > limit+4<<20 {
				t.Errorf("the sandbox's peak memory %d is above its cap %d", peak, limit)
			}
		} else if n := cgroupKey(t, sandboxCgroupFile(t, dir, "memory.events"), "max"); n == 0 {
			t.Errorf("memory.events max = 0: the cap was never hit")
		}
		if iso == IsolationGVisor {
			// gVisor has no OOM killer of its own: the sandbox's memory is
			// the sentry's, which the host's kills. The sandbox is lost,
			// the host and the harness are not.
			return
		}
		// The process, not the sandbox, pays: the daemon answers.
		answers(ctx, t, s)
	})
}

// TestCapsProcesses: a fork loop in a sandbox capped at a few processes
// fails at the cap, and the daemon still answers afterwards.
func TestCapsProcesses(t *testing.T) {
	requireCaps(t)
	forIsolations(t, func(t *testing.T, iso Isolation, runscBin string) {
		ctx := testCtx(t)
		c := capsClient(t, capsStateDir(t), iso, runscBin)
		const limit = 64
		s, dir := cappedSandbox(t, ctx, c, Resources{MaxProcesses: limit})
		want := int64(limit)
		if iso == IsolationGVisor {
			want = gvisorHostProcesses(limit)
		}
		if got := readInt(t, sandboxCgroupFile(t, dir, "pids.max")); got != want {
			t.Fatalf("pids.max = %d, want %d", got, want)
		}
		before := daemonAlive(t, iso, dir)
		// Far more short sleeps than the cap allows; the shell stops at
		// the first fork that fails.
		loop := `i=0; while [ $i -lt 1000 ]; do sleep 3 >/dev/null 2>&1 & i=$((i+1)); done; echo all-started`
		out, errOut, code, err := execIn(ctx, t, s, loop)
		t.Logf("fork loop: %q %q exit %d, %v", out, truncate(errOut, 300), code, err)
		if err == nil && strings.Contains(out, "all-started") {
			t.Fatalf("a sandbox capped at %d processes started 1000", limit)
		}
		if iso != IsolationGVisor {
			if n := cgroupKey(t, sandboxCgroupFile(t, dir, "pids.events"), "max"); n == 0 {
				t.Errorf("pids.events max = 0: no fork was refused at the cap")
			}
		}
		if cur := readInt(t, sandboxCgroupFile(t, dir, "pids.current")); cur > want {
			t.Errorf("pids.current %d is above pids.max %d", cur, want)
		}
		answers(ctx, t, s)
		if after := daemonAlive(t, iso, dir); after != before {
			t.Errorf("the sandbox's process changed from %d to %d: the daemon died", before, after)
		}
	})
}

// daemonAlive returns the pid of the sandbox's host process (the daemon,
// bwrap or runsc: its meta pid), which must run.
func daemonAlive(t *testing.T, iso Isolation, dir string) int {
	t.Helper()
	m, err := readMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !alivePID(m.PID) {
		t.Fatalf("the sandbox's process %d (%s) is gone", m.PID, iso)
	}
	return m.PID
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestCapsCPU: a busy loop in a sandbox capped at 0.2 CPU uses about
// that: its cgroup's own usage counter grows at most about 0.2 s a second
// (generous margin), and the cgroup reports throttling.
func TestCapsCPU(t *testing.T) {
	requireCaps(t)
	forIsolations(t, func(t *testing.T, iso Isolation, runscBin string) {
		ctx := testCtx(t)
		c := capsClient(t, capsStateDir(t), iso, runscBin)
		const cpus = 0.2
		s, dir := cappedSandbox(t, ctx, c, Resources{CPUs: cpus})
		// Usage in nanoseconds: cpuacct.usage (v1) or cpu.stat usage_usec (v2).
		usage := func() int64 {
			if f := optionalCgroupFile(t, dir, "cpuacct.usage"); f != "" {
				return readInt(t, f)
			}
			return cgroupKey(t, sandboxCgroupFile(t, dir, "cpu.stat"), "usage_usec") * 1000
		}
		throttled := func() int64 { return cgroupKey(t, sandboxCgroupFile(t, dir, "cpu.stat"), "nr_throttled") }
		if _, err := s.Agent().Start(ctx, compute.ProcessSpec{Command: "while :; do :; done"}, compute.StartOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the busy loop is throttled", func() (bool, string) {
			n := throttled()
			return n > 0, fmt.Sprintf("nr_throttled %d", n)
		})
		u0, t0 := usage(), time.Now()
		time.Sleep(3 * time.Second)
		u1, t1 := usage(), time.Now()
		wall := t1.Sub(t0)
		used := time.Duration(u1 - u0)
		t.Logf("%s: %v of CPU over %v (%.2f CPUs; cap %.2f)", iso, used, wall, used.Seconds()/wall.Seconds(), cpus)
		// At most the quota of every period in the window and one more.
		if limit := time.Duration(float64(wall)*cpus*1.5) + 100*time.Millisecond; used > limit {
			t.Errorf("the sandbox used %v of CPU in %v, above its cap of %.2f CPU (allowing %v)", used, wall, cpus, limit)
		}
	})
}

// optionalCgroupFile is sandboxCgroupFile, "" when no cgroup has it.
func optionalCgroupFile(t *testing.T, dir, name string) string {
	t.Helper()
	v1, _ := recordedCgroupsV1(dir)
	v2, _ := recordedCgroup(dir)
	for _, cg := range append(v1, v2) {
		if cg == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(cg, name)); err == nil {
			return filepath.Join(cg, name)
		}
	}
	return ""
}

// sandboxCgroups lists the cgroups recorded for the sandbox in dir.
func sandboxCgroupDirs(t *testing.T, dir string) []string {
	t.Helper()
	out, err := recordedCgroupsV1(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v2, err := recordedCgroup(dir); err != nil {
		t.Fatal(err)
	} else if v2 != "" {
		out = append(out, v2)
	}
	return out
}

// TestCapsCgroupsRemoved: a capped sandbox's cgroups are removed when it
// is deleted, and when a harness that crashed left it (and its daemon was
// killed): the next harness reaping it removes them.
func TestCapsCgroupsRemoved(t *testing.T) {
	requireCaps(t)
	caps := Resources{CPUs: 0.5, Memory: 256 << 20, MaxProcesses: 128}
	gone := func(t *testing.T, cgs []string) {
		t.Helper()
		for _, cg := range cgs {
			if _, err := os.Stat(cg); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("cgroup %s survives: %v", cg, err)
			}
		}
	}
	forIsolations(t, func(t *testing.T, iso Isolation, runscBin string) {
		ctx := testCtx(t)
		state := capsStateDir(t)
		c := capsClient(t, state, iso, runscBin)
		s, dir := cappedSandbox(t, ctx, c, caps)
		cgs := sandboxCgroupDirs(t, dir)
		if len(cgs) < 3 {
			t.Fatalf("the capped sandbox records cgroups %v, want one per controller's hierarchy at least", cgs)
		}
		// The sandbox's process (the daemon, bwrap or runsc) is in each.
		pid := daemonAlive(t, iso, dir)
		for _, cg := range cgs {
			if !slices.Contains(cgroupPIDs(cg), pid) {
				t.Errorf("the sandbox's process %d is not in its cgroup %s (%v)", pid, cg, cgroupPIDs(cg))
			}
		}
		if err := c.Delete(ctx, s); err != nil {
			t.Fatal(err)
		}
		gone(t, cgs)

		// A harness crashes: its sandbox runs on in its cgroups, with a
		// background process that left the daemon's process groups.
		s2, err := c.Create(ctx, compute.CreateOptions{TTL: time.Millisecond, ProviderOptions: &CreateOptions{Resources: caps}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), s2) })
		_, dir2 := sandboxState(t, s2)
		cgs2 := sandboxCgroupDirs(t, dir2)
		marker := fmt.Sprintf("caps-marker-%d", time.Now().UnixNano())
		t.Cleanup(func() { killMarked(marker) })
		if _, _, _, err := execIn(ctx, t, s2, `setsid sh -c "m=`+marker+`; sleep 300; true" >/dev/null 2>&1 &`); err != nil {
			t.Fatal(err)
		}
		if iso != IsolationGVisor { // gVisor's processes are not the host's
			eventually(t, 10*time.Second, "the background process runs", func() (bool, string) {
				return len(processesWith(marker)) > 0, ""
			})
		}
		_ = s2.Release()
		time.Sleep(5 * time.Millisecond)
		// The next harness reaps what it left.
		reaped, err := capsClient(t, state, iso, runscBin).Reap(ctx)
		if err != nil || len(reaped) != 1 {
			t.Fatalf("reap: %v, %v", reaped, err)
		}
		gone(t, cgs2)
		if left := processesWith(marker); len(left) > 0 {
			t.Errorf("the reaped sandbox's background process survives: %v", left)
		}
	})
	// A crash between making the cgroups and starting the sandbox leaves
	// empty cgroups and their records: the next launch in the directory,
	// or a Destroy, removes them.
	t.Run("records", func(t *testing.T) {
		state := capsStateDir(t)
		dir := filepath.Join(state, "crashed")
		if err := os.MkdirAll(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		cgs, _, err := makeSandboxCgroups(dir, caps)
		if err != nil {
			t.Fatal(err)
		}
		all := append(slices.Clone(cgs.v1), cgs.v2)
		for _, cg := range all {
			if cg == "" {
				continue
			}
			if _, err := os.Stat(cg); err != nil {
				t.Fatalf("cgroup %s: %v", cg, err)
			}
		}
		state2, _ := json.Marshal(providerState{Dir: dir})
		p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone}, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Destroy(testCtx(t), state2); err != nil {
			t.Fatal(err)
		}
		for _, cg := range all {
			if cg == "" {
				continue
			}
			if _, err := os.Stat(cg); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("cgroup %s survives the reap: %v", cg, err)
			}
		}
	})
}

// TestStartGateHoldsUntilInCgroups: a daemon whose v1 cgroups cannot be
// joined never runs: Start fails with FailedPrecondition and the wrapped
// command (which would leave a file first thing) has not run.
func TestStartGateHoldsUntilInCgroups(t *testing.T) {
	ctx := testCtx(t)
	ran := filepath.Join(t.TempDir(), "ran")
	opts := Options{AgentdPath: agentdBin, CgroupV1: []string{t.TempDir()}, // no cgroup.procs there
		Wrap: func(argv []string) []string {
			return append([]string{"/bin/sh", "-c", `touch "$0"; exec "$@"`, ran}, argv...)
		}}
	s, err := Start(ctx, opts, testLogger(t))
	if err == nil {
		_ = s.Close(ctx)
		t.Fatal("Start succeeded outside the cgroups it was given")
	}
	if !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Errorf("Start: %v, want a failed precondition", err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(ran); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's command ran before it was in its cgroups: %v", err)
	}
	// Through the gate, into a real v1 cgroup when the host has one.
	h, herr := detectCgroupHost()
	i := slices.IndexFunc(h.v1, func(pl cgroupV1Place) bool { return slices.Contains(pl.controllers, ctrlPids) && !pl.readOnly })
	if herr != nil || i < 0 || os.Geteuid() != 0 {
		return
	}
	name, err := newCgroupName("gate")
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(h.v1[i].dir, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killCgroupV1(context.Background(), cg) })
	opts.CgroupV1 = []string{cg}
	sb := startSandbox(t, opts)
	if !slices.Contains(cgroupPIDs(cg), sb.PID()) {
		t.Errorf("the daemon %d is not in %s: %v", sb.PID(), cg, cgroupPIDs(cg))
	}
	if out, _, code := execShell(ctx, t, sb, "cat /proc/self/cgroup"); code != 0 || !strings.Contains(out, name) {
		t.Errorf("a command of the sandbox runs outside its cgroup: %q", out)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Errorf("the wrapped command did not run: %v", err)
	}
}

// TestCapsRefusedWithoutControllers: caps that cannot be applied are
// refused, never dropped: on a host without the controller a launch with
// caps fails with FailedPrecondition naming it, leaving nothing, and a
// provider configured with caps is not made at all.
func TestCapsRefusedWithoutControllers(t *testing.T) {
	ctx := testCtx(t)
	state := capsStateDir(t)
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	real := detectCgroupHost
	t.Cleanup(func() { detectCgroupHost = real })
	// The host as it is, less its pids controller wherever it is.
	detectCgroupHost = func() (cgroupHost, error) {
		h, err := real()
		h.v2Controllers = slices.DeleteFunc(slices.Clone(h.v2Controllers), func(c string) bool { return c == ctrlPids })
		h.v1 = slices.DeleteFunc(slices.Clone(h.v1), func(pl cgroupV1Place) bool { return slices.Contains(pl.controllers, ctrlPids) })
		return h, err
	}
	_, err = p.Launch(ctx, compute.LaunchSpec{SessionID: "capped", Options: &CreateOptions{Resources{MaxProcesses: 10}}})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pids controller") {
		t.Fatalf("launch with a process cap on a host without the pids controller: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "capped")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused launch left its directory: %v", err)
	}
	if _, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone, Resources: Resources{MaxProcesses: 10}}, zap.NewNop()); !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Errorf("New with a process cap on a host without the pids controller: %v", err)
	}
	// Without caps the launch goes on as before.
	sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "uncapped"})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := sb.State()
	_ = sb.Close()
	if err := p.Destroy(ctx, st); err != nil {
		t.Fatal(err)
	}
	// Options of another type, or caps no kernel applies, are refused.
	if _, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "wrong", Options: 3}); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("launch with options of another type: %v", err)
	}
	if _, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone, Resources: Resources{CPUs: -1}}, zap.NewNop()); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("New with a negative CPU cap: %v", err)
	}
}
