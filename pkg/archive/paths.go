package archive

import (
	"path"
	"strings"
	"unicode/utf8"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// maxNameBytes is the longest path component accepted (NAME_MAX).
const maxNameBytes = 255

// excludeSet holds normalised workspace-relative paths.
type excludeSet map[string]struct{}

// newExcludeSet checks and normalises paths. They must be relative, inside
// the workspace and not the workspace itself.
func newExcludeSet(op string, paths []string) (excludeSet, error) {
	set := make(excludeSet, len(paths))
	for _, p := range paths {
		switch {
		case p == "":
			return nil, refuse(op, p, errkind.ErrInvalidArgument, "empty exclude path")
		case strings.IndexByte(p, 0) >= 0:
			return nil, refuse(op, shown(p), errkind.ErrInvalidArgument, "exclude path contains NUL")
		case strings.HasPrefix(p, "/"):
			return nil, refuse(op, shown(p), errkind.ErrInvalidArgument, "exclude paths must be workspace-relative")
		}
		c := path.Clean(p)
		switch {
		case c == ".":
			return nil, refuse(op, shown(p), errkind.ErrInvalidArgument, "an exclude path may not name the whole workspace")
		case c == ".." || strings.HasPrefix(c, "../"):
			return nil, refuse(op, shown(p), errkind.ErrPathEscape, "exclude path leaves the workspace")
		}
		set[c] = struct{}{}
	}
	return set, nil
}

// has reports whether p itself is excluded.
func (s excludeSet) has(p string) bool {
	_, ok := s[p]
	return ok
}

// covers reports whether p or one of its ancestors is excluded.
func (s excludeSet) covers(p string) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && s.has(p[:i]) {
			return true
		}
	}
	return s.has(p)
}

// coveredByAncestor reports whether a proper ancestor of p is excluded.
func (s excludeSet) coveredByAncestor(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && s.has(p[:i]) {
			return true
		}
	}
	return false
}

// skipName reports whether a directory entry is never archived: the
// workspace's temporary files anywhere, Restore's directories at the top.
func skipName(parent, name string) bool {
	return isTempName(name) || (parent == "" && strings.HasPrefix(name, ReservedPrefix))
}

// join joins a workspace-relative directory ("" for the root) and a name.
func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// split returns the parent ("" for the root) and the last component of a
// cleaned relative path.
func split(p string) (dir, name string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

// orDot returns p, or "." for the root.
func orDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// cleanMember checks an archive member name (or hard link target) and
// returns it as a cleaned workspace-relative path, "" for the root. The
// error wraps a compute sentinel and says why; the caller names the member.
func cleanMember(raw string, lim *Limits) (string, error) {
	switch {
	case !utf8.ValidString(raw):
		return "", errkind.Errorf(errkind.ErrInvalidArgument, "name is not valid UTF-8")
	case strings.IndexByte(raw, 0) >= 0:
		return "", errkind.Errorf(errkind.ErrInvalidArgument, "name contains NUL")
	case len(raw) > lim.MaxPathBytes:
		return "", errkind.Errorf(errkind.ErrInvalidArgument, "name is %d bytes long, the limit is %d", len(raw), lim.MaxPathBytes)
	case strings.HasPrefix(raw, "/"):
		return "", errkind.Errorf(errkind.ErrPathEscape, "absolute name")
	}
	var b strings.Builder
	b.Grow(len(raw))
	depth := 0
	for c := range strings.SplitSeq(raw, "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return "", errkind.Errorf(errkind.ErrPathEscape, "name contains a \"..\" component")
		case len(c) > maxNameBytes:
			return "", errkind.Errorf(errkind.ErrInvalidArgument, "a name component is %d bytes long, the limit is %d", len(c), maxNameBytes)
		case isTempName(c) || (depth == 0 && strings.HasPrefix(c, ReservedPrefix)):
			return "", errkind.Errorf(errkind.ErrInvalidArgument, "name uses a reserved prefix")
		}
		depth++
		if depth > lim.MaxDepth {
			return "", errkind.Errorf(errkind.ErrInvalidArgument, "name is more than %d components deep", lim.MaxDepth)
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(c)
	}
	return b.String(), nil
}
