package skills

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// namePattern is what a skill name looks like: lowercase letters and
// digits in groups joined by single hyphens (the Agent Skills convention),
// so a name is always a safe single path component.
var namePattern = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// BundleError is a bundle that failed validation.
type BundleError struct {
	// Bundle is the bundle's directory name.
	Bundle string
	// Source describes where it was read from (a host directory or a git
	// repository).
	Source string
	// Problem says what is wrong.
	Problem string
}

func (e *BundleError) Error() string {
	return fmt.Sprintf("skills: bundle %q in %s: %s", e.Bundle, e.Source, e.Problem)
}

// bundle is one validated skill, held in memory.
type bundle struct {
	name        string
	description string
	source      string
	body        string // SKILL.md after its frontmatter
	files       []file // sorted by path; SKILL.md among them
	size        int64
}

// file is one file of a bundle.
type file struct {
	path string // relative to the bundle, slash-separated
	data []byte
	exec bool
}

// limits are the size bounds; used counts the bytes read so far.
type limits struct {
	skillFile, bundle, total int64
	files                    int
	used                     int64
}

// readDir reads the bundles of a host directory.
func readDir(dir string, lim *limits) ([]*bundle, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("skills: opening the skills directory: %w", err)
	}
	defer root.Close()
	return readBundles(root, "directory "+dir, lim)
}

// readBundles reads every bundle directly under root. Reads go through
// root, so no symlink can lead outside it; symlinks inside bundles are
// refused anyway.
func readBundles(root *os.Root, source string, lim *limits) ([]*bundle, error) {
	fsys := root.FS()
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("skills: listing %s: %w", source, err)
	}
	var out []*bundle
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			return nil, &BundleError{Bundle: name, Source: source, Problem: "is a symbolic link; bundles must be real directories"}
		case !e.IsDir():
			continue // a README or licence next to the bundles
		}
		b, err := readBundle(fsys, name, source, lim)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("skills: no skill bundles in %s (expected subdirectories holding a %s)", source, SkillFile)
	}
	return out, nil
}

// readBundle reads and validates the bundle in directory dir of fsys.
func readBundle(fsys fs.FS, dir, source string, lim *limits) (*bundle, error) {
	bad := func(format string, args ...any) error {
		return &BundleError{Bundle: dir, Source: source, Problem: fmt.Sprintf(format, args...)}
	}
	b := &bundle{source: source}
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
		if rel == "" {
			return nil
		}
		if verr := manifest.ValidateEntryPath(rel); verr != nil {
			return bad("file %q: %v", rel, verr)
		}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			return bad("%q is a symbolic link; bundles may hold only regular files and directories", rel)
		case t.IsDir():
			return nil
		case !t.IsRegular():
			return bad("%q is not a regular file", rel)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if len(b.files) >= lim.files {
			return bad("has more than %d files", lim.files)
		}
		max := lim.bundle - b.size
		if rel == SkillFile {
			max = min(max, lim.skillFile)
		}
		data, err := readLimited(fsys, p, max)
		if errors.Is(err, errTooLarge) {
			if rel == SkillFile && info.Size() > lim.skillFile {
				return bad("%s is larger than %d bytes", SkillFile, lim.skillFile)
			}
			return bad("its files together are larger than %d bytes", lim.bundle)
		}
		if err != nil {
			return err
		}
		b.size += int64(len(data))
		if lim.used+b.size > lim.total {
			return bad("the skills together are larger than %d bytes", lim.total)
		}
		b.files = append(b.files, file{path: rel, data: data, exec: info.Mode().Perm()&0o111 != 0})
		return nil
	})
	if err != nil {
		var be *BundleError
		if errors.As(err, &be) {
			return nil, err
		}
		return nil, bad("%v", err)
	}
	i := slices.IndexFunc(b.files, func(f file) bool { return f.path == SkillFile })
	if i < 0 {
		return nil, bad("has no %s", SkillFile)
	}
	meta, body, err := parseSkillFile(b.files[i].data)
	if err != nil {
		return nil, bad("%s: %v", SkillFile, err)
	}
	if meta.name != dir {
		return nil, bad("%s names the skill %q; the name must match the bundle's directory name", SkillFile, meta.name)
	}
	b.name, b.description, b.body = meta.name, meta.description, body
	slices.SortFunc(b.files, func(x, y file) int { return strings.Compare(x.path, y.path) })
	lim.used += b.size
	return b, nil
}

// errTooLarge reports a file over its cap.
var errTooLarge = errors.New("file too large")

// readLimited reads a file of at most max bytes.
func readLimited(fsys fs.FS, p string, max int64) ([]byte, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, errTooLarge
	}
	return data, nil
}

// frontmatter is what the index needs from a SKILL.md.
type frontmatter struct {
	name, description string
}

// parseSkillFile splits a SKILL.md into its YAML frontmatter (between a
// first line "---" and the next line "---") and its body, and checks the
// name and description. Other frontmatter keys are allowed and ignored.
func parseSkillFile(data []byte) (frontmatter, string, error) {
	var fm frontmatter
	if !utf8.Valid(data) {
		return fm, "", errors.New("is not valid UTF-8")
	}
	text := strings.TrimPrefix(string(data), "\ufeff")
	first, rest, ok := strings.Cut(text, "\n")
	if !ok || strings.TrimRight(first, "\r") != "---" {
		return fm, "", errors.New(`must start with a YAML frontmatter block ("---" line, name and description, "---" line)`)
	}
	var yamlText, body string
	found := false
	for off := 0; off <= len(rest); {
		line, next, more := strings.Cut(rest[off:], "\n")
		if strings.TrimRight(line, " \t\r") == "---" {
			yamlText, body, found = rest[:off], next, true
			break
		}
		if !more {
			break
		}
		off += len(line) + 1
	}
	if !found {
		return fm, "", errors.New(`the frontmatter block has no closing "---" line`)
	}
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(yamlText), &raw); err != nil {
		return fm, "", fmt.Errorf("the frontmatter is not valid YAML: %v", err)
	}
	str := func(key string) (string, error) {
		v, ok := raw[key]
		if !ok || v == nil {
			return "", fmt.Errorf("the frontmatter has no %q", key)
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("the frontmatter's %q must be a string", key)
		}
		return s, nil
	}
	name, err := str("name")
	if err != nil {
		return fm, "", err
	}
	if len(name) > MaxNameBytes || !namePattern.MatchString(name) {
		return fm, "", fmt.Errorf("name %q is not a valid skill name (lowercase letters, digits and single hyphens, at most %d characters)",
			name, MaxNameBytes)
	}
	desc, err := str("description")
	if err != nil {
		return fm, "", err
	}
	desc = strings.Join(strings.Fields(desc), " ")
	switch {
	case desc == "":
		return fm, "", errors.New("the description is empty")
	case len(desc) > MaxDescriptionBytes:
		return fm, "", fmt.Errorf("the description is longer than %d bytes", MaxDescriptionBytes)
	case strings.IndexFunc(desc, unicode.IsControl) >= 0:
		return fm, "", errors.New("the description contains a control character")
	}
	fm.name, fm.description = name, desc
	return fm, strings.TrimLeft(body, "\r\n"), nil
}

// dirEntry renders b as the manifest entry of its directory: nested dir
// entries holding inline file entries, with the files' modes.
func (b *bundle) dirEntry() *manifest.Entry {
	dirPerm := manifest.PermissionsFromMode(fs.ModeDir | 0o755)
	top := &manifest.Entry{Type: manifest.TypeDir, Description: b.description, Permissions: &dirPerm}
	for _, f := range b.files {
		parent := top
		parts := strings.Split(f.path, "/")
		for _, c := range parts[:len(parts)-1] {
			child := parent.Children[c]
			if child == nil {
				p := dirPerm
				child = &manifest.Entry{Type: manifest.TypeDir, Permissions: &p}
				if parent.Children == nil {
					parent.Children = map[string]*manifest.Entry{}
				}
				parent.Children[c] = child
			}
			parent = child
		}
		perm := manifest.PermissionsFromMode(fileMode(f))
		if parent.Children == nil {
			parent.Children = map[string]*manifest.Entry{}
		}
		parent.Children[path.Base(f.path)] = &manifest.Entry{Type: manifest.TypeFile, Content: bytes.Clone(f.data), Permissions: &perm}
	}
	return top
}

// fileMode is the mode a staged file gets: executable files stay
// executable; nothing is writable by others.
func fileMode(f file) fs.FileMode {
	if f.exec {
		return 0o755
	}
	return 0o644
}
