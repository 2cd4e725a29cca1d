package manifest

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Tree rendering defaults: the depth and size the harness uses for the
// filesystem section of the model's instructions.
const (
	DefaultTreeDepth    = 3
	DefaultTreeMaxBytes = 5000
)

// TreeOptions control RenderTree.
type TreeOptions struct {
	// Depth is how many path components deep the tree goes: 1 shows only
	// the top level. 0 means DefaultTreeDepth; negative means no limit.
	Depth int
	// MaxBytes caps the whole output, the truncation notice included. 0
	// means DefaultTreeMaxBytes; negative means no cap.
	MaxBytes int
	// MaxLines, when positive, caps how many entry lines are shown (the root
	// line and the truncation notice are not counted).
	MaxLines int
}

// treeNode is one path component of the rendered tree.
type treeNode struct {
	name  string
	rel   string
	entry *Entry // nil for a directory that only exists as a parent
	kids  map[string]*treeNode
}

func (n *treeNode) isDir() bool {
	return len(n.kids) > 0 || n.entry != nil && n.entry.Type.IsDir()
}

type treeLine struct {
	label   string // prefix, connector, name
	comment string // "# /abs/path — description"
}

// RenderTree renders the workspace layout for the model: the root on the
// first line, then one line per path with box-drawing connectors, siblings
// in byte order, directories marked with a trailing "/", and a comment
// column aligned two spaces after the longest label giving the absolute
// path and, after " — ", the entry's description:
//
//	/workspace
//	├── data/       # /workspace/data
//	└── repo/       # /workspace/repo — the project
//	    └── task.md  # /workspace/repo/task.md
//
// (alignment is computed over all lines). Paths deeper than the depth limit
// are not shown; a directory cut off by the limit still ends in "/".
// Intermediate directories of multi-component keys appear without a
// description. Extra path grants are not shown. When the output would exceed
// the caps, whole lines are dropped from the end and a notice saying how many
// were left out is appended. The manifest must be valid.
func (m *Manifest) RenderTree(opts TreeOptions) (string, error) {
	if err := m.Validate(); err != nil {
		return "", err
	}
	depth := opts.Depth
	if depth == 0 {
		depth = DefaultTreeDepth
	}
	maxBytes := opts.MaxBytes
	if maxBytes == 0 {
		maxBytes = DefaultTreeMaxBytes
	}

	root := &treeNode{kids: map[string]*treeNode{}}
	var probs problems
	for _, it := range m.flatten(&probs) {
		n := root
		for c := range strings.SplitSeq(it.path, "/") {
			kid := n.kids[c]
			if kid == nil {
				rel := c
				if n.rel != "" {
					rel = n.rel + "/" + c
				}
				kid = &treeNode{name: c, rel: rel, kids: map[string]*treeNode{}}
				n.kids[c] = kid
			}
			n = kid
		}
		n.entry = it.e
	}

	rootPath := strings.TrimRight(m.WorkspaceRoot(), "/")
	var lines []treeLine
	var walk func(n *treeNode, prefix string, level int)
	walk = func(n *treeNode, prefix string, level int) {
		names := sortedKeys(n.kids)
		for i, name := range names {
			kid := n.kids[name]
			last := i == len(names)-1
			connector, indent := "├── ", "│   "
			if last {
				connector, indent = "└── ", "    "
			}
			label := prefix + connector + name
			if kid.isDir() {
				label += "/"
			}
			comment := "# " + rootPath + "/" + kid.rel
			if kid.entry != nil {
				if d := flattenText(kid.entry.Description); d != "" {
					comment += " — " + d
				}
			}
			lines = append(lines, treeLine{label: label, comment: comment})
			if depth < 0 || level < depth {
				walk(kid, prefix+indent, level+1)
			}
		}
	}
	walk(root, "", 1)

	width := 0
	for _, l := range lines {
		width = max(width, utf8.RuneCountInString(l.label))
	}
	header := rootPath
	if header == "" {
		header = "/"
	}
	header += "\n"
	rendered := make([]string, len(lines))
	for i, l := range lines {
		pad := width - utf8.RuneCountInString(l.label)
		rendered[i] = l.label + strings.Repeat(" ", pad) + "  " + l.comment + "\n"
	}
	return fitTree(header, rendered, maxBytes, opts.MaxLines), nil
}

// fitTree joins the header and lines, dropping lines from the end (and
// saying so) until the caps hold.
func fitTree(header string, lines []string, maxBytes, maxLines int) string {
	keep := len(lines)
	if maxLines > 0 {
		keep = min(keep, maxLines)
	}
	size := len(header)
	for _, l := range lines[:keep] {
		size += len(l)
	}
	if keep == len(lines) && (maxBytes < 0 || size <= maxBytes) {
		return header + strings.Join(lines, "")
	}
	for ; keep >= 0; keep-- {
		notice := truncationNotice(len(lines) - keep)
		if maxBytes < 0 || size+len(notice) <= maxBytes {
			return header + strings.Join(lines[:keep], "") + notice
		}
		if keep > 0 {
			size -= len(lines[keep-1])
		}
	}
	// Not even the root line and the notice fit: cut at a rune boundary.
	out := header + truncationNotice(len(lines))
	cut := maxBytes
	for cut > 0 && !utf8.RuneStart(out[cut]) {
		cut--
	}
	return out[:cut]
}

func truncationNotice(omitted int) string {
	return fmt.Sprintf("... (%d more paths not shown)\n\n"+
		"This layout is incomplete: run `ls` on a directory before relying on a path that is not listed here.\n", omitted)
}

// flattenText puts a description on one line: every run of whitespace or
// control characters becomes a single space.
func flattenText(s string) string {
	f := strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || r == utf8.RuneError
	})
	return strings.Join(f, " ")
}
