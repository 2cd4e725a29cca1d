package userdb

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// namePattern is what account names may look like: the portable subset
// shadow-utils and busybox both accept.
var namePattern = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// ValidName checks an account name.
func ValidName(name string) error {
	if !namePattern.MatchString(name) {
		return errkind.Errorf(errkind.ErrInvalidArgument, "account name %q: use 1-32 characters from [a-z0-9_-], starting with a letter or _", name)
	}
	return nil
}

// First ids handed out to new accounts, as Debian's login.defs does.
const (
	firstID = 1000
	lastID  = 59999
)

// NewGroup describes a group to add.
type NewGroup struct {
	Name string
	GID  *uint32 // nil: the next free id from 1000
}

// NewUser describes a user to add.
type NewUser struct {
	Name   string
	UID    *uint32 // nil: the next free id from 1000
	Groups []string
	Home   string // "" means /home/<name>
	Shell  string // "" means /bin/sh
}

// AddGroup appends a group to etc/group (and etc/gshadow when present) by
// rewriting the file atomically. It is the fallback for images without
// groupadd. A group that exists already is an ErrAlreadyExists error.
func (d *DB) AddGroup(g NewGroup) (uint32, error) {
	if err := ValidName(g.Name); err != nil {
		return 0, err
	}
	d.editMu.Lock()
	defer d.editMu.Unlock()
	groups, err := d.lines("group")
	if err != nil {
		return 0, err
	}
	if findField(groups, 0, g.Name) != nil {
		return 0, errkind.Errorf(errkind.ErrAlreadyExists, "group %s exists", g.Name)
	}
	gid, err := pickID(groups, g.GID)
	if err != nil {
		return 0, fmt.Errorf("group %s: %w", g.Name, err)
	}
	if err := d.appendLine("group", fmt.Sprintf("%s:x:%d:", g.Name, gid)); err != nil {
		return 0, err
	}
	if err := d.appendIfExists("gshadow", g.Name+":!::"); err != nil {
		return 0, err
	}
	return gid, nil
}

// AddUser appends a user with a private group of the same name to
// etc/passwd and etc/group (and the shadow files when present), adds it to
// its supplementary groups and creates its home directory (below the DB's
// root) owned by it. It is the fallback for images without useradd.
func (d *DB) AddUser(u NewUser) (*User, error) {
	if err := ValidName(u.Name); err != nil {
		return nil, err
	}
	home := u.Home
	if home == "" {
		home = "/home/" + u.Name
	}
	shell := u.Shell
	if shell == "" {
		shell = "/bin/sh"
	}
	if !filepath.IsAbs(home) || !filepath.IsAbs(shell) || strings.ContainsAny(home+shell, ":\n") {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "user %s: home and shell must be absolute paths without ':'", u.Name)
	}
	d.editMu.Lock()
	defer d.editMu.Unlock()
	passwd, err := d.lines("passwd")
	if err != nil {
		return nil, err
	}
	groups, err := d.lines("group")
	if err != nil {
		return nil, err
	}
	groups = slices.Clone(groups) // the parsed lines are shared with the cache
	if findField(passwd, 0, u.Name) != nil {
		return nil, errkind.Errorf(errkind.ErrAlreadyExists, "user %s exists", u.Name)
	}
	for _, g := range u.Groups {
		if findField(groups, 0, g) == nil {
			return nil, errkind.Errorf(errkind.ErrNotFound, "user %s: group %s does not exist", u.Name, g)
		}
	}
	uid, err := pickID(passwd, u.UID)
	if err != nil {
		return nil, fmt.Errorf("user %s: %w", u.Name, err)
	}
	// The private group: same name, the uid as gid when that is free.
	gid := uid
	if g := findField(groups, 0, u.Name); g != nil {
		n, _ := strconv.ParseUint(g[2], 10, 32)
		gid = uint32(n)
	} else {
		if findField(groups, 2, strconv.FormatUint(uint64(gid), 10)) != nil {
			if gid, err = pickID(groups, nil); err != nil {
				return nil, fmt.Errorf("user %s: %w", u.Name, err)
			}
		}
		groups = append(groups, []string{u.Name, "x", strconv.FormatUint(uint64(gid), 10), ""})
		if err := d.appendIfExists("gshadow", u.Name+":!::"); err != nil {
			return nil, err
		}
	}
	for i, g := range groups {
		if len(g) >= 4 && slices.Contains(u.Groups, g[0]) {
			members := slices.DeleteFunc(strings.Split(g[3], ","), func(s string) bool { return s == "" })
			if !slices.Contains(members, u.Name) {
				groups[i] = append(slices.Clone(g[:3]), strings.Join(append(members, u.Name), ","))
			}
		}
	}
	if err := d.rewrite("group", groups); err != nil {
		return nil, err
	}
	if err := d.appendLine("passwd", fmt.Sprintf("%s:x:%d:%d::%s:%s", u.Name, uid, gid, home, shell)); err != nil {
		return nil, err
	}
	if err := d.appendIfExists("shadow", u.Name+":!:19000:0:99999:7:::"); err != nil {
		return nil, err
	}
	homeDir := filepath.Join(d.root, home)
	if err := os.MkdirAll(homeDir, 0o750); err != nil {
		return nil, fmt.Errorf("user %s: create home: %w", u.Name, errkind.ClassifyFS(err))
	}
	if err := os.Lchown(homeDir, int(uid), int(gid)); err != nil && !errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("user %s: chown home: %w", u.Name, errkind.ClassifyFS(err))
	}
	return d.Lookup(u.Name)
}

// findField returns the first line whose field i equals v.
func findField(lines [][]string, i int, v string) []string {
	for _, f := range lines {
		if len(f) > i && f[i] == v {
			return f
		}
	}
	return nil
}

// pickID returns want when it is free, or the lowest free id >= firstID.
func pickID(lines [][]string, want *uint32) (uint32, error) {
	used := map[uint32]bool{}
	for _, f := range lines {
		if len(f) > 2 {
			if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				used[uint32(n)] = true
			}
		}
	}
	if want != nil {
		if used[*want] {
			return 0, errkind.Errorf(errkind.ErrAlreadyExists, "id %d is taken", *want)
		}
		return *want, nil
	}
	for id := uint32(firstID); id <= lastID; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, errkind.Errorf(errkind.ErrResourceExhausted, "no free id in %d-%d", firstID, lastID)
}

// appendLine adds a line to etc/<file>, creating the file when missing.
func (d *DB) appendLine(file, line string) error {
	data, err := os.ReadFile(filepath.Join(d.root, "etc", file))
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read /etc/%s: %w", file, err)
	}
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		data = append(data, '\n')
	}
	return d.replaceFile(file, append(data, line+"\n"...))
}

// appendIfExists is appendLine for optional files (shadow, gshadow).
func (d *DB) appendIfExists(file, line string) error {
	if _, err := os.Stat(filepath.Join(d.root, "etc", file)); os.IsNotExist(err) {
		return nil
	}
	return d.appendLine(file, line)
}

// rewrite replaces etc/<file> with lines. Comments of the original are not
// kept; account files written by tools carry none that matter.
func (d *DB) rewrite(file string, lines [][]string) error {
	var b bytes.Buffer
	for _, f := range lines {
		b.WriteString(strings.Join(f, ":"))
		b.WriteByte('\n')
	}
	return d.replaceFile(file, b.Bytes())
}

// replaceFile writes etc/<file> atomically, keeping its mode and owner.
func (d *DB) replaceFile(file string, data []byte) error {
	path := filepath.Join(d.root, "etc", file)
	mode := os.FileMode(0o644)
	if file == "shadow" || file == "gshadow" {
		mode = 0o640
	}
	uid, gid := -1, -1
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
		if st, ok := statOwner(fi); ok {
			uid, gid = st[0], st[1]
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write /etc/%s: %w", file, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+file+".bulkhead-*")
	if err != nil {
		return fmt.Errorf("write /etc/%s: %w", file, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write /etc/%s: %w", file, errkind.ClassifyFS(err))
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write /etc/%s: %w", file, err)
	}
	if uid >= 0 {
		_ = tmp.Chown(uid, gid)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write /etc/%s: %w", file, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write /etc/%s: %w", file, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write /etc/%s: %w", file, err)
	}
	ok = true
	return nil
}

// statOwner returns the uid and gid of fi.
func statOwner(fi os.FileInfo) ([2]int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return [2]int{}, false
	}
	return [2]int{int(st.Uid), int(st.Gid)}, true
}
