package manifest

import (
	"cmp"
	"io/fs"
	"slices"
)

// item is one entry with its full workspace-relative path and the field path
// used in error messages.
type item struct {
	path  string
	field string
	e     *Entry
}

// flatten lists every entry of m (dir children included) in walk order and
// reports entry keys that are not valid paths (their subtrees are skipped).
func (m *Manifest) flatten(probs *problems) []item {
	var out []item
	var rec func(prefix, field string, entries map[string]*Entry)
	rec = func(prefix, field string, entries map[string]*Entry) {
		for _, k := range sortedKeys(entries) {
			fp := keyPath(field, k)
			if err := ValidateEntryPath(k); err != nil {
				probs.invalid(fp, err.Error())
				continue
			}
			e := entries[k]
			if e == nil {
				probs.invalid(fp, "entry is empty (null)")
				continue
			}
			full := k
			if prefix != "" {
				full = prefix + "/" + k
			}
			out = append(out, item{path: full, field: fp, e: e})
			if len(e.Children) > 0 {
				rec(full, fieldPath(fp, "children"), e.Children)
			}
		}
	}
	rec("", "entries", m.Entries)
	slices.SortStableFunc(out, func(a, b item) int { return comparePaths(a.path, b.path) })
	return out
}

// comparePaths orders paths component by component, so that a directory
// sorts directly before everything below it ("a" < "a/b" < "a-b").
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		return cmp.Compare(ca, cb)
	}
	return cmp.Compare(len(a), len(b))
}

// walkAll visits every entry, children included, in sorted key order,
// without validating anything; full paths are joined as written.
func walkAll(entries map[string]*Entry, field, prefix string, fn func(field, full string, e *Entry)) {
	for _, k := range sortedKeys(entries) {
		e := entries[k]
		fp := keyPath(field, k)
		full := k
		if prefix != "" {
			full = prefix + "/" + k
		}
		fn(fp, full, e)
		if e != nil && len(e.Children) > 0 {
			walkAll(e.Children, fieldPath(fp, "children"), full, fn)
		}
	}
}

// Walk calls fn for every entry of m, dir children included, with its full
// workspace-relative path. Parents come before their children, and the order
// is deterministic: paths sorted component by component. If fn returns
// fs.SkipDir, the entries below that path are skipped; any other error stops
// the walk and is returned. Walk returns a *ValidationError without calling
// fn when an entry key is not a valid path.
func (m *Manifest) Walk(fn func(path string, e *Entry) error) error {
	var probs problems
	items := m.flatten(&probs)
	if err := probs.err(); err != nil {
		return err
	}
	skip := ""
	for _, it := range items {
		if skip != "" && isUnder(it.path, skip) {
			continue
		}
		skip = ""
		if err := fn(it.path, it.e); err != nil {
			if err == fs.SkipDir {
				skip = it.path
				continue
			}
			return err
		}
	}
	return nil
}

// Lookup returns the entry at the workspace-relative path p (which may be a
// dir child), or nil.
func (m *Manifest) Lookup(p string) *Entry {
	var probs problems
	for _, it := range m.flatten(&probs) {
		if it.path == p {
			return it.e
		}
	}
	return nil
}

// EphemeralPaths returns the workspace-relative paths that snapshots must
// leave out: ephemeral entries and mounts, reduced to the outermost ones
// (an ephemeral directory covers everything below it), in walk order.
// Entries with invalid paths are ignored; call Validate first.
func (m *Manifest) EphemeralPaths() []string {
	var probs problems
	var out []string
	for _, it := range m.flatten(&probs) {
		if !it.e.IsEphemeral() {
			continue
		}
		// Walk order keeps a subtree right after its root, so only the
		// last path kept can cover this one.
		if len(out) > 0 && isUnder(it.path, out[len(out)-1]) {
			continue
		}
		out = append(out, it.path)
	}
	return out
}

// MountPaths returns the workspace-relative paths of all mount entries in
// walk order (parents first; unmount in reverse order).
func (m *Manifest) MountPaths() []string {
	var probs problems
	var out []string
	for _, it := range m.flatten(&probs) {
		if it.e.Type.IsMount() {
			out = append(out, it.path)
		}
	}
	return out
}
