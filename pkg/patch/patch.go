package patch

// OpKind says what a file operation does.
type OpKind int

// The three file operations of a patch. A move is an OpUpdate with MoveTo set.
const (
	OpAdd OpKind = iota + 1
	OpDelete
	OpUpdate
)

// String returns "add", "delete" or "update".
func (k OpKind) String() string {
	switch k {
	case OpAdd:
		return "add"
	case OpDelete:
		return "delete"
	case OpUpdate:
		return "update"
	default:
		return "unknown"
	}
}

// Patch is a parsed patch: its file operations in the order they apply.
// Parse, FromOperations and ParseOperationsJSON all produce this type, and a
// Patch they return always holds at least one operation.
type Patch struct {
	Ops []FileOp
	// EnvironmentID is the value of an optional "*** Environment ID:" line
	// before the first operation (a newer Codex preamble). The planner ignores
	// it; callers may check it.
	EnvironmentID string
}

// FileOp is one operation on one file.
type FileOp struct {
	Kind OpKind
	// Path is the file the operation acts on, exactly as the patch wrote it
	// (surrounding whitespace removed).
	Path string
	// MoveTo, for OpUpdate only, is where the updated file ends up; empty
	// when the file stays where it is.
	MoveTo string
	// Content, for OpAdd only, is the whole new file. Every "+" line
	// contributes its text and a "\n".
	Content []byte
	// Hunks, for OpUpdate only, are the edits in file order. There is at
	// least one.
	Hunks []Hunk
	// Line is the 1-based line of the operation's header in the patch text,
	// or 0 when the operation came from the per-file operation form.
	Line int
}

// Hunk is one "@@" section of an update.
type Hunk struct {
	// Anchors are the texts of the hunk's "@@ text" lines, in order. Each is
	// searched for after the previous one; the hunk's lines are searched for
	// after the last. A bare "@@" adds no anchor.
	Anchors []string
	// Lines are the hunk's context, removed and added lines in order.
	Lines []HunkLine
	// EndOfFile is set by "*** End of File": the hunk's old lines must be
	// the last lines of the file.
	EndOfFile bool
	// Line is the 1-based line where the hunk starts in the patch text (or
	// in the operation's diff for the per-file form).
	Line int
}

// LineKind is the first character of a hunk line.
type LineKind byte

// The kinds of hunk lines.
const (
	LineContext LineKind = ' '
	LineAdd     LineKind = '+'
	LineDelete  LineKind = '-'
)

// HunkLine is one line of a hunk, without its prefix character and without
// a line ending.
type HunkLine struct {
	Kind LineKind
	Text string
}

// oldLines returns the texts the hunk expects to find in the file: its
// context and removed lines, in order.
func (h *Hunk) oldLines() []string {
	var old []string
	for _, l := range h.Lines {
		if l.Kind != LineAdd {
			old = append(old, l.Text)
		}
	}
	return old
}

// isInsertion reports whether the hunk only adds lines.
func (h *Hunk) isInsertion() bool {
	for _, l := range h.Lines {
		if l.Kind != LineAdd {
			return false
		}
	}
	return true
}

// Paths returns every path the patch names (operation paths and move
// destinations), in order of first appearance, without duplicates. Callers
// use it to resolve and vet all paths before planning.
func (p *Patch) Paths() []string {
	var paths []string
	seen := make(map[string]bool)
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			paths = append(paths, s)
		}
	}
	for _, op := range p.Ops {
		add(op.Path)
		add(op.MoveTo)
	}
	return paths
}
