package patch

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"unicode/utf8"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Source is a read-only view of the files a patch applies to. Paths are
// passed exactly as the patch wrote them (or, for the parent directories
// Plan checks, as path.Dir of them); resolving and confining them is the
// Source's job. A Source may report a missing file either as
// exists == false or as an error wrapping errkind.ErrNotFound or
// fs.ErrNotExist. Any other error aborts the plan and is kept, wrapped, in
// the returned *Error's Cause.
type Source interface {
	// ReadFile returns the whole content of a regular file.
	ReadFile(path string) ([]byte, error)
	// Exists reports whether something exists at path and whether it is a
	// directory.
	Exists(path string) (exists bool, isDir bool, err error)
}

// Change is the effect of one file operation of the patch; Plan returns one
// Change per operation, in patch order. Committing the Changes in order
// (write Content to Path, or to MoveTo and then remove Path; remove Path for
// OpDelete) yields the patched tree; each Content already includes the
// effect of earlier operations on the same path.
type Change struct {
	Kind OpKind
	// Path is the operation's path as written in the patch.
	Path string
	// MoveTo is set for an OpUpdate that moves the file: Content goes to
	// MoveTo and Path is removed. A move onto the same path (after
	// path.Clean) is reported as a plain update with MoveTo empty; a caller
	// whose paths can alias in other ways (symlinks, absolute and relative
	// spellings) must still not remove Path when it resolves to MoveTo.
	MoveTo string
	// Content is the complete new file for OpAdd and OpUpdate, nil for
	// OpDelete.
	Content []byte
}

// Summary describes the change in one line for the model: "Created p",
// "Updated p", "Moved p to q" or "Deleted p".
func (c Change) Summary() string {
	switch {
	case c.Kind == OpAdd:
		return "Created " + c.Path
	case c.Kind == OpDelete:
		return "Deleted " + c.Path
	case c.MoveTo != "":
		return "Moved " + c.Path + " to " + c.MoveTo
	default:
		return "Updated " + c.Path
	}
}

// Plan computes the result of applying p to the files src shows, entirely in
// memory, and returns one Change per operation. Operations see the effects
// of earlier ones in the same patch (Add then Update, Update twice, Delete
// then Add). Nothing is written; on error no Change is returned, so a patch
// applies completely or not at all.
//
// Semantics: Add File creates or overwrites a file (not a directory) and
// its missing parent directories; Delete File removes an existing regular
// file; Update File needs an existing UTF-8 regular file and, with Move to,
// replaces the destination if it is a file. Plan refuses to create a file
// below an existing file.
//
// Errors are *Error values, see Error for their classes.
func Plan(src Source, p *Patch, opts Options) ([]Change, error) {
	opts = opts.withDefaults()
	if err := validatePatch(p, opts); err != nil {
		return nil, err
	}
	pl := &planner{src: src, opts: opts, nodes: make(map[string]node), budget: opts.MaxScanLines}
	changes := make([]Change, 0, len(p.Ops))
	for i := range p.Ops {
		c, err := pl.apply(&p.Ops[i])
		if err != nil {
			return nil, err
		}
		changes = append(changes, c)
	}
	return changes, nil
}

// validatePatch checks what Parse guarantees, for Patches built by hand.
func validatePatch(p *Patch, opts Options) *Error {
	if p == nil || len(p.Ops) == 0 {
		return syntaxError(0, nil, "the patch contains no file operations")
	}
	if len(p.Ops) > opts.MaxOperations {
		return limitError(OpNameParse, "", "%d file operations, more than the limit of %d", len(p.Ops), opts.MaxOperations)
	}
	for i := range p.Ops {
		op := &p.Ops[i]
		if msg := checkPath(op.Path); msg != "" {
			return syntaxError(op.Line, op, "operation %d: %s", i+1, msg)
		}
		switch op.Kind {
		case OpAdd, OpDelete:
		case OpUpdate:
			if len(op.Hunks) == 0 {
				return syntaxError(op.Line, op, "Update File has no hunks")
			}
			for hi, h := range op.Hunks {
				if len(h.Lines) == 0 {
					return syntaxError(h.Line, op, "hunk %d has no lines", hi+1)
				}
			}
		default:
			return syntaxError(op.Line, op, "operation %d has unknown kind %d", i+1, int(op.Kind))
		}
	}
	return nil
}

// nodeState is what the plan knows about a path.
type nodeState int

const (
	nodeAbsent  nodeState = iota // nothing there
	nodeFile                     // a regular file
	nodeDir                      // a directory
	nodeDeleted                  // a file this patch deleted
)

// node is the plan's version of a path once the patch has touched it.
type node struct {
	state   nodeState
	content []byte // for nodeFile
}

// planner holds the in-memory overlay of one Plan call.
type planner struct {
	src    Source
	opts   Options
	nodes  map[string]node // keyed by pathKey
	total  int             // bytes read plus produced
	budget int             // matcher scan budget left
}

// pathKey identifies a path in the overlay: "a/./b" and "a/b" are one file.
func pathKey(p string) string { return path.Clean(p) }

func (pl *planner) apply(op *FileOp) (Change, *Error) {
	switch op.Kind {
	case OpAdd:
		if err := pl.checkWritable(OpNameAdd, op.Path); err != nil {
			return Change{}, err
		}
		content := append([]byte{}, op.Content...)
		if err := pl.account(OpNameAdd, op.Path, len(content)); err != nil {
			return Change{}, err
		}
		pl.putFile(op.Path, content)
		return Change{Kind: OpAdd, Path: op.Path, Content: content}, nil

	case OpDelete:
		state, err := pl.stat(OpNameDelete, op.Path)
		if err != nil {
			return Change{}, err
		}
		switch state {
		case nodeAbsent, nodeDeleted:
			return Change{}, missingError(OpNameDelete, op.Path, state, "delete")
		case nodeDir:
			return Change{}, rejection(OpNameDelete, op.Path, errkind.ErrIsDirectory, "this is a directory; Delete File only removes files")
		}
		pl.nodes[pathKey(op.Path)] = node{state: nodeDeleted}
		return Change{Kind: OpDelete, Path: op.Path}, nil

	default: // OpUpdate, checked by validatePatch
		old, err := pl.read(op.Path)
		if err != nil {
			return Change{}, err
		}
		if !utf8.Valid(old) {
			return Change{}, rejection(OpNameUpdate, op.Path, nil, "the file is not valid UTF-8 text; apply_patch only edits UTF-8 text files (use Delete File and Add File to replace it)")
		}
		text, err := updateText(op, string(old), &pl.budget)
		if err != nil {
			return Change{}, err
		}
		content := []byte(text)
		if err := pl.account(OpNameUpdate, op.Path, len(content)); err != nil {
			return Change{}, err
		}
		dest := op.MoveTo
		if dest != "" && pathKey(dest) == pathKey(op.Path) {
			dest = "" // moving a file onto itself only updates it
		}
		if dest == "" {
			pl.putFile(op.Path, content)
			return Change{Kind: OpUpdate, Path: op.Path, Content: content}, nil
		}
		if err := pl.checkWritable(OpNameMove, dest); err != nil {
			return Change{}, err
		}
		pl.nodes[pathKey(op.Path)] = node{state: nodeDeleted}
		pl.putFile(dest, content)
		return Change{Kind: OpUpdate, Path: op.Path, MoveTo: dest, Content: content}, nil
	}
}

// stat returns what is at p: from the overlay if the patch touched it,
// otherwise from the Source.
func (pl *planner) stat(opName, p string) (nodeState, *Error) {
	if n, ok := pl.nodes[pathKey(p)]; ok {
		return n.state, nil
	}
	exists, isDir, err := pl.src.Exists(p)
	switch {
	case err != nil && isNotFound(err):
		return nodeAbsent, nil
	case err != nil:
		return nodeAbsent, sourceError(opName, p, err)
	case !exists:
		return nodeAbsent, nil
	case isDir:
		return nodeDir, nil
	}
	return nodeFile, nil
}

// read returns the current content of the file to update at p.
func (pl *planner) read(p string) ([]byte, *Error) {
	state, err := pl.stat(OpNameUpdate, p)
	if err != nil {
		return nil, err
	}
	switch state {
	case nodeAbsent, nodeDeleted:
		return nil, missingError(OpNameUpdate, p, state, "update")
	case nodeDir:
		return nil, rejection(OpNameUpdate, p, errkind.ErrIsDirectory, "this is a directory; Update File only edits files")
	}
	if n, ok := pl.nodes[pathKey(p)]; ok {
		return n.content, nil
	}
	data, rerr := pl.src.ReadFile(p)
	if rerr != nil {
		if isNotFound(rerr) {
			return nil, missingError(OpNameUpdate, p, nodeAbsent, "update")
		}
		return nil, sourceError(OpNameUpdate, p, rerr)
	}
	if err := pl.account(OpNameUpdate, p, len(data)); err != nil {
		return nil, err
	}
	return data, nil
}

// checkWritable refuses a file write at p when a directory is there or when
// the nearest existing ancestor of p is a file.
func (pl *planner) checkWritable(opName, p string) *Error {
	state, err := pl.stat(opName, p)
	if err != nil {
		return err
	}
	if state == nodeDir {
		return rejection(opName, p, errkind.ErrIsDirectory, "a directory exists at this path")
	}
	for dir := path.Dir(p); dir != "." && dir != "/" && dir != p; dir = path.Dir(dir) {
		state, err := pl.stat(opName, dir)
		if err != nil {
			return err
		}
		switch state {
		case nodeDir, nodeDeleted:
			return nil // a deleted file's place can become a directory
		case nodeFile:
			return rejection(opName, p, errkind.ErrNotDirectory, "its parent '%s' is a file, not a directory", dir)
		}
	}
	return nil
}

// putFile records a file in the overlay, and its ancestors as directories.
func (pl *planner) putFile(p string, content []byte) {
	key := pathKey(p)
	pl.nodes[key] = node{state: nodeFile, content: content}
	for dir := path.Dir(key); dir != "." && dir != "/" && dir != key; dir = path.Dir(dir) {
		if pl.nodes[dir].state == nodeDir {
			break
		}
		pl.nodes[dir] = node{state: nodeDir}
	}
}

// account checks a file size against the limits and adds it to the total.
func (pl *planner) account(opName, p string, size int) *Error {
	if size > pl.opts.MaxFileBytes {
		return limitError(opName, p, "the file would be %d bytes, more than the limit of %d", size, pl.opts.MaxFileBytes)
	}
	pl.total += size
	if pl.total > pl.opts.MaxTotalBytes {
		return limitError(opName, p, "the patch reads and writes more than %d bytes in total", pl.opts.MaxTotalBytes)
	}
	return nil
}

// missingError reports a file to update or delete that is not there.
func missingError(opName, p string, state nodeState, verb string) *Error {
	if state == nodeDeleted {
		return rejection(opName, p, errkind.ErrNotFound, "the file to %s was already deleted or moved away earlier in this patch", verb)
	}
	return rejection(opName, p, errkind.ErrNotFound, "the file to %s does not exist%s", verb, addHint(verb))
}

func addHint(verb string) string {
	if verb == "update" {
		return fmt.Sprintf(" (use '%s<path>' to create it)", markerAdd)
	}
	return ""
}

// sourceError wraps a Source failure; its text is not shown (see
// describeCause), only the sentinel it carries.
func sourceError(opName, p string, err error) *Error {
	return rejection(opName, p, err, "cannot access the file")
}

func isNotFound(err error) bool {
	return errors.Is(err, errkind.ErrNotFound) || errors.Is(err, fs.ErrNotExist)
}
