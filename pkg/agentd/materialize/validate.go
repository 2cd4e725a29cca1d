package materialize

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// DefaultMaxEntries bounds a plan when Options.MaxEntries is zero.
const DefaultMaxEntries = 1_000_000

// reservedPrefixes are names the daemon uses for its own temporary files.
var reservedPrefixes = [...]string{".bulkhead-tmp-", ".bulkhead-restore-"}

// checked is a validated plan.
type checked struct {
	entries  []*Entry          // sorted by path: parents before children
	byPath   map[string]*Entry // explicit entries
	implicit []string          // directories created only as parents, sorted
	files    []*Entry          // file entries in plan order: the tar order
	existed  map[string]bool   // paths present in the workspace (precheck)
}

// CheckPath validates a workspace-relative entry path.
func CheckPath(p string) error {
	switch {
	case p == "" || p == ".":
		return errkind.Errorf(errkind.ErrInvalidArgument, "entry path is empty")
	case strings.HasPrefix(p, "/"):
		return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrPathEscape, "entry paths are workspace-relative")}
	case strings.ContainsRune(p, 0):
		return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrInvalidArgument, "NUL in path")}
	case path.Clean(p) != p:
		return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrInvalidArgument, "path is not clean (write %q)", path.Clean(p))}
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrPathEscape, "'..' in entry path")}
		}
		for _, r := range reservedPrefixes {
			if strings.HasPrefix(c, r) {
				return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrInvalidArgument, "names starting with %q are reserved", r)}
			}
		}
	}
	return nil
}

// validate checks a plan without touching anything.
func validate(plan Plan, opts Options) (*checked, error) {
	maxEntries := opts.MaxEntries
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	if len(plan.Entries) > maxEntries {
		return nil, errkind.Errorf(errkind.ErrResourceExhausted, "plan has %d entries; the limit is %d", len(plan.Entries), maxEntries)
	}
	for _, g := range plan.Groups {
		if err := userdb.ValidName(g.Name); err != nil {
			return nil, err
		}
	}
	for _, u := range plan.Users {
		if err := userdb.ValidName(u.Name); err != nil {
			return nil, err
		}
		if u.Name == "root" {
			return nil, errkind.Errorf(errkind.ErrInvalidArgument, "user root cannot be declared")
		}
	}
	c := &checked{byPath: make(map[string]*Entry, len(plan.Entries))}
	var total int64
	for i := range plan.Entries {
		e := &plan.Entries[i]
		if err := CheckPath(e.Path); err != nil {
			return nil, err
		}
		if _, dup := c.byPath[e.Path]; dup {
			return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "listed twice")}
		}
		if e.Mode&^fs.ModePerm&^(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "mode %v has type bits", e.Mode)}
		}
		switch e.Kind {
		case KindFile:
			if e.Size < 0 {
				return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "negative size")}
			}
			if opts.MaxFileBytes > 0 && e.Size > opts.MaxFileBytes {
				return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrResourceExhausted, "%d bytes; the limit is %d", e.Size, opts.MaxFileBytes)}
			}
			total += e.Size
			c.files = append(c.files, e)
		case KindDir:
		case KindSymlink:
			if err := checkLinkTarget(e.Path, e.LinkTarget); err != nil {
				return nil, err
			}
		default:
			return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "unknown entry kind %d", e.Kind)}
		}
		if e.Kind != KindFile && e.Size != 0 {
			return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "only files have a size")}
		}
		c.byPath[e.Path] = e
		c.entries = append(c.entries, e)
	}
	if opts.MaxTotalBytes > 0 && total > opts.MaxTotalBytes {
		return nil, errkind.Errorf(errkind.ErrResourceExhausted, "plan carries %d bytes; the limit is %d", total, opts.MaxTotalBytes)
	}
	slices.SortFunc(c.entries, func(a, b *Entry) int { return strings.Compare(a.Path, b.Path) })
	implicit := map[string]bool{}
	for _, e := range c.entries {
		for dir := path.Dir(e.Path); dir != "."; dir = path.Dir(dir) {
			if p, ok := c.byPath[dir]; ok {
				if p.Kind != KindDir {
					return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrNotDirectory, "%s is a %s in the plan", dir, p.Kind)}
				}
				continue
			}
			implicit[dir] = true
		}
	}
	for d := range implicit {
		c.implicit = append(c.implicit, d)
	}
	slices.Sort(c.implicit)
	return c, nil
}

// checkLinkTarget accepts relative targets that resolve inside the workspace.
func checkLinkTarget(p, target string) error {
	bad := func(why string) error {
		return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrPathEscape, "symlink target %q %s", target, why)}
	}
	switch {
	case target == "" || strings.ContainsRune(target, 0):
		return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrInvalidArgument, "symlink without a target")}
	case strings.HasPrefix(target, "/"):
		return bad("is absolute")
	}
	joined := path.Join(path.Dir(p), target)
	if joined == ".." || strings.HasPrefix(joined, "../") {
		return bad("leaves the workspace")
	}
	return nil
}

// precheck refuses a plan that cannot be committed over the workspace as
// it is: a directory entry (or a parent) where a non-directory exists, a
// file or symlink entry where a directory exists, and parents that are
// symbolic links (which would redirect the entry elsewhere in the tree).
func precheck(rt *os.Root, c *checked) error {
	seen := map[string]bool{}
	c.existed = map[string]bool{}
	check := func(p string, wantDir bool) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		fi, err := rt.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.ClassifyFS(err)}
		}
		c.existed[p] = true
		switch {
		case wantDir && fi.Mode()&fs.ModeSymlink != 0:
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrConflict, "a symbolic link is in the way of a directory")}
		case wantDir && !fi.IsDir():
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrNotDirectory, "a file is in the way of a directory")}
		case !wantDir && fi.IsDir():
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrIsDirectory, "a directory is in the way")}
		}
		return nil
	}
	for _, d := range c.implicit {
		if err := check(d, true); err != nil {
			return err
		}
	}
	for _, e := range c.entries {
		if err := check(e.Path, e.Kind == KindDir); err != nil {
			return err
		}
	}
	return nil
}

// allVolatile reports whether every entry of the plan is re-created at
// each start (Entry.Volatile), so the plan need not be flushed to disk.
func (c *checked) allVolatile() bool {
	for _, e := range c.entries {
		if !e.Volatile {
			return false
		}
	}
	return len(c.entries) > 0
}
