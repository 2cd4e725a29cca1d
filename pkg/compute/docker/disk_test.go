package docker

import (
	"errors"
	"os"
	"strings"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/loopdev"
)

// needLoopDisk skips (or fails under CI=true) a test that needs what a
// capped workspace volume needs.
func needLoopDisk(t *testing.T) {
	t.Helper()
	needDocker(t)
	err := checkLoopDisk()
	testenv.Require(t, testenv.Condition(err == nil, "a loop-device disk cap: "+errString(err)))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// fillPast writes more than a 32 MiB cap into dir of the sandbox and
// returns the command's exit code and stderr.
func fillPast(t *testing.T, sb compute.Sandbox, dir string) (int, string) {
	t.Helper()
	res, err := sb.Agent().Exec(testCtx(t), compute.ProcessSpec{Argv: []string{"/bin/sh", "-c",
		"dd if=/dev/zero of=" + dir + "/big bs=1M count=64 2>&1 >/dev/null; s=$?; sync; exit $s"}}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	return res.Exit.ExitCode, string(res.Stdout) + string(res.Stderr)
}

func TestDiskCapWorkspaceVolume(t *testing.T) {
	t.Parallel()
	needLoopDisk(t)
	keep := newProvider(t, func(c *Config) { c.DeletePolicy = DeleteContainer })
	opts := &CreateOptions{Disk: 32 << 20}
	session := sessionID(t)
	first := launch(t, keep, compute.LaunchSpec{SessionID: session, Options: opts})
	st := mustDecode(t, mustState(t, first))
	vol, err := keep.API().VolumeInspect(testCtx(t), st.Volume, client.VolumeInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := vol.Volume.Labels[LabelDiskImage]
	if vol.Volume.Options["type"] != "ext4" || image == "" || loopdev.Backing(vol.Volume.Options["device"]) != image {
		t.Fatalf("workspace volume of a capped sandbox: options %v, labels %v", vol.Volume.Options, vol.Volume.Labels)
	}
	if ls := run(t, first.Agent(), "", "ls -A ."); strings.TrimSpace(ls) != "" {
		t.Fatalf("a fresh capped workspace is not empty: %q", ls)
	}

	code, out := fillPast(t, first, ".")
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("writing 64 MiB into a 32 MiB workspace: exit %d, %q", code, out)
	}
	run(t, first.Agent(), "", "rm big && echo kept > kept.txt")

	// A replacement keeps the volume and its cap.
	prior := mustState(t, first)
	_ = first.Close()
	if err := keep.Destroy(testCtx(t), prior); err != nil {
		t.Fatal(err)
	}
	second := launch(t, keep, compute.LaunchSpec{SessionID: session, Prior: prior, Options: opts})
	if got := readFile(t, second.Agent(), "kept.txt"); got != "kept\n" || !second.WorkspaceKept() {
		t.Fatalf("the replacement's workspace: %q, kept %v", got, second.WorkspaceKept())
	}
	if code, out := fillPast(t, second, "."); code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("the replacement is not capped: exit %d, %q", code, out)
	}

	// Destroy under DeleteAll leaves no volume, loop device or image.
	raw := mustState(t, second)
	_ = second.Close()
	all := newProvider(t, func(c *Config) { c.StateDir = keep.Config().StateDir })
	if err := all.Destroy(testCtx(t), raw); err != nil {
		t.Fatal(err)
	}
	if _, err := all.API().VolumeInspect(testCtx(t), st.Volume, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("volume after Destroy: %v", err)
	}
	if devs := loopdev.BackedBy(image); len(devs) > 0 {
		t.Fatalf("loop devices left after Destroy: %v", devs)
	}
	if _, err := os.Stat(image); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("disk image after Destroy: %v", err)
	}
}

func TestDiskCapFailedLaunchLeavesNothing(t *testing.T) {
	t.Parallel()
	needLoopDisk(t)
	p := newProvider(t, func(c *Config) { c.AgentdPath = "/nonexistent/agentd" })
	session := sessionID(t)
	if _, err := p.Launch(testCtx(t), compute.LaunchSpec{SessionID: session, Options: &CreateOptions{Disk: 32 << 20}}); err == nil {
		t.Fatal("Launch with a missing daemon succeeded")
	}
	image := p.diskImage(VolumeName(session))
	if _, err := p.API().VolumeInspect(testCtx(t), VolumeName(session), client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("volume after a failed Launch: %v", err)
	}
	if devs := loopdev.BackedBy(image); len(devs) > 0 {
		t.Fatalf("loop devices after a failed Launch: %v", devs)
	}
	if _, err := os.Stat(image); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("disk image after a failed Launch: %v", err)
	}
}

// TestDiskCapInContainerLayer: a workspace in the container's layer is
// capped with --storage-opt size= where the engine's storage driver can,
// and refused (not run uncapped) where it cannot.
func TestDiskCapInContainerLayer(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(c *Config) { c.Workspace = WorkspaceInContainer })
	info, err := p.API().Info(testCtx(t), client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quota, have := layerQuota(info.Info.Driver, info.Info.DriverStatus)
	opts := &CreateOptions{Disk: 32 << 20}
	if quota {
		sb := launch(t, p, compute.LaunchSpec{Options: opts})
		if code, out := fillPast(t, sb, "."); code == 0 || !strings.Contains(out, "No space left on device") {
			t.Fatalf("writing past the cap of the container's layer (%s): exit %d, %q", have, code, out)
		}
		return
	}
	_, err = p.Launch(testCtx(t), compute.LaunchSpec{SessionID: sessionID(t), Options: opts})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), have) {
		t.Fatalf("a disk cap this engine (%s) cannot apply: %v", have, err)
	}
	list, err := p.List(testCtx(t))
	if err != nil || len(list) != 0 {
		t.Fatalf("after a refused cap: %v, %v", list, err)
	}
}

func TestLayerQuota(t *testing.T) {
	for _, c := range []struct {
		driver, backing string
		want            bool
	}{
		{"overlay2", "xfs", true}, {"overlay2", "extfs", false}, {"fuse-overlayfs", "", false},
		{"btrfs", "btrfs", true}, {"zfs", "", true}, {"vfs", "extfs", false},
	} {
		status := [][2]string{{"Backing Filesystem", c.backing}}
		got, have := layerQuota(c.driver, status)
		if got != c.want || !strings.Contains(have, c.driver) {
			t.Errorf("layerQuota(%s over %s) = %v, %q", c.driver, c.backing, got, have)
		}
	}
}

func TestDiskCapSettings(t *testing.T) {
	c, err := Config{StateDir: t.TempDir()}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.settings(&CreateOptions{Disk: 1 << 20}); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("a 1 MiB disk cap: %v", err)
	}
	c.Disk = 1 << 30
	s, err := c.settings(&CreateOptions{Disk: -1})
	if err != nil || s.disk != 0 {
		t.Fatalf("CreateOptions.Disk -1 over Config.Disk: %d, %v", s.disk, err)
	}
	if s, _ := c.settings(nil); s.disk != 1<<30 {
		t.Fatalf("Config.Disk: %d", s.disk)
	}
}
