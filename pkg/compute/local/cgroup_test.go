package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Mount tables as /proc/self/mountinfo shows them.
const (
	// A hybrid (v1 controllers + unified) host, as the CI machines.
	mountinfoHybrid = `22 1 0:21 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	// A pure cgroup v2 systemd host.
	mountinfoV2 = `24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	// cgroup v1 only.
	mountinfoV1 = `31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
`
	// A container given a read-only view of its own subtree.
	mountinfoContainerRO = `700 690 0:30 /docker/abc /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup ro
`
	// A container given a writable view of its own subtree.
	mountinfoContainerRW = `700 690 0:30 /docker/abc /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw
`
	// A cgroup2 mount point with a space (escaped as \040).
	mountinfoEscaped = `50 24 0:30 / /mnt/cg\0402 rw,relatime - cgroup2 none rw
`
)

func TestFindCgroupPlace(t *testing.T) {
	const hybridCgroup = "9:name=systemd:/\n4:memory:/process_api/b91\n1:cpu:/\n0::/\n"
	for _, tc := range []struct {
		name              string
		mountinfo, cgroup string
		mount, dir        string // want
		err               string // want an error containing this
	}{
		{name: "hybrid", mountinfo: mountinfoHybrid, cgroup: hybridCgroup, mount: "/sys/fs/cgroup/unified", dir: "/sys/fs/cgroup/unified"},
		{name: "hybrid nested", mountinfo: mountinfoHybrid, cgroup: "1:cpu:/\n0::/ci/job-7\n", mount: "/sys/fs/cgroup/unified", dir: "/sys/fs/cgroup/unified/ci/job-7"},
		{name: "pure v2", mountinfo: mountinfoV2, cgroup: "0::/user.slice/user-1000.slice/session-2.scope\n",
			mount: "/sys/fs/cgroup", dir: "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"},
		{name: "pure v2 root", mountinfo: mountinfoV2, cgroup: "0::/\n", mount: "/sys/fs/cgroup", dir: "/sys/fs/cgroup"},
		{name: "v1 only", mountinfo: mountinfoV1, cgroup: "2:cpu,cpuacct:/\n1:name=systemd:/init.scope\n", err: "no cgroup2 file system"},
		{name: "absent", mountinfo: "", cgroup: "", err: "no cgroup2 file system"},
		{name: "no 0:: line", mountinfo: mountinfoV2, cgroup: "1:name=systemd:/\n", err: "no cgroup v2 hierarchy"},
		{name: "removed cgroup", mountinfo: mountinfoV2, cgroup: "0::/gone (deleted)\n", err: "was removed"},
		{name: "read-only", mountinfo: mountinfoContainerRO, cgroup: "0::/docker/abc\n", err: "read-only"},
		{name: "container subtree", mountinfo: mountinfoContainerRW, cgroup: "0::/docker/abc/init\n", mount: "/sys/fs/cgroup", dir: "/sys/fs/cgroup/init"},
		{name: "outside the mounted subtree", mountinfo: mountinfoContainerRW, cgroup: "0::/docker/abcd\n", err: "no cgroup2 mount holds"},
		{name: "escaped mount point", mountinfo: mountinfoEscaped, cgroup: "0::/a\n", mount: "/mnt/cg 2", dir: "/mnt/cg 2/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := findCgroupPlace([]byte(tc.mountinfo), []byte(tc.cgroup))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("findCgroupPlace = %+v, %v; want an error with %q", pl, err, tc.err)
				}
				return
			}
			if err != nil || pl.mount != tc.mount || pl.dir != tc.dir {
				t.Fatalf("findCgroupPlace = %+v, %v; want mount %q dir %q", pl, err, tc.mount, tc.dir)
			}
		})
	}
}

func TestCheckCgroupRecord(t *testing.T) {
	mounts := parseCgroup2Mounts([]byte(mountinfoHybrid))
	if len(mounts) != 1 || mounts[0].point != "/sys/fs/cgroup/unified" {
		t.Fatalf("mounts = %+v", mounts)
	}
	const dir = "/state/s-0123"
	good := "/sys/fs/cgroup/unified/bulkhead-s-0123-0123456789abcdef"
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{good, true},
		{"/sys/fs/cgroup/unified/ci/bulkhead-s-0123-0123456789abcdef", true},
		{"sys/fs/cgroup/unified/bulkhead-s-0123-0123456789abcdef", false},              // relative
		{"/sys/fs/cgroup/unified/x/../bulkhead-s-0123-0123456789abcdef", false},        // not clean
		{"/sys/fs/cgroup/memory/bulkhead-s-0123-0123456789abcdef", false},              // a v1 hierarchy
		{"/tmp/bulkhead-s-0123-0123456789abcdef", false},                               // not below a cgroup2 mount
		{"/sys/fs/cgroup/unified", false},                                              // the mount itself
		{"/sys/fs/cgroup/unified/system.slice", false},                                 // not a sandbox's
		{"/sys/fs/cgroup/unified/bulkhead-s-9999-0123456789abcdef", false},             // another sandbox's
		{"/sys/fs/cgroup/unified/bulkhead-s-0123-0123456789abcdeg", false},             // not hex
		{"/sys/fs/cgroup/unified/bulkhead-s-0123-0123456789abcdef/cgroup.kill", false}, // a file in it
	} {
		err := checkCgroupRecord(tc.path, mounts, dir)
		if (err == nil) != tc.ok {
			t.Errorf("checkCgroupRecord(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
	}
	name, err := newCgroupName(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkCgroupRecord("/sys/fs/cgroup/unified/"+name, mounts, dir); err != nil {
		t.Errorf("a fresh name does not pass: %v", err)
	}
	if got := cgroupStem("/state/../weird name"); got != cgroupPrefix+"sandbox-" {
		t.Errorf("cgroupStem of an odd directory name = %q", got)
	}
}

// requireCgroups skips the test unless this process can make a cgroup v2
// directory below its own and start a process in it.
func requireCgroups(t *testing.T) cgroupPlace {
	t.Helper()
	pl, err := detectCgroupPlace()
	if err == nil {
		err = probeCgroup(pl)
	}
	if err != nil {
		// A property of the host, not a part CI can install: machines with
		// only cgroup v1 (as this project's CI) never run these tests.
		testenv.Optional(t, fmt.Sprintf("cgroup v2 not mounted or not delegated here (%v); they run on a host whose /sys/fs/cgroup is a writable cgroup2 hierarchy", err))
	}
	return pl
}

// probeCgroup creates a cgroup below pl, starts `true` in it and removes it.
func probeCgroup(pl cgroupPlace) error {
	name, err := newCgroupName("probe")
	if err != nil {
		return err
	}
	cg := filepath.Join(pl.dir, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		return err
	}
	defer func() { _ = killCgroup(context.Background(), cg) }()
	cmd, err := startInCgroup(cg, func(dir *os.File) *exec.Cmd {
		c := exec.Command("true")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
		return c
	})
	if err != nil {
		return err
	}
	return cmd.Wait()
}

// killMarked SIGKILLs whatever process still carries marker (test cleanup).
func killMarked(marker string) {
	for _, pid := range processesWith(marker) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestCgroupEndsWhatADeadDaemonLeft: a plain sandbox whose daemon is
// SIGKILLed leaves a process that never writes and one that left its
// process group; deleting the sandbox ends both (its cgroup is killed) and
// removes the cgroup.
func TestCgroupEndsWhatADeadDaemonLeft(t *testing.T) {
	requireCgroups(t)
	ctx := testCtx(t)
	env, _ := providerEnv(t)
	c := env.NewClient(t, nil)
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	_, dir := sandboxState(t, s)
	cg, err := recordedCgroup(dir)
	if err != nil || cg == "" {
		t.Fatalf("cgroup v2 is usable here, but the sandbox records no cgroup (%q, %v)", cg, err)
	}
	daemon := daemonPID(t, dir)
	if !slices.Contains(cgroupPIDs(cg), daemon) {
		t.Fatalf("the daemon (pid %d) is not in its cgroup %s: %v", daemon, cg, cgroupPIDs(cg))
	}

	marker := fmt.Sprintf("cgroup-marker-%d", time.Now().UnixNano())
	t.Cleanup(func() { killMarked(marker) })
	agent := s.Agent()
	quiet := "m=" + marker + "; sleep 300; true"
	if _, err := agent.Start(ctx, compute.ProcessSpec{Command: quiet}, compute.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := agent.Exec(ctx, compute.ProcessSpec{
		Command: `setsid sh -c "` + quiet + `" >/dev/null 2>&1 &`,
	}, compute.ExecOptions{}, nil)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("start the escaping process: %v %v", res, err)
	}
	var pids []int
	eventually(t, 10*time.Second, "both marked processes run", func() (bool, string) {
		pids = processesWith(marker)
		return len(pids) >= 2, fmt.Sprint(pids)
	})
	escaped := 0
	for _, pid := range pids {
		if !slices.Contains(cgroupPIDs(cg), pid) {
			t.Errorf("marked process %d is not in the sandbox's cgroup", pid)
		}
		if st, ok := readStat(pid); ok && st.pgrp != mustStat(t, daemon).pgrp && st.pgrp == pid {
			escaped++
		}
	}
	if escaped == 0 {
		t.Fatalf("no marked process leads its own group: %v", pids)
	}

	killDaemon(t, dir)
	if left := processesWith(marker); len(left) < 2 {
		t.Fatalf("the marked processes should outlive the SIGKILLed daemon by themselves (left: %v)", left)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if left := processesWith(marker); len(left) > 0 {
		t.Errorf("processes of the deleted sandbox survive: %v", left)
	}
	if _, err := os.Stat(cg); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's cgroup %s is still there: %v", cg, err)
	}
}

// TestCgroupShutdownAndReplace: Shutdown of a live sandbox ends a process
// that left the daemon's process groups and removes the cgroup; a launch
// over a directory whose recorded cgroup still holds processes ends them
// first.
func TestCgroupShutdownAndReplace(t *testing.T) {
	requireCgroups(t)
	ctx := testCtx(t)
	env, _ := providerEnv(t)
	c := env.NewClient(t, nil)
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	st, dir := sandboxState(t, s)
	cg, err := recordedCgroup(dir)
	if err != nil || cg == "" {
		t.Fatalf("no cgroup recorded: %q, %v", cg, err)
	}
	marker := fmt.Sprintf("cgroup-marker-%d", time.Now().UnixNano())
	t.Cleanup(func() { killMarked(marker) })
	escape := `setsid sh -c "m=` + marker + `; sleep 300; true" >/dev/null 2>&1 &`
	if _, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: escape}, compute.ExecOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the escaped process runs", func() (bool, string) {
		return len(processesWith(marker)) > 0, ""
	})
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if left := processesWith(marker); len(left) > 0 {
		t.Errorf("a process of the shut-down sandbox survives: %v", left)
	}
	if _, err := os.Stat(cg); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the cgroup %s survives Shutdown: %v", cg, err)
	}
	if _, err := os.Stat(filepath.Join(dir, cgroupFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the cgroup record survives Shutdown: %v", err)
	}

	// A cgroup recorded in the directory, still holding a process (as a
	// crashed harness's sandbox would), is ended by the next launch there.
	prev, err := makeCgroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := startInCgroup(prev, func(dir *os.File) *exec.Cmd {
		c := exec.Command("sh", "-c", "m="+marker+"; sleep 300; true")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: int(dir.Fd())}
		return c
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	_ = s.Release()
	s2, err := env.NewClient(t, nil).Resume(ctx, st)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s2) })
	if left := processesWith(marker); len(left) > 0 {
		t.Errorf("the previous cgroup's process survives the replacement's launch: %v", left)
	}
	if _, err := os.Stat(prev); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the previous cgroup %s survives the replacement's launch: %v", prev, err)
	}
	if cg2, err := recordedCgroup(dir); err != nil || cg2 == "" || cg2 == prev {
		t.Errorf("the replacement records cgroup %q (%v), want a new one", cg2, err)
	}
}

// TestStartOutsideAnUnusableCgroup: when the daemon cannot be started in
// the cgroup it is given (here a directory that is no cgroup), Start
// starts it as without one and says why.
func TestStartOutsideAnUnusableCgroup(t *testing.T) {
	ctx := testCtx(t)
	s := startSandbox(t, Options{Cgroup: t.TempDir()})
	if s.Cgroup != "" || s.CgroupErr() == nil {
		t.Fatalf("Cgroup = %q, CgroupErr = %v: want none, and a reason", s.Cgroup, s.CgroupErr())
	}
	t.Logf("started outside: %v", s.CgroupErr())
	if out, _, code := execShell(ctx, t, s, "echo ok"); out != "ok\n" || code != 0 {
		t.Fatalf("exec = %q, %d", out, code)
	}
}
