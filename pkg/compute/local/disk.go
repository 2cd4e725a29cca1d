package local

// Disk caps: a local sandbox with Resources.Disk writes to the host's disk
// only through a file system of that size of its own: an ext4 image in
// its private directory (disk.img, sparse: it takes host blocks only as
// the sandbox writes), on a loop device, mounted nosuid,nodev at
// <dir>/disk (which the sandbox never sees). Every directory of the
// private directory a sandbox can write to is a directory of that file
// system, bind-mounted at its usual path before anything is written there:
// the workspace, the homes (also the sandbox's /home), the private etc (its
// accounts) and the run directory (its socket). Past the cap a write fails
// with ENOSPC, in the sandbox only. Bubblewrap and gVisor bind those paths
// as before (runsc's gofer opens them on the host, through the mounts);
// plain sandboxes use them as they are. The sandbox's /tmp, /run and /dev
// are tmpfs (bubblewrap's in the host kernel, gVisor's in the sentry):
// memory, not disk, charged to the sandbox's memory cgroup and so bounded
// by its memory cap (serve always sets one). A plain sandbox
// (IsolationNone) also writes where the host lets its account, its /tmp
// among them: the disk cap bounds its private directories only.
//
// The size is the file system's: ext4's own metadata and journal take
// some of it (about 12% of 64 MiB, 2% of 10 GiB), and no blocks are
// reserved for root.
//
// It is done with system calls (golang.org/x/sys/unix): LOOP_CTL_GET_FREE
// and LOOP_CONFIGURE (LOOP_SET_FD and LOOP_SET_STATUS64 before Linux 5.8)
// attach the image with LO_FLAGS_AUTOCLEAR, mount(2) mounts it and binds
// its directories, umount2(2) undoes them: no dependence on util-linux's
// mount or losetup, and errors that are the kernel's own. Only the file
// system is made by a program, mkfs.ext4 (e2fsprogs), which must be on
// PATH or in /usr/sbin or /sbin. With AUTOCLEAR the kernel detaches the
// loop device when its last user lets go: a harness that dies between
// attaching and mounting leaves none, and unmounting the file system is
// what releases it.
//
// Mounts outlive the harness process, as the sandbox does. The private
// directory records the disk (diskRecordFile, written before the image
// exists); whoever removes the directory (Destroy, from Delete or Reap, a
// later harness's included, or a launch that failed) unmounts what is
// mounted at the disk's paths, removes the mount points (which also
// detaches the copies bubblewrap sandboxes started meanwhile hold in their
// mount namespaces, so the loop device is released), waits until no loop
// device is backed by the image and only then removes the image and the
// record. A replacement of the sandbox (resume after its daemon died, a
// rebuild) keeps the mounted disk, and mounts it again if it is not
// mounted (a host reboot), with the size it was made with.
//
// Needs a root harness, mkfs.ext4 and loop devices (/dev/loop-control);
// without them a disk cap is refused (compute.ErrFailedPrecondition
// naming what is missing), never dropped.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/loopdev"
)

// MinDisk is the smallest disk cap: room for ext4's metadata and journal
// and a workspace worth the name.
const MinDisk = 16 << 20

// maxDisk bounds a disk cap (ext4 with 4 KiB blocks: 16 TiB per file on
// most host file systems).
const maxDisk = 16 << 40

// Files of a private directory with a disk cap.
const (
	diskRecordFile = "disk.json" // the record: the disk exists, its size
	diskImageFile  = "disk.img"  // the ext4 image
	diskMountDir   = "disk"      // where the image is mounted (never seen by the sandbox)
)

// diskDirs are the directories of a private directory that the sandbox
// can write to, which a disk cap puts on its file system, with the modes
// Launch gives them.
var diskDirs = []struct {
	name string
	mode fs.FileMode
}{{"workspace", 0o711}, {homeDir, 0o711}, {"etc", 0o755}, {runDir, 0o711}}

// diskRecord is the private directory's record of its disk.
type diskRecord struct {
	// Size is the image's size in bytes.
	Size int64 `json:"size"`
}

// Seams for the tests: the effective uid and where mkfs.ext4 is looked
// for besides PATH (nil: /usr/sbin and /sbin).
var (
	diskEUID      = os.Geteuid
	mkfsFallbacks []string
)

const (
	unmountTimeout  = 5 * time.Second  // for a busy mount to be let go
	loopGoneTimeout = 60 * time.Second // for the kernel to detach a loop device (a sandbox's mount namespace goes after its last process, later on a loaded machine)
)

// checkDiskCap reports whether this process can give sandboxes disks of
// their own: nil, or compute.ErrFailedPrecondition naming what is missing.
func checkDiskCap() error {
	var missing []string
	if diskEUID() != 0 {
		missing = append(missing, "it mounts a file system of the sandbox's own on a loop device, which only a root harness may")
	}
	missing = append(missing, loopdev.Missing(mkfsFallbacks)...)
	if len(missing) > 0 {
		return fmt.Errorf("%w: the local sandbox disk cap cannot be applied here: %s", compute.ErrFailedPrecondition, strings.Join(missing, "; "))
	}
	return nil
}

// readDiskRecord returns dir's disk record, nil when there is none.
func readDiskRecord(dir string) (*diskRecord, error) {
	data, err := os.ReadFile(filepath.Join(dir, diskRecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the sandbox's disk record: %w", err)
	}
	var r diskRecord
	if err := json.Unmarshal(data, &r); err != nil || r.Size < MinDisk || r.Size > maxDisk {
		return nil, fmt.Errorf("the sandbox's disk record %s is not one (%q)", filepath.Join(dir, diskRecordFile), bytes.TrimSpace(data))
	}
	return &r, nil
}

// setupDisk gives the sandbox in dir the disk of its cap (size bytes, 0:
// none asked for), before Launch writes into its directories, and returns
// whether the workspace is still kept (kept: Launch keeps it). A sandbox
// that has a disk keeps it, mounting it again when it is not mounted,
// whatever size is asked now. One that has none and is given one cannot
// keep what its directories hold (it would have to fit): its workspace,
// accounts and homes start afresh, and the session restores its workspace
// from its snapshot. On failure nothing of a new disk is left.
func (p *Provider) setupDisk(dir string, size int64, kept bool) (bool, error) {
	rec, err := readDiskRecord(dir)
	if err != nil {
		return kept, err
	}
	if rec == nil && size == 0 {
		if _, err := os.Lstat(filepath.Join(dir, diskMountDir)); err == nil {
			// Left by a disk whose record went first: remove it all.
			if err := releaseDisk(dir); err != nil {
				return kept, err
			}
		}
		return kept, nil
	}
	if err := checkDiskCap(); err != nil {
		return kept, err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return kept, fmt.Errorf("sandbox disk: %w", err)
	}
	if rec != nil {
		if size > 0 && size != rec.Size {
			p.log.Info("the sandbox keeps the disk it was made with", zap.String("dir", dir), zap.Int64("disk_bytes", rec.Size), zap.Int64("asked_bytes", size))
		}
		if _, err := os.Stat(filepath.Join(real, diskImageFile)); err == nil {
			return kept, mountDisk(real)
		}
		// Recorded, never made (a harness died first): made now.
		if err := releaseDisk(real); err != nil {
			return kept, err
		}
		size = rec.Size
	}
	if kept {
		p.log.Warn("the sandbox being replaced has no disk of its own yet; it gets one, and its workspace, accounts and homes are not kept", zap.String("dir", dir))
		kept = false
	}
	for _, d := range diskDirs {
		if err := removeTree(filepath.Join(real, d.name)); err != nil {
			return kept, fmt.Errorf("sandbox disk: %w", err)
		}
	}
	if err := makeDisk(real, size); err != nil {
		if rerr := releaseDisk(real); rerr != nil {
			err = errors.Join(err, fmt.Errorf("and its remains could not be removed: %w", rerr))
		}
		return kept, err
	}
	return kept, nil
}

// makeDisk records, creates and mounts a disk of size bytes for the
// sandbox in dir (a resolved path).
func makeDisk(dir string, size int64) error {
	data, _ := json.Marshal(diskRecord{Size: size})
	if err := writeFileAtomic(filepath.Join(dir, diskRecordFile), data, 0o600); err != nil {
		return fmt.Errorf("record the sandbox's disk: %w", err)
	}
	if err := loopdev.MakeExt4(context.Background(), filepath.Join(dir, diskImageFile), size, mkfsFallbacks); err != nil {
		return err
	}
	return mountDisk(dir)
}

// mountDisk mounts the disk image of the sandbox in dir (a resolved path)
// at its mount directory and binds its directories at their paths, doing
// only what is not done yet.
func mountDisk(dir string) error {
	at, image := filepath.Join(dir, diskMountDir), filepath.Join(dir, diskImageFile)
	if err := os.MkdirAll(at, 0o700); err != nil {
		return fmt.Errorf("sandbox disk: %w", err)
	}
	mounts, err := readMounts()
	if err != nil {
		return err
	}
	disk := lastMountAt(mounts, at)
	switch {
	case disk == nil:
		if err := mountImage(image, at); err != nil {
			return err
		}
		if mounts, err = readMounts(); err != nil {
			return err
		}
		if disk = lastMountAt(mounts, at); disk == nil {
			return fmt.Errorf("sandbox disk: %s is not in the mount table after mounting it", at)
		}
	case disk.fstype != "ext4" || loopdev.Backing(disk.source) != image:
		return fmt.Errorf("sandbox disk: %s is mounted (%s %s), but not from %s", at, disk.fstype, disk.source, image)
	}
	// The file system's root is the harness's alone: the sandbox sees
	// only the directories bound out of it.
	if err := os.Chmod(at, 0o700); err != nil {
		return fmt.Errorf("sandbox disk: %w", err)
	}
	for _, d := range diskDirs {
		src, dst := filepath.Join(at, d.name), filepath.Join(dir, d.name)
		if err := os.Mkdir(src, d.mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("sandbox disk: %w", err)
		}
		if err := os.Mkdir(dst, d.mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("sandbox disk: %w", err)
		}
		if m := lastMountAt(mounts, dst); m != nil {
			if m.majmin == disk.majmin && m.root == "/"+d.name {
				continue
			}
			return fmt.Errorf("sandbox disk: %s is mounted (%s %s), but not from the sandbox's disk", dst, m.fstype, m.source)
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("sandbox disk: bind %s: %w", dst, err)
		}
		// A bind takes its source's flags; said again, should a kernel not.
		if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("sandbox disk: nosuid,nodev on %s: %w", dst, err)
		}
	}
	return nil
}

// mountImage attaches image to a free loop device, with AUTOCLEAR, and
// mounts its ext4 file system at at (nosuid, nodev; discard, so that the
// host gets back the blocks of files the sandbox removes).
func mountImage(image, at string) error {
	dev, f, err := loopdev.Attach(image, true)
	if err != nil {
		return err
	}
	// Closed after the mount holds the device (or it failed: AUTOCLEAR
	// then detaches it on this close).
	defer f.Close()
	if err := unix.Mount(dev, at, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "discard"); err != nil {
		return fmt.Errorf("sandbox disk: mount %s (%s) at %s: %w", image, dev, at, err)
	}
	return nil
}

// releaseDisk removes the disk of the sandbox in dir, if it has one: it
// unmounts its directories and its file system, removes their mount
// points (which detaches the copies other sandboxes' mount namespaces
// hold), waits until no loop device is backed by its image (detaching
// any that nothing holds) and removes the image and the record, in that
// order, so that a failure leaves the record for a later attempt. The
// sandbox's processes must have ended.
func releaseDisk(dir string) error {
	_, rerr := os.Lstat(filepath.Join(dir, diskRecordFile))
	_, merr := os.Lstat(filepath.Join(dir, diskMountDir))
	if rerr != nil && merr != nil {
		return nil
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("sandbox disk: %w", err)
	}
	var points []string
	for _, d := range diskDirs {
		points = append(points, filepath.Join(real, d.name))
	}
	points = append(points, filepath.Join(real, diskMountDir)) // last: the binds hold it
	for _, pt := range points {
		if err := unmountAll(pt); err != nil {
			return err
		}
	}
	for _, pt := range points {
		if err := os.RemoveAll(pt); err != nil {
			return fmt.Errorf("sandbox disk: %w", err)
		}
	}
	image := filepath.Join(real, diskImageFile)
	if err := waitLoopsGone(image); err != nil {
		return err
	}
	for _, f := range []string{image, filepath.Join(real, diskRecordFile)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sandbox disk: %w", err)
		}
	}
	return nil
}

// unmountAll unmounts whatever is mounted at path, as many times as it is
// mounted there; a mount still busy after unmountTimeout is detached
// lazily (its loop device then goes when its last user does).
func unmountAll(path string) error {
	deadline := time.Now().Add(unmountTimeout)
	for {
		mounts, err := readMounts()
		if err != nil {
			return err
		}
		if lastMountAt(mounts, path) == nil {
			return nil
		}
		flags := unix.UMOUNT_NOFOLLOW
		if time.Now().After(deadline) {
			flags |= unix.MNT_DETACH
		}
		err = unix.Unmount(path, flags)
		switch {
		case err == nil:
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EINVAL): // busy; or gone meanwhile
			if time.Now().After(deadline.Add(unmountTimeout)) {
				return fmt.Errorf("sandbox disk: unmount %s: %w", path, err)
			}
			time.Sleep(20 * time.Millisecond)
		default:
			return fmt.Errorf("sandbox disk: unmount %s: %w", path, err)
		}
	}
}

// waitLoopsGone waits until no loop device is backed by image, detaching
// the ones that no mount holds any more (AUTOCLEAR does, but may lag).
func waitLoopsGone(image string) error {
	deadline := time.Now().Add(loopGoneTimeout)
	cleared := false
	for {
		devs := loopdev.BackedBy(image)
		if len(devs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox disk: loop device %s still holds %s %s after its file system was unmounted (something still uses it)",
				strings.Join(devs, ", "), image, loopGoneTimeout)
		}
		if !cleared && time.Now().After(deadline.Add(-loopGoneTimeout/2)) {
			for _, dev := range devs {
				_ = loopdev.Detach(dev)
			}
			cleared = true
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct {
	majmin string // the file system's device
	root   string // the directory of the file system mounted
	point  string
	opts   string // per-mount options
	fstype string
	source string
}

// readMounts reads this process's mount table.
func readMounts() ([]mountEntry, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return parseMountinfo(data), nil
}

// parseMountinfo parses a /proc/<pid>/mountinfo text.
func parseMountinfo(data []byte) []mountEntry {
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - type source super-options
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, mountEntry{majmin: fields[2], root: unescapeMountinfo(fields[3]), point: unescapeMountinfo(fields[4]),
			opts: fields[5], fstype: fields[sep+1], source: unescapeMountinfo(fields[sep+2])})
	}
	return out
}

// lastMountAt returns the topmost mount at point, nil when there is none.
func lastMountAt(mounts []mountEntry, point string) *mountEntry {
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].point == point {
			return &mounts[i]
		}
	}
	return nil
}
