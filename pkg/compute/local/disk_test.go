package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/loopdev"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// ---- unit tests ----

func TestDiskOptions(t *testing.T) {
	p := &Provider{cfg: Config{Resources: Resources{Memory: 1 << 30, Disk: 1 << 30}}}
	for _, tc := range []struct {
		name string
		opts any
		want Resources
		err  error
	}{
		{"config", nil, Resources{Memory: 1 << 30, Disk: 1 << 30}, nil},
		{"override", &CreateOptions{Resources{Disk: 64 << 20}}, Resources{Memory: 1 << 30, Disk: 64 << 20}, nil},
		{"lift", &CreateOptions{Resources{Disk: -1}}, Resources{Memory: 1 << 30}, nil},
		{"tiny", &CreateOptions{Resources{Disk: 1 << 20}}, Resources{}, compute.ErrInvalidArgument},
		{"huge", &CreateOptions{Resources{Disk: 1 << 60}}, Resources{}, compute.ErrInvalidArgument},
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
	if err := (Resources{Disk: -5}).check(); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("a negative disk cap: %v", err)
	}
	// The disk is no cgroup controller.
	if c := (Resources{Disk: 1 << 30}).controllers(); len(c) != 0 {
		t.Errorf("controllers of a disk cap: %v", c)
	}
}

func TestDiskParseMountinfo(t *testing.T) {
	got := parseMountinfo([]byte("22 27 0:21 / /proc rw,relatime - proc proc rw\n" +
		"51 27 7:0 / /s/a\\040b/disk rw,nosuid,nodev,relatime - ext4 /dev/loop0 rw,discard\n" +
		"52 27 7:0 /workspace /s/a\\040b/workspace rw,nosuid,nodev,relatime shared:1 - ext4 /dev/loop0 rw,discard\n" +
		"garbage\n"))
	want := []mountEntry{
		{majmin: "0:21", root: "/", point: "/proc", opts: "rw,relatime", fstype: "proc", source: "proc"},
		{majmin: "7:0", root: "/", point: "/s/a b/disk", opts: "rw,nosuid,nodev,relatime", fstype: "ext4", source: "/dev/loop0"},
		{majmin: "7:0", root: "/workspace", point: "/s/a b/workspace", opts: "rw,nosuid,nodev,relatime", fstype: "ext4", source: "/dev/loop0"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if m := lastMountAt(got, "/s/a b/workspace"); m == nil || m.root != "/workspace" {
		t.Errorf("lastMountAt: %+v", m)
	}
}

// TestDiskCapRefused: a disk cap this process cannot apply (no root, no
// mkfs.ext4) is refused, never dropped: New fails and so does a launch,
// with FailedPrecondition naming what is missing, leaving nothing.
func TestDiskCapRefused(t *testing.T) {
	ctx := testCtx(t)
	state := capsStateDir(t)
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	realEUID, realFallbacks := diskEUID, mkfsFallbacks
	t.Cleanup(func() { diskEUID, mkfsFallbacks = realEUID, realFallbacks })
	diskEUID = func() int { return 1000 }
	t.Setenv("PATH", t.TempDir())
	mkfsFallbacks = []string{filepath.Join(t.TempDir(), "mkfs.ext4")}

	_, err = p.Launch(ctx, compute.LaunchSpec{SessionID: "disked", Options: &CreateOptions{Resources{Disk: 64 << 20}}})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "root harness") || !strings.Contains(err.Error(), "mkfs.ext4") {
		t.Fatalf("launch with a disk cap, without root and mkfs.ext4: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "disked")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused launch left its directory: %v", err)
	}
	if _, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone, Resources: Resources{Disk: 64 << 20}}, zap.NewNop()); !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "disk cap") {
		t.Errorf("New with a disk cap without root: %v", err)
	}
	if err := CheckResources(Resources{Disk: 64 << 20}); !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Errorf("CheckResources with a disk cap without root: %v", err)
	}
	if err := CheckResources(Resources{Disk: 1 << 20}); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("CheckResources with a disk cap below MinDisk: %v", err)
	}
	// Root, but no mkfs.ext4: said as such.
	diskEUID = func() int { return 0 }
	if err := checkDiskCap(); err == nil || strings.Contains(err.Error(), "root harness") || !strings.Contains(err.Error(), "mkfs.ext4 is neither on PATH") {
		t.Errorf("checkDiskCap without mkfs.ext4: %v", err)
	}
}

// ---- with real loop devices ----

// requireDisk skips the test unless this process can give sandboxes disks
// (root, mkfs.ext4, loop devices) and losetup is there to check on them.
func requireDisk(t *testing.T) {
	t.Helper()
	err := checkDiskCap()
	testenv.Require(t, testenv.Linux, testenv.Root, testenv.Tool("losetup"),
		testenv.Condition(err == nil, fmt.Sprint("sandbox disk caps cannot be applied here: ", err)))
}

// diskStateDir is a state directory whose sandboxes' disks are released
// when the test ends, whatever happened (before the directory goes).
func diskStateDir(t *testing.T) string {
	state := capsStateDir(t)
	t.Cleanup(func() {
		ents, _ := os.ReadDir(state)
		for _, e := range ents {
			if err := releaseDisk(filepath.Join(state, e.Name())); err != nil {
				t.Errorf("release the disk of %s: %v", e.Name(), err)
			}
		}
	})
	return state
}

// shell runs a command line in the sandbox and fails the test when the
// daemon does not run it.
func shell(ctx context.Context, t *testing.T, s *compute.Session, command string) (string, string, int) {
	t.Helper()
	out, errOut, code, err := execIn(ctx, t, s, command)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	return out, errOut, code
}

// mountsBelow lists the mounts at or below dir.
func mountsBelow(t *testing.T, dir string) []mountEntry {
	t.Helper()
	mounts, err := readMounts()
	if err != nil {
		t.Fatal(err)
	}
	var out []mountEntry
	for _, m := range mounts {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// losetupHolds reports the `losetup -a` lines naming image.
func losetupHolds(t *testing.T, image string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	if err != nil {
		t.Fatalf("losetup -a: %v: %s", err, out)
	}
	var held []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, image) {
			held = append(held, line)
		}
	}
	return held
}

// hostBytes is what the files below dir take on dir's own file system
// (mounts below it not counted).
func hostBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var root syscall.Stat_t
	if err := syscall.Stat(dir, &root); err != nil {
		t.Fatal(err)
	}
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		total += st.Blocks * 512
		return nil
	})
	return total
}

// diskGone checks that nothing of the disk of the sandbox once in dir is
// left: no mount, no loop device, no image, no directory.
func diskGone(t *testing.T, dir string) {
	t.Helper()
	if m := mountsBelow(t, dir); len(m) > 0 {
		t.Errorf("mounts of the removed sandbox survive: %+v", m)
	}
	image := filepath.Join(dir, diskImageFile)
	if held := losetupHolds(t, image); len(held) > 0 {
		t.Errorf("loop devices still attached to the removed sandbox's image: %q", held)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox directory survives: %v", err)
	}
}

// diskMounted checks that the sandbox in dir has its disk: its image on
// a loop device (losetup says so), mounted at its mount directory, its
// writable directories bound out of it, nosuid and nodev. It returns the
// disk's device.
func diskMounted(t *testing.T, dir string) string {
	t.Helper()
	image := filepath.Join(dir, diskImageFile)
	if held := losetupHolds(t, image); len(held) != 1 {
		t.Fatalf("losetup -a lines for %s: %q, want one", image, held)
	}
	mounts := mountsBelow(t, dir)
	disk := lastMountAt(mounts, filepath.Join(dir, diskMountDir))
	if disk == nil || disk.fstype != "ext4" || loopdev.Backing(disk.source) != image {
		t.Fatalf("the sandbox's disk is not mounted: %+v", mounts)
	}
	for _, d := range diskDirs {
		m := lastMountAt(mounts, filepath.Join(dir, d.name))
		if m == nil || m.majmin != disk.majmin || m.root != "/"+d.name {
			t.Errorf("%s is not the disk's %s: %+v", d.name, d.name, m)
			continue
		}
		for _, o := range []string{"nosuid", "nodev"} {
			if !strings.Contains(","+m.opts+",", ","+o+",") {
				t.Errorf("%s is mounted %s, without %s", d.name, m.opts, o)
			}
		}
	}
	return disk.majmin
}

const (
	diskCap   = 64 << 20
	diskWrite = 200 << 20
)

// tenantManifest makes the workspace and a home a tenant's account's own,
// as a service's sessions are.
var tenantManifest = &manifest.Manifest{Users: []manifest.User{{Name: "tenant"}}, RunAs: "tenant",
	Entries: map[string]*manifest.Entry{"task.md": {Type: manifest.TypeFile, Content: []byte("fill the disk\n")}}}

// diskSandbox creates a sandbox of tenantManifest with caps r and deletes
// it when the test ends; it returns the session and its private directory.
func diskSandbox(t *testing.T, ctx context.Context, c *compute.Client, r Resources, ttl time.Duration) (*compute.Session, string) {
	t.Helper()
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: tenantManifest, TTL: ttl, ProviderOptions: &CreateOptions{Resources: r}})
	if err != nil {
		t.Fatalf("create a sandbox capped at %+v: %v", r, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, dir := sandboxState(t, s)
	return s, dir
}

// fillFails writes diskWrite bytes to path in the sandbox, which must fail
// for want of space, and removes what was written.
func fillFails(ctx context.Context, t *testing.T, s *compute.Session, path string) {
	t.Helper()
	out, errOut, code := shell(ctx, t, s, fmt.Sprintf(`head -c %d /dev/zero > "%s"; r=$?; echo "exit $r size $(wc -c < "%s")"; rm -f "%s"; exit $r`, diskWrite, path, path, path))
	t.Logf("writing %d bytes to %s under a disk cap of %d: %q %q exit %d", diskWrite, path, diskCap, out, truncate(errOut, 300), code)
	if code == 0 {
		t.Fatalf("a sandbox with a disk of %d bytes wrote %d into %s: %s", diskCap, diskWrite, path, out)
	}
	if !strings.Contains(errOut, "No space left on device") {
		t.Errorf("the failed write does not say ENOSPC: %q", errOut)
	}
}

// TestDiskCap: a sandbox with a disk cap of 64 MiB cannot write 200 MiB
// into its workspace nor its home (ENOSPC); what it wrote before is
// intact, the daemon answers, and the host's disk holds no more than the
// image. A replacement keeps the mounted disk, and mounts it again when it
// is gone (a reboot). Deleting it, or reaping or destroying it from a
// later harness after this one dropped it, leaves no mount, no loop
// device, no image, even while another sandbox started meanwhile (whose
// mount namespace holds copies of its mounts) runs.
func TestDiskCap(t *testing.T) {
	requireDisk(t)
	forIsolations(t, func(t *testing.T, iso Isolation, runscBin string) {
		ctx := testCtx(t)
		state := diskStateDir(t)
		c := capsClient(t, state, iso, runscBin)
		s, dir := diskSandbox(t, ctx, c, Resources{Disk: diskCap}, 0)
		image := filepath.Join(dir, diskImageFile)
		dev := diskMounted(t, dir)
		if fi, err := os.Stat(image); err != nil || fi.Size() != diskCap {
			t.Fatalf("image: %v, %v", fi, err)
		}

		out, errOut, code := shell(ctx, t, s, `head -c 1048576 /dev/urandom > before && sha256sum before && df -k . | tail -1`)
		if code != 0 {
			t.Fatalf("write a file: %q %q", out, errOut)
		}
		sum := strings.Fields(out)[0]
		t.Logf("before: %s", out)
		fillFails(ctx, t, s, "big")
		answers(ctx, t, s)
		if got, _, _ := shell(ctx, t, s, "sha256sum before"); !strings.HasPrefix(got, sum) {
			t.Errorf("the file written before the disk filled changed: %q, want %s", got, sum)
		}
		home, _, _ := shell(ctx, t, s, `echo "$HOME"`)
		if iso == IsolationNone {
			// A plain sandbox has no /home of its own: its homes are
			// where the daemon makes them.
			home = filepath.Join(dir, homeDir, "tenant")
		}
		fillFails(ctx, t, s, strings.TrimSpace(home)+"/big")
		if iso != IsolationNone {
			// /tmp is memory (bounded by the memory cap), not the host's disk.
			if fsType, _, _ := shell(ctx, t, s, "stat -f -c %T /tmp"); strings.TrimSpace(fsType) != "tmpfs" {
				t.Errorf("the sandbox's /tmp is %q, want tmpfs", fsType)
			}
		}
		var st syscall.Stat_t
		if err := syscall.Stat(image, &st); err != nil || st.Blocks*512 > diskCap {
			t.Errorf("the image takes %d bytes of the host's disk (%v), more than its size %d", st.Blocks*512, err, diskCap)
		}
		if n := hostBytes(t, dir); n > diskCap+2<<20 {
			t.Errorf("the sandbox's directory takes %d bytes of the host's disk, more than its disk of %d (and 2 MiB)", n, diskCap)
		}

		// A replacement (the daemon stopped, the session resumed) keeps
		// the mounted disk and what is on it.
		st1, _ := sandboxState(t, s)
		if err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		_ = s.Release()
		s, err := capsClient(t, state, iso, runscBin).Resume(ctx, st1)
		if err != nil {
			t.Fatalf("resume: %v", err)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := diskMounted(t, dir); got != dev {
			t.Errorf("the replacement's disk is device %s, want the kept %s", got, dev)
		}
		if got, _, _ := shell(ctx, t, s, "sha256sum before"); !strings.HasPrefix(got, sum) {
			t.Errorf("the replacement's workspace lost the file: %q", got)
		}
		// Its disk unmounted (a reboot): the next replacement mounts it
		// again, with what it holds, still capped.
		if err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		_ = s.Release()
		for _, pt := range []string{"workspace", homeDir, "etc", runDir, diskMountDir} {
			if err := unmountAll(filepath.Join(dir, pt)); err != nil {
				t.Fatal(err)
			}
		}
		if err := waitLoopsGone(image); err != nil {
			t.Fatal(err)
		}
		s, err = capsClient(t, state, iso, runscBin).Resume(ctx, st1)
		if err != nil {
			t.Fatalf("resume after the disk was unmounted: %v", err)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		diskMounted(t, dir)
		if got, _, _ := shell(ctx, t, s, "sha256sum before"); !strings.HasPrefix(got, sum) {
			t.Errorf("the remounted workspace lost the file: %q", got)
		}
		fillFails(ctx, t, s, "big")

		// Two more, dropped by this harness (as by a crash): one with a
		// lifetime that has passed (a later harness reaps it), one that
		// a later harness destroys.
		reaped, reapedDir := diskSandbox(t, ctx, c, Resources{Disk: diskCap}, time.Millisecond)
		_ = reaped.Release()
		destroyed, destroyedDir := diskSandbox(t, ctx, c, Resources{Disk: diskCap}, 0)
		destroyedState, _ := sandboxState(t, destroyed)
		if _, _, code := shell(ctx, t, destroyed, "echo x > kept"); code != 0 {
			t.Fatal("write into the workspace")
		}
		_ = destroyed.Release()
		diskMounted(t, reapedDir)
		diskMounted(t, destroyedDir)

		// A sandbox started now: bubblewrap's (and runsc's gofer's) mount
		// namespace starts as a copy of the host's, these disks included.
		other, err := c.Create(ctx, compute.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), other) })

		if err := c.Delete(ctx, s); err != nil {
			t.Fatal(err)
		}
		diskGone(t, dir)
		time.Sleep(5 * time.Millisecond)
		later := capsClient(t, state, iso, runscBin)
		got, err := later.Reap(ctx)
		if err != nil || len(got) != 1 || got[0].ID != filepath.Base(reapedDir) {
			t.Fatalf("reap: %+v, %v", got, err)
		}
		diskGone(t, reapedDir)
		p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: iso, Runsc: runscBin}, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Destroy(ctx, destroyedState.ProviderState); err != nil {
			t.Fatal(err)
		}
		diskGone(t, destroyedDir)
		answers(ctx, t, other)
	})
}

// TestDiskCapLaunchFailure: a launch that fails after its disk was made
// leaves nothing of it; a crash between recording a disk and making it
// (a record, no image) is finished by the next launch there.
func TestDiskCapLaunchFailure(t *testing.T) {
	requireDisk(t)
	ctx := testCtx(t)
	state := diskStateDir(t)
	p, err := New(Config{StateDir: state, AgentdPath: filepath.Join(t.TempDir(), "no-agentd"), Isolation: IsolationNone}, zap.NewNop())
	if err == nil {
		_, err = p.Launch(ctx, compute.LaunchSpec{SessionID: "fails", Options: &CreateOptions{Resources{Disk: diskCap}}})
	}
	if err == nil {
		t.Fatal("a launch without a daemon binary succeeded")
	}
	diskGone(t, filepath.Join(state, "fails"))

	dir := filepath.Join(state, "recorded")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(diskRecord{Size: diskCap})
	if err := os.WriteFile(filepath.Join(dir, diskRecordFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err = New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(providerState{Dir: dir})
	sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "recorded", Prior: st})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.Close()
	diskMounted(t, dir)
	if err := p.Destroy(ctx, st); err != nil {
		t.Fatal(err)
	}
	diskGone(t, dir)
}
