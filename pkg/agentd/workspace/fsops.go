package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// TempPrefix starts the name of every temporary file the workspace creates
// (atomic-write staging files and Commit backups). Archives skip such names
// (pkg/archive keeps a copy of the prefix, archive.TempPrefix, which a test
// of package agentd keeps equal); CleanupTemp removes them; ListDir hides them.
const TempPrefix = ".bulkhead-tmp-"

// ReservedPrefix starts the names of the daemon's own entries at the
// workspace root: a restore's private directory (its journal, stage and
// backup) and materialize's staging directory. Requests may not write,
// move or remove them (pkg/archive keeps the same prefix,
// archive.ReservedPrefix; a test checks that they agree).
const ReservedPrefix = ".bulkhead-restore-"

// IsReservedPath reports whether rel (clean, relative to the workspace
// root) is, or lies below, a top-level entry named with ReservedPrefix.
func IsReservedPath(rel string) bool {
	top, _, _ := strings.Cut(rel, "/")
	return strings.HasPrefix(top, ReservedPrefix)
}

// IsTempName reports whether a file name is one of the workspace's
// temporary names.
func IsTempName(name string) bool { return strings.HasPrefix(name, TempPrefix) }

// newTempName returns a fresh temporary name.
func newTempName() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return TempPrefix + hex.EncodeToString(b[:])
}

// createTemp creates a new, empty, private (0600) temporary file in d,
// owned by the calling thread's fsuid and fsgid.
func createTemp(d *os.File) (*os.File, string, error) {
	for range 8 {
		name := newTempName()
		var fd int
		err := ignoringEINTR(func() (err error) {
			fd, err = unix.Openat(int(d.Fd()), name,
				unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_NOCTTY|unix.O_CLOEXEC, 0o600)
			return err
		})
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		return os.NewFile(uintptr(fd), name), name, nil
	}
	return nil, "", unix.EEXIST
}

// checkWritable reports whether the calling thread may open the existing
// regular file name in d for writing. Replacing a file by rename needs only
// write permission on the directory; this keeps a read-only file read-only
// for the run_as user. Opening for writing neither truncates nor modifies
// the file. ETXTBSY (a running executable) does not count against writing:
// the rename replaces it without touching the running image.
func checkWritable(d *os.File, name string) error {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Openat(int(d.Fd()), name,
			unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		return err
	})
	if errors.Is(err, unix.ETXTBSY) {
		return nil
	}
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// renameAt renames oldName in od to newName in nd, replacing newName.
func renameAt(od *os.File, oldName string, nd *os.File, newName string) error {
	return ignoringEINTR(func() error {
		return unix.Renameat(int(od.Fd()), oldName, int(nd.Fd()), newName)
	})
}

// renameNoReplace renames oldName in od to newName in nd, failing with
// EEXIST when newName exists. It uses renameat2(RENAME_NOREPLACE); on a
// filesystem without it, it falls back to link+unlink for files (still
// atomic) and, as a last resort, to a check then rename.
func renameNoReplace(od *os.File, oldName string, nd *os.File, newName string) error {
	err := ignoringEINTR(func() error {
		return unix.Renameat2(int(od.Fd()), oldName, int(nd.Fd()), newName, unix.RENAME_NOREPLACE)
	})
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	st, serr := fstatat(od, oldName)
	if serr != nil {
		return serr
	}
	if fileTypeOf(st.Mode) != TypeDirectory {
		lerr := ignoringEINTR(func() error {
			return unix.Linkat(int(od.Fd()), oldName, int(nd.Fd()), newName, 0)
		})
		if lerr == nil {
			return unlinkAt(od, oldName, false)
		}
		if errors.Is(lerr, unix.EEXIST) || !(errors.Is(lerr, unix.EPERM) || errors.Is(lerr, unix.ENOTSUP)) {
			return lerr
		}
	}
	if _, serr := fstatat(nd, newName); serr == nil {
		return unix.EEXIST
	} else if !errors.Is(serr, unix.ENOENT) {
		return serr
	}
	return renameAt(od, oldName, nd, newName)
}

// linkAt hard-links oldName in od as newName in nd.
func linkAt(od *os.File, oldName string, nd *os.File, newName string) error {
	return ignoringEINTR(func() error {
		return unix.Linkat(int(od.Fd()), oldName, int(nd.Fd()), newName, 0)
	})
}

// unlinkAt removes name from d: a directory (which must be empty) when dir
// is set, anything else otherwise.
func unlinkAt(d *os.File, name string, dir bool) error {
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	return ignoringEINTR(func() error { return unix.Unlinkat(int(d.Fd()), name, flags) })
}

// syncDir makes the entries of directory d durable. d may be an O_PATH
// descriptor; the directory is reopened for reading through it. Failures
// are returned for logging: the data itself is already synced.
func syncDir(d *os.File) error {
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return ignoringEINTR(func() error { return unix.Fsync(fd) })
}
