package docker

// Disk caps (Config.Disk, CreateOptions.Disk). Docker caps a container's
// writable layer with --storage-opt size= only on some storage drivers
// (overlay2 over xfs mounted with pquota, btrfs, zfs, devicemapper), and a
// volume, where the workspace lives, never. So a capped sandbox gets:
//
//   - its workspace volume on a file system of the cap's size of its own:
//     an ext4 image (sparse: it takes host blocks only as the sandbox
//     writes) under <StateDir>/disks, attached to a loop device, and a
//     volume of the engine's local driver mounting that device
//     (type=ext4, device=/dev/loopN). Past the cap a write in the
//     workspace fails with ENOSPC. This works on any storage driver, and
//     needs a root harness on the engine's host (as the run directory's
//     bind mount does), mkfs.ext4 and loop devices;
//   - on a storage driver with quotas, also the cap on its writable layer
//     (/tmp, the homes, the accounts). On other drivers (overlay2 over
//     ext4, fuse-overlayfs, vfs) the layer has no cap: the workspace is
//     capped, the rest of the container's file system is not, and Launch
//     logs that once per sandbox. A sandbox whose workspace is in the
//     container's layer (WorkspaceInContainer) is refused a cap there
//     (ErrFailedPrecondition naming the driver), rather than run uncapped.
//
// The loop device is attached without AUTOCLEAR: the engine unmounts the
// volume whenever the container stops, and mounts it again at its next
// start. Destroy (DeleteAll) removes the volume, detaches every loop
// device backed by the image and removes the image; a kept volume whose
// loop device went (a host reboot) is given a new one at the next Launch.
// The tmpfs alternative is memory, not disk, and is not used.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/loopdev"
)

// MinDisk is the smallest disk cap: room for ext4's metadata and journal
// and a workspace worth the name.
const MinDisk = 16 << 20

// Labels of a capped workspace volume.
const (
	// LabelDiskImage is the ext4 image behind a capped workspace volume.
	LabelDiskImage = labelPrefix + "disk-image"
	// LabelDiskBytes is its size.
	LabelDiskBytes = labelPrefix + "disk-bytes"
)

const (
	disksDir       = "disks"
	debugfsTimeout = 2 * time.Minute
)

// quotaDrivers are the storage drivers whose containers take
// --storage-opt size= (overlay2 only over xfs: see layerQuota).
var quotaDrivers = []string{"overlay2", "btrfs", "zfs", "devicemapper"}

// layerQuota reports whether an engine with this storage driver and
// driver status can cap a container's writable layer, and if not, a
// description of what it has for an error or a log.
func layerQuota(driver string, status [][2]string) (bool, string) {
	backing := ""
	for _, kv := range status {
		if kv[0] == "Backing Filesystem" {
			backing = kv[1]
		}
	}
	have := "storage driver " + driver
	if backing != "" {
		have += " over " + backing
	}
	if !slices.Contains(quotaDrivers, driver) || (driver == "overlay2" && backing != "xfs") {
		return false, have
	}
	return true, have
}

// diskPlan is how Launch caps one sandbox's disk.
type diskPlan struct {
	size       int64
	layerQuota bool // also --storage-opt size= on the container
}

// planDisk decides how to cap a sandbox's disk of size bytes, or refuses
// (ErrFailedPrecondition naming what this host lacks).
func (p *Provider) planDisk(ctx context.Context, size int64) (diskPlan, error) {
	plan := diskPlan{size: size}
	info, err := p.docker.Info(ctx, client.InfoOptions{})
	if err != nil {
		return plan, p.apiErr("info", err)
	}
	ok, have := layerQuota(info.Info.Driver, info.Info.DriverStatus)
	plan.layerQuota = ok
	if p.cfg.Workspace == WorkspaceInContainer {
		if !ok {
			return plan, fmt.Errorf("docker: %w: a disk cap of a sandbox whose workspace is in the container's layer needs a storage driver with size quotas (overlay2 over xfs mounted with pquota, btrfs, zfs, devicemapper); this engine has %s: keep the workspace on a volume (WorkspaceOnVolume), which is capped on any driver",
				compute.ErrFailedPrecondition, have)
		}
		return plan, nil
	}
	if err := checkLoopDisk(); err != nil {
		return plan, fmt.Errorf("docker: %w: the sandbox disk cap puts the workspace volume on an ext4 file system of its own on a loop device, which cannot be done here: %s",
			compute.ErrFailedPrecondition, err)
	}
	if !ok {
		p.log.Info("disk cap: the workspace is capped; the container's writable layer is not (its storage driver has no size quotas)",
			zap.String("engine", have), zap.Int64("disk_bytes", size))
	}
	return plan, nil
}

// checkLoopDisk says what this process lacks to make a loop-device disk,
// nil when nothing.
func checkLoopDisk() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "the harness is not root (only root attaches loop devices)")
	}
	missing = append(missing, loopdev.Missing(nil)...)
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
	}
	return nil
}

// diskImage is where the image of a capped workspace volume lives.
func (p *Provider) diskImage(volName string) string {
	return filepath.Join(p.cfg.StateDir, disksDir, volName+".img")
}

// createDiskVolume makes the ext4 image of size bytes, attaches it and
// creates the volume volName mounting it; on failure it leaves nothing.
func (p *Provider) createDiskVolume(ctx context.Context, volName string, size int64, labels map[string]string) error {
	image := p.diskImage(volName)
	if err := makeDiskImage(ctx, image, size); err != nil {
		_ = os.Remove(image)
		return err
	}
	dev, err := attachLoop(image)
	if err == nil {
		err = p.createLoopVolume(ctx, volName, dev, image, size, labels)
	}
	if err != nil {
		if rerr := releaseImage(image); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	}
	return nil
}

// createLoopVolume creates the local-driver volume volName mounting the
// ext4 file system on dev.
func (p *Provider) createLoopVolume(ctx context.Context, volName, dev, image string, size int64, labels map[string]string) error {
	l := make(map[string]string, len(labels)+2)
	for k, v := range labels {
		l[k] = v
	}
	l[LabelDiskImage] = image
	l[LabelDiskBytes] = strconv.FormatInt(size, 10)
	_, err := p.docker.VolumeCreate(ctx, client.VolumeCreateOptions{Name: volName, Driver: "local", Labels: l,
		DriverOpts: map[string]string{"type": "ext4", "device": dev, "o": "nosuid,nodev"}})
	if err != nil {
		return p.apiErr("create volume "+volName, err)
	}
	return nil
}

// reviveDiskVolume gives a kept capped volume whose loop device is gone
// (a host reboot) or backs another file a new one: the volume is made
// again over the same image (its data is in the image).
func (p *Provider) reviveDiskVolume(ctx context.Context, volName string, labels, opts map[string]string) error {
	image := labels[LabelDiskImage]
	if image == "" {
		return nil // not a capped volume
	}
	if loopdev.Backing(opts["device"]) == image {
		return nil
	}
	size, _ := strconv.ParseInt(labels[LabelDiskBytes], 10, 64)
	if _, err := os.Stat(image); err != nil {
		return fmt.Errorf("docker: %w: the disk image of workspace volume %s: %v", compute.ErrNotFound, volName, err)
	}
	p.log.Info("the capped workspace volume lost its loop device; attaching its image again", zap.String("volume", volName))
	if _, err := p.docker.VolumeRemove(ctx, volName, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
		return p.apiErr("remove volume "+volName, err)
	}
	dev, err := attachLoop(image)
	if err != nil {
		return err
	}
	kept := make(map[string]string, len(labels))
	for k, v := range labels {
		if k != LabelDiskImage && k != LabelDiskBytes {
			kept[k] = v
		}
	}
	if err := p.createLoopVolume(ctx, volName, dev, image, size, kept); err != nil {
		_ = detachLoops(image)
		return err
	}
	return nil
}

// removeDiskVolume removes a workspace volume and, when it is capped (its
// image is under StateDir/disks, or named by its label), its loop devices
// and image. A volume already gone still has its image released.
func (p *Provider) removeDiskVolume(ctx context.Context, volName string) error {
	image := p.diskImage(volName)
	res, err := p.docker.VolumeInspect(ctx, volName, client.VolumeInspectOptions{})
	switch {
	case err == nil:
		if l := res.Volume.Labels[LabelDiskImage]; l != "" {
			image = l
		}
		if _, err := p.docker.VolumeRemove(ctx, volName, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
			return p.apiErr("remove volume "+volName, err)
		}
	case !cerrdefs.IsNotFound(err):
		return p.apiErr("inspect volume "+volName, err)
	}
	return releaseImage(image)
}

// makeDiskImage creates a sparse ext4 image of size bytes with an empty root
// (no lost+found, which would show in the workspace).
func makeDiskImage(ctx context.Context, image string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return fmt.Errorf("docker: sandbox disk: %w", err)
	}
	if err := loopdev.MakeExt4(ctx, image, size, nil); err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, debugfsTimeout)
	defer cancel()
	if debugfs, err := exec.LookPath("debugfs"); err == nil {
		_ = exec.CommandContext(ctx, debugfs, "-w", "-R", "rmdir lost+found", image).Run()
	} else if _, err := os.Stat("/usr/sbin/debugfs"); err == nil {
		_ = exec.CommandContext(ctx, "/usr/sbin/debugfs", "-w", "-R", "rmdir lost+found", image).Run()
	}
	return nil
}

// attachLoop attaches image to a free loop device (no AUTOCLEAR: see the
// file's comment) and returns the device.
func attachLoop(image string) (string, error) {
	dev, f, err := loopdev.Attach(image, false)
	if err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	f.Close()
	return dev, nil
}

// releaseImage detaches the loop devices backed by image and removes it.
func releaseImage(image string) error {
	if err := detachLoops(image); err != nil {
		return err
	}
	if err := os.Remove(image); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("docker: sandbox disk: %w", err)
	}
	return nil
}

// detachLoops detaches every loop device backed by image. One still
// mounted (the engine unmounts a volume when it removes it, so only
// something else's mount) is marked to go when it is unmounted.
func detachLoops(image string) error {
	var errs []error
	for _, dev := range loopdev.BackedBy(image) {
		if err := loopdev.Detach(dev); err != nil {
			errs = append(errs, fmt.Errorf("docker: %w", err))
		}
	}
	return errors.Join(errs...)
}
