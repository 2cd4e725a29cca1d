// Package userdb looks up the sandbox's users and groups from its own
// /etc/passwd and /etc/group, without cgo or NSS, so that a run_as user is
// resolved exactly as the sandbox image defines it.
package userdb

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// User is a resolved sandbox account.
type User struct {
	Name   string
	UID    uint32
	GID    uint32   // primary group
	Groups []uint32 // supplementary groups (not including GID unless listed)
	Home   string
	Shell  string
}

// DB reads account files below a root directory ("/" in a real sandbox).
// Users are created by materialization while the daemon runs, so every
// lookup sees the files as they are now: the parsed files are cached, and
// a cached file is used only while its identity and change times (device,
// inode, size, mtime, ctime, checked with a stat on every lookup) are
// unchanged and were already older than settleTime when it was read, so
// that a rewrite within the file system's timestamp granularity cannot go
// unnoticed. A DB is safe for concurrent use.
type DB struct {
	root string

	mu    sync.Mutex
	cache map[string]*etcFile // by file name: "passwd", "group"

	editMu sync.Mutex // serialises AddGroup and AddUser
}

// settleTime is how old a file's change times must be before its parsed
// content is reused: well above any file system's timestamp granularity.
var settleTime = 2 * time.Second // a variable for tests

// etcFile is a parsed account file: its non-comment lines split at colons.
type etcFile struct {
	key   fileKey
	lines [][]string
}

// fileKey identifies a version of a file.
type fileKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func keyOf(st *unix.Stat_t) fileKey {
	return fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// settled reports whether both change times are older than t-settleTime.
func (k fileKey) settled(t time.Time) bool {
	limit := t.Add(-settleTime).UnixNano()
	return k.mtime.Nano() < limit && k.ctime.Nano() < limit
}

// New returns a DB reading <root>/etc/passwd and <root>/etc/group.
func New(root string) *DB {
	if root == "" {
		root = "/"
	}
	return &DB{root: root}
}

// Lookup resolves a user by name, or by numeric uid when name is all digits
// and no account has that exact name (a name always wins, as with chown and
// id). An unknown user is errkind.ErrUserNotFound (a case of ErrNotFound).
func (d *DB) Lookup(name string) (*User, error) {
	found, err := d.Account(name)
	if err != nil {
		return nil, err
	}
	err = d.scan("group", func(f []string) bool {
		if len(f) < 4 || f[3] == "" {
			return false
		}
		for member := range strings.SplitSeq(f[3], ",") {
			if member == found.Name {
				if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					found.Groups = append(found.Groups, uint32(gid))
				}
				break
			}
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	return found, nil
}

// Account is Lookup without the supplementary groups (Groups is nil): it
// reads only /etc/passwd, for callers that need no credentials (HOME,
// USER and SHELL of an identity that is not changed).
func (d *DB) Account(name string) (*User, error) {
	if name == "" {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "empty user name")
	}
	passwd, err := d.lines("passwd")
	if err != nil {
		return nil, err
	}
	found := findUser(passwd, func(f []string) bool { return f[0] == name })
	if numeric, numErr := strconv.ParseUint(name, 10, 32); found == nil && numErr == nil {
		uid := strconv.FormatUint(numeric, 10)
		found = findUser(passwd, func(f []string) bool { return f[2] == uid })
	}
	if found == nil {
		return nil, errkind.Errorf(errkind.ErrUserNotFound, "%q is not in the sandbox's /etc/passwd", name)
	}
	return found, nil
}

// findUser returns the first well-formed passwd entry that match accepts,
// or nil.
func findUser(passwd [][]string, match func([]string) bool) *User {
	for _, f := range passwd {
		if len(f) < 7 || !match(f) {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
	}
	return nil
}

// GroupID resolves a group by name (or numeric gid).
func (d *DB) GroupID(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	var gid uint32
	ok := false
	err := d.scan("group", func(f []string) bool {
		if len(f) < 3 || f[0] != name {
			return false
		}
		n, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return false
		}
		gid, ok = uint32(n), true
		return true
	})
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errkind.Errorf(errkind.ErrNotFound, "group %q is not in the sandbox's /etc/group", name)
	}
	return gid, nil
}

// scan calls fn with the colon-separated fields of every non-comment line of
// etc/<file> until fn returns true. fn must not modify the fields.
func (d *DB) scan(file string, fn func([]string) bool) error {
	lines, err := d.lines(file)
	if err != nil {
		return err
	}
	for _, f := range lines {
		if fn(f) {
			return nil
		}
	}
	return nil
}

// lines returns the parsed etc/<file>, from the cache when the file has
// not changed (see DB). A missing file has no lines.
func (d *DB) lines(file string) ([][]string, error) {
	path := filepath.Join(d.root, "etc", file)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		d.mu.Lock()
		c := d.cache[file]
		d.mu.Unlock()
		if c != nil && c.key == keyOf(&st) {
			return c.lines, nil
		}
	}
	readAt := time.Now()
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read /etc/%s: %w", file, err)
	}
	defer f.Close()
	// The key of what is read, taken before reading: a change made while
	// reading changes it, so it is noticed next time.
	var key fileKey
	keyOK := false
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if unix.Fstat(int(fd), &st) == nil {
				key, keyOK = keyOf(&st), true
			}
		})
	}
	var lines [][]string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 4096), 1<<20)
	for s.Scan() {
		line := s.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		lines = append(lines, strings.Split(line, ":"))
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read /etc/%s: %w", file, err)
	}
	if keyOK && key.settled(readAt) {
		d.mu.Lock()
		if d.cache == nil {
			d.cache = make(map[string]*etcFile)
		}
		d.cache[file] = &etcFile{key: key, lines: lines}
		d.mu.Unlock()
	}
	return lines, nil
}

// GroupName returns the name of a group id, or "" when /etc/group does not
// list it.
func (d *DB) GroupName(gid uint32) string {
	want := strconv.FormatUint(uint64(gid), 10)
	name := ""
	_ = d.scan("group", func(f []string) bool {
		if len(f) >= 3 && f[2] == want {
			name = f[0]
			return true
		}
		return false
	})
	return name
}
