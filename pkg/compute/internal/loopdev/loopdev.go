// Package loopdev holds what the local and docker providers share to give
// a sandbox a disk of its own: an ext4 image made by mkfs.ext4
// (e2fsprogs), attached to a loop device with system calls
// (golang.org/x/sys/unix), and the loop devices backed by an image found
// in /sys/block. What each provider does with the device (mounts, volumes,
// records) stays in the provider. Errors name the sandbox disk and carry
// the compute error kinds; callers add their own prefix.
package loopdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Control is the loop control device, there when the host has loop devices.
const Control = "/dev/loop-control"

// mkfsTimeout bounds mkfs.ext4.
const mkfsTimeout = 2 * time.Minute

// sysBlock is where the kernel lists block devices (a seam for the tests).
var sysBlock = "/sys/block"

// FindMkfs returns the mkfs.ext4 program: the one on PATH, else the first
// of fallbacks (nil: /usr/sbin/mkfs.ext4, /sbin/mkfs.ext4) that is an
// executable file.
func FindMkfs(fallbacks []string) (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	if fallbacks == nil {
		fallbacks = []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}
	}
	for _, p := range fallbacks {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 is neither on PATH nor in /usr/sbin or /sbin (install e2fsprogs)")
}

// Missing says what this host lacks, besides a root process, to make a
// loop-device disk: mkfs.ext4 (looked for as FindMkfs(mkfsFallbacks)
// does) and loop devices. None is nothing missing.
func Missing(mkfsFallbacks []string) []string {
	var missing []string
	if _, err := FindMkfs(mkfsFallbacks); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := os.Stat(Control); err != nil {
		missing = append(missing, fmt.Sprintf("no loop devices (%v; `modprobe loop`, or a container given /dev/loop-control and /dev/loop*)", err))
	}
	return missing
}

// MakeExt4 creates image, which must not exist, as a sparse file of size
// bytes and makes an ext4 file system in it with no blocks reserved for
// root (the sandbox's root is not the host's administrator). mkfs.ext4 is
// found as FindMkfs(mkfsFallbacks) finds it; without it the error is
// compute.ErrFailedPrecondition. On failure the caller removes image.
func MakeExt4(ctx context.Context, image string, size int64, mkfsFallbacks []string) error {
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("sandbox disk image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sandbox disk image of %d bytes: %w", size, err)
	}
	mkfs, err := FindMkfs(mkfsFallbacks)
	if err != nil {
		return fmt.Errorf("%w: %w", compute.ErrFailedPrecondition, err)
	}
	ctx, cancel := context.WithTimeout(ctx, mkfsTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", "-m", "0", image).CombinedOutput(); err != nil {
		return fmt.Errorf("sandbox disk: %s: %w: %s", mkfs, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Attach attaches image to a free loop device and returns the device and
// an open descriptor of it, which the caller closes. With autoclear the
// kernel detaches the device when its last user lets go, so the caller
// closes the descriptor only once something else (a mount) holds the
// device; without, the device stays attached until Detach. No loop
// devices, or none free, is compute.ErrFailedPrecondition.
func Attach(image string, autoclear bool) (string, *os.File, error) {
	ctl, err := os.OpenFile(Control, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("%w: sandbox disk: %w", compute.ErrFailedPrecondition, err)
	}
	defer ctl.Close()
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("sandbox disk: %w", err)
	}
	defer img.Close()
	var info unix.LoopInfo64
	if autoclear {
		info.Flags = unix.LO_FLAGS_AUTOCLEAR
	}
	copy(info.File_name[:len(info.File_name)-1], image)
	// Another process may take the free device between the two calls:
	// then ask again.
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("%w: sandbox disk: no free loop device: %w", compute.ErrFailedPrecondition, err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", nil, fmt.Errorf("%w: sandbox disk: loop device %s: %w (its device node must exist: devtmpfs, or mknod in a container)", compute.ErrFailedPrecondition, dev, err)
		}
		err = unix.IoctlLoopConfigure(int(f.Fd()), &unix.LoopConfig{Fd: uint32(img.Fd()), Info: info})
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			// Before Linux 5.8: attach, then set the flags.
			if err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_FD, int(img.Fd())); err == nil {
				if err = unix.IoctlLoopSetStatus64(int(f.Fd()), &info); err != nil {
					_ = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
				}
			}
		}
		if errors.Is(err, unix.EBUSY) {
			f.Close()
			continue
		}
		if err != nil {
			f.Close()
			return "", nil, fmt.Errorf("sandbox disk: attach %s to %s: %w", image, dev, err)
		}
		return dev, f, nil
	}
	return "", nil, fmt.Errorf("%w: sandbox disk: every free loop device was taken before it could be used", compute.ErrFailedPrecondition)
}

// Detach detaches the loop device dev, or, while it is in use, marks it
// to be detached when its last user lets go. A device already detached is
// no error.
func Detach(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandbox disk: %w", err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("sandbox disk: detach %s: %w", dev, err)
	}
	return nil
}

// BackedBy lists, sorted, the loop devices whose backing file is image.
func BackedBy(image string) []string {
	var out []string
	ents, _ := filepath.Glob(filepath.Join(sysBlock, "loop*"))
	for _, e := range ents {
		if dev := "/dev/" + filepath.Base(e); Backing(dev) == image {
			out = append(out, dev)
		}
	}
	slices.Sort(out)
	return out
}

// Backing returns the backing file of a loop device (/dev/loopN), ""
// when it is none or has none.
func Backing(dev string) string {
	name, ok := strings.CutPrefix(dev, "/dev/")
	if !ok || !strings.HasPrefix(name, "loop") || strings.Contains(name, "/") {
		return ""
	}
	data, err := os.ReadFile(filepath.Join(sysBlock, name, "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
}
