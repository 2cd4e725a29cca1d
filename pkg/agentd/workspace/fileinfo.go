package workspace

import (
	"io/fs"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// FileType is the kind of a directory entry.
type FileType int

// File types. Anything but a regular file, a directory or a symbolic link is
// refused by ReadFile and WriteFile.
const (
	TypeUnknown FileType = iota
	TypeRegular
	TypeDirectory
	TypeSymlink
	TypeFIFO
	TypeSocket
	TypeCharDevice
	TypeBlockDevice
)

func (t FileType) String() string {
	switch t {
	case TypeRegular:
		return "file"
	case TypeDirectory:
		return "directory"
	case TypeSymlink:
		return "symlink"
	case TypeFIFO:
		return "fifo"
	case TypeSocket:
		return "socket"
	case TypeCharDevice:
		return "char-device"
	case TypeBlockDevice:
		return "block-device"
	}
	return "unknown"
}

// FileInfo describes one file. Symbolic links are described themselves
// (lstat semantics), with their target in LinkTarget.
type FileInfo struct {
	// Name is the final component of the path.
	Name string
	// Path is the path as the caller gave it (for ListDir entries: the
	// listed directory's path joined with Name).
	Path    string
	Type    FileType
	Size    int64
	Mode    fs.FileMode // permission bits plus setuid, setgid and sticky; no type bits
	UID     uint32
	GID     uint32
	Owner   string // user name of UID, "" when unknown
	Group   string // group name of GID, "" when unknown
	ModTime time.Time
	// LinkTarget is the target of a symbolic link, as stored in it.
	LinkTarget string
}

// IsDir reports whether the entry is a directory.
func (fi FileInfo) IsDir() bool { return fi.Type == TypeDirectory }

// statInfo converts a raw stat of the entry itself.
func statInfo(name string, st *unix.Stat_t) FileInfo {
	return makeInfo(name, st.Mode, st.Size, st.Uid, st.Gid, time.Unix(st.Mtim.Unix()))
}

// osInfo converts an lstat result made by package os.
func osInfo(name string, fi fs.FileInfo) FileInfo {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileInfo{Name: name, Size: fi.Size(), Mode: fi.Mode().Perm(), ModTime: fi.ModTime()}
	}
	return makeInfo(name, st.Mode, st.Size, st.Uid, st.Gid, time.Unix(st.Mtim.Unix()))
}

func makeInfo(name string, mode uint32, size int64, uid, gid uint32, mtime time.Time) FileInfo {
	fi := FileInfo{
		Name:    name,
		Type:    fileTypeOf(mode),
		Size:    size,
		Mode:    fs.FileMode(mode & 0o777),
		UID:     uid,
		GID:     gid,
		ModTime: mtime,
	}
	if mode&syscall.S_ISUID != 0 {
		fi.Mode |= fs.ModeSetuid
	}
	if mode&syscall.S_ISGID != 0 {
		fi.Mode |= fs.ModeSetgid
	}
	if mode&syscall.S_ISVTX != 0 {
		fi.Mode |= fs.ModeSticky
	}
	return fi
}

// fileTypeOf maps the S_IFMT bits of a raw mode.
func fileTypeOf(mode uint32) FileType {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		return TypeRegular
	case syscall.S_IFDIR:
		return TypeDirectory
	case syscall.S_IFLNK:
		return TypeSymlink
	case syscall.S_IFIFO:
		return TypeFIFO
	case syscall.S_IFSOCK:
		return TypeSocket
	case syscall.S_IFCHR:
		return TypeCharDevice
	case syscall.S_IFBLK:
		return TypeBlockDevice
	}
	return TypeUnknown
}

// namer resolves owner names, caching answers for one operation.
type namer struct {
	db     *userdb.DB
	users  map[uint32]string
	groups map[uint32]string
}

func newNamer(db *userdb.DB) *namer {
	return &namer{db: db, users: map[uint32]string{}, groups: map[uint32]string{}}
}

// fill sets fi.Owner and fi.Group when the sandbox's /etc/passwd and
// /etc/group know the ids.
func (n *namer) fill(fi *FileInfo) {
	if n == nil || n.db == nil {
		return
	}
	name, ok := n.users[fi.UID]
	if !ok {
		if u, err := n.db.Lookup(strconv.FormatUint(uint64(fi.UID), 10)); err == nil && u.UID == fi.UID {
			name = u.Name
		}
		n.users[fi.UID] = name
	}
	fi.Owner = name
	group, ok := n.groups[fi.GID]
	if !ok {
		group = n.db.GroupName(fi.GID)
		n.groups[fi.GID] = group
	}
	fi.Group = group
}
