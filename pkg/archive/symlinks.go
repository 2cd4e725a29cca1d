package archive

import (
	"path"
	"strings"
)

// maxLinkHops is the number of symbolic links the kernel follows in one
// lookup before it fails with ELOOP.
const maxLinkHops = 40

// leaves reports whether the symbolic link member p leads outside the
// workspace when resolved the way the kernel would: relative to the link's
// directory, through the archive's own symbolic links (so that a chain of
// links that each look harmless cannot climb out). Components the archive
// does not define are taken literally. A chain longer than the kernel
// follows cannot lead anywhere and is not an escape.
func (x *extractor) leaves(p string) bool {
	dir, _ := split(p)
	var stack []string
	if dir != "" {
		stack = strings.Split(dir, "/")
	}
	pending := strings.Split(x.members[p].target, "/")
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return true
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, c)
		m, ok := x.members[strings.Join(stack, "/")]
		if !ok || m.kind != kindSymlink {
			continue
		}
		if hops++; hops > maxLinkHops {
			return false
		}
		if path.IsAbs(m.target) {
			return true
		}
		stack = stack[:len(stack)-1]
		pending = append(strings.Split(m.target, "/"), pending...)
	}
	return false
}
