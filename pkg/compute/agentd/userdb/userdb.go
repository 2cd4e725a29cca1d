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

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
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
// Files are re-read on every lookup: users are created by materialization
// while the daemon runs, and the files are small.
type DB struct {
	root string
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
// id). An unknown user is a compute.ErrNotFound.
func (d *DB) Lookup(name string) (*User, error) {
	if name == "" {
		return nil, compute.Errorf(compute.ErrInvalidArgument, "empty user name")
	}
	found, err := d.findUser(func(f []string) bool { return f[0] == name })
	if err != nil {
		return nil, err
	}
	if numeric, numErr := strconv.ParseUint(name, 10, 32); found == nil && numErr == nil {
		uid := strconv.FormatUint(numeric, 10)
		if found, err = d.findUser(func(f []string) bool { return f[2] == uid }); err != nil {
			return nil, err
		}
	}
	if found == nil {
		return nil, compute.Errorf(compute.ErrNotFound, "user %q is not in the sandbox's /etc/passwd", name)
	}
	err = d.scan("group", func(f []string) bool {
		if len(f) < 4 || f[3] == "" {
			return false
		}
		for _, member := range strings.Split(f[3], ",") {
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

// findUser returns the first well-formed passwd entry that match accepts,
// or nil.
func (d *DB) findUser(match func([]string) bool) (*User, error) {
	var found *User
	err := d.scan("passwd", func(f []string) bool {
		if len(f) < 7 || !match(f) {
			return false
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return false
		}
		found = &User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		return true
	})
	return found, err
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
		return 0, compute.Errorf(compute.ErrNotFound, "group %q is not in the sandbox's /etc/group", name)
	}
	return gid, nil
}

// scan calls fn with the colon-separated fields of every non-comment line of
// etc/<file> until fn returns true.
func (d *DB) scan(file string, fn func([]string) bool) error {
	path := filepath.Join(d.root, "etc", file)
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("read /etc/%s: %w", file, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 4096), 1<<20)
	for s.Scan() {
		line := s.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if fn(strings.Split(line, ":")) {
			return nil
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("read /etc/%s: %w", file, err)
	}
	return nil
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
