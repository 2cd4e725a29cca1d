package patch

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// memTree is an in-memory directory tree: the Source used by the tests, and
// the target of commit, which plays the daemon's part of writing Changes.
type memTree struct {
	files map[string][]byte
	dirs  map[string]bool
}

func newMemTree(files map[string]string, dirs ...string) *memTree {
	t := &memTree{files: map[string][]byte{}, dirs: map[string]bool{}}
	for p, c := range files {
		t.files[path.Clean(p)] = []byte(c)
		t.addParents(p)
	}
	for _, d := range dirs {
		t.dirs[path.Clean(d)] = true
		t.addParents(d)
	}
	return t
}

func (t *memTree) addParents(p string) {
	for d := path.Dir(path.Clean(p)); d != "." && d != "/"; d = path.Dir(d) {
		t.dirs[d] = true
	}
}

func (t *memTree) ReadFile(p string) ([]byte, error) {
	k := path.Clean(p)
	if t.dirs[k] {
		return nil, &errkind.PathError{Op: "read", Path: p, Err: errkind.ErrIsDirectory}
	}
	b, ok := t.files[k]
	if !ok {
		return nil, &errkind.PathError{Op: "read", Path: p, Err: errkind.ErrNotFound}
	}
	return bytes.Clone(b), nil
}

func (t *memTree) Exists(p string) (bool, bool, error) {
	k := path.Clean(p)
	if t.dirs[k] {
		return true, true, nil
	}
	_, ok := t.files[k]
	return ok, false, nil
}

func (t *memTree) clone() *memTree {
	c := &memTree{files: map[string][]byte{}, dirs: map[string]bool{}}
	for k, v := range t.files {
		c.files[k] = bytes.Clone(v)
	}
	for k := range t.dirs {
		c.dirs[k] = true
	}
	return c
}

// commit applies changes in order, as the daemon would.
func (t *memTree) commit(changes []Change) error {
	for _, c := range changes {
		switch c.Kind {
		case OpAdd:
			if err := t.write(c.Path, c.Content); err != nil {
				return err
			}
		case OpUpdate:
			if c.MoveTo == "" {
				if err := t.write(c.Path, c.Content); err != nil {
					return err
				}
				continue
			}
			if err := t.write(c.MoveTo, c.Content); err != nil {
				return err
			}
			delete(t.files, path.Clean(c.Path))
		case OpDelete:
			k := path.Clean(c.Path)
			if _, ok := t.files[k]; !ok {
				return fmt.Errorf("commit: delete %s: no such file", c.Path)
			}
			delete(t.files, k)
		}
	}
	return nil
}

func (t *memTree) write(p string, content []byte) error {
	k := path.Clean(p)
	if t.dirs[k] {
		return fmt.Errorf("commit: write %s: is a directory", p)
	}
	for d := path.Dir(k); d != "." && d != "/"; d = path.Dir(d) {
		if _, isFile := t.files[d]; isFile {
			return fmt.Errorf("commit: write %s: parent %s is a file", p, d)
		}
	}
	t.addParents(k)
	t.files[k] = bytes.Clone(content)
	return nil
}

// diff describes how t differs from want, or returns "".
func (t *memTree) diff(want *memTree) string {
	var out []string
	for k, w := range want.files {
		g, ok := t.files[k]
		switch {
		case !ok:
			out = append(out, "missing file "+k)
		case !bytes.Equal(g, w):
			out = append(out, fmt.Sprintf("file %s = %q, want %q", k, g, w))
		}
	}
	for k := range t.files {
		if _, ok := want.files[k]; !ok {
			out = append(out, "extra file "+k)
		}
	}
	for k := range want.dirs {
		if !t.dirs[k] {
			out = append(out, "missing directory "+k)
		}
	}
	for k := range t.dirs {
		if !want.dirs[k] {
			out = append(out, "extra directory "+k)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// loadTree reads a directory from disk into a memTree; a missing directory
// gives an empty tree.
func loadTree(root string) (*memTree, error) {
	t := newMemTree(nil)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			t.dirs[rel] = true
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		t.files[rel] = b
		return nil
	})
	if os.IsNotExist(err) {
		return t, nil
	}
	return t, err
}
