package archive

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// errMountPoint refuses to remove what lies on another mount.
var errMountPoint = errors.New("a mount point lies below; its contents were not removed")

// removeAt removes name in dirfd, a directory on mount mnt.
func removeAt(dirfd int, name string, mnt mountInfo) error {
	m, err := statMount(dirfd, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if !m.isDir {
		err := ignoreEINTR(func() error { return unix.Unlinkat(dirfd, name, 0) })
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if m.mountedBelow(mnt) {
		return errMountPoint
	}
	fd, err := openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.EACCES) {
		_ = unix.Fchmodat(dirfd, name, 0o700, 0)
		fd, err = openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	}
	if err != nil {
		return err
	}
	dir := os.NewFile(uintptr(fd), name)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	var first error
	for i, n := range names {
		err := removeAt(fd, n, m)
		if errors.Is(err, unix.EACCES) && i == 0 {
			// No write permission on the directory: grant it and retry.
			_ = unix.Fchmod(fd, 0o700)
			err = removeAt(fd, n, m)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("%s/%s: %w", name, n, err)
		}
	}
	if first != nil {
		return first
	}
	return ignoreEINTR(func() error { return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) })
}
