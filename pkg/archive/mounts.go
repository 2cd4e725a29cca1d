package archive

import (
	"errors"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// mountInfo identifies the mount an entry belongs to, as well as the
// kernel tells: the mount id when statx reports it (Linux 5.8), else the
// device (which cannot tell a bind mount of the same filesystem apart).
type mountInfo struct {
	root   bool // the entry is the root of a mount (STATX_ATTR_MOUNT_ROOT)
	known  bool // root is meaningful
	mntID  uint64
	hasID  bool
	devMaj uint32
	devMin uint32
	isDir  bool
}

// statMount describes name in dirfd (the directory itself with name "").
func statMount(dirfd int, name string) (mountInfo, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_STATX_DONT_SYNC
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var stx unix.Statx_t
	err := ignoreEINTR(func() error {
		return unix.Statx(dirfd, name, flags, unix.STATX_TYPE|unix.STATX_MNT_ID, &stx)
	})
	if err != nil {
		return mountInfo{}, err
	}
	return mountInfo{
		root:   stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0,
		known:  stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0,
		mntID:  stx.Mnt_id,
		hasID:  stx.Mask&unix.STATX_MNT_ID != 0,
		devMaj: stx.Dev_major,
		devMin: stx.Dev_minor,
		isDir:  stx.Mode&unix.S_IFMT == unix.S_IFDIR,
	}, nil
}

// mountedBelow reports whether m, an entry of a directory on mount parent,
// is the root of another mount.
func (m mountInfo) mountedBelow(parent mountInfo) bool {
	switch {
	case m.known:
		return m.root
	case m.hasID && parent.hasID:
		return m.mntID != parent.mntID
	default:
		return m.devMaj != parent.devMaj || m.devMin != parent.devMin
	}
}

// findMount returns the first directory (in walk order) below the
// workspace that is a mount point and that the swap would move, or "".
// Kept paths are not visited; spine directories stay in place, so only
// their contents are checked. Moving a directory that holds a mount point
// would carry the mount into the backup, and removing the backup would
// then empty the mounted filesystem.
func findMount(rt *os.Root, keep excludeSet, spine map[string]bool) (string, error) {
	dir, err := rt.Open(".")
	if err != nil {
		return "", err
	}
	defer dir.Close()
	self, err := statMount(int(dir.Fd()), "")
	if err != nil {
		return "", err
	}
	return scanMounts(dir, "", self, keep, spine)
}

// scanMounts is findMount for the open directory dir at rel, on mount mnt.
func scanMounts(dir *os.File, rel string, mnt mountInfo, keep excludeSet, spine map[string]bool) (string, error) {
	ents, err := dir.ReadDir(-1)
	if err != nil {
		return "", err
	}
	slices.SortFunc(ents, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	fd := int(dir.Fd())
	for _, e := range ents {
		name := e.Name()
		p := join(rel, name)
		// Only directories can carry mounted contents away; d_type says
		// which entries are, without a stat (0 when the filesystem does
		// not tell).
		if skipName(rel, name) || keep.has(p) || (e.Type() != 0 && !e.IsDir()) {
			continue
		}
		m, err := statMount(fd, name)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return "", err
		}
		if !m.isDir {
			continue
		}
		if !spine[p] && m.mountedBelow(mnt) {
			return p, nil
		}
		cfd, err := openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			if changedMeanwhile(err) {
				continue
			}
			return "", err
		}
		child := os.NewFile(uintptr(cfd), p)
		found, err := scanMounts(child, p, m, keep, spine)
		_ = child.Close()
		if found != "" || err != nil {
			return found, err
		}
	}
	return "", nil
}
