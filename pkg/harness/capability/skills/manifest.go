package skills

import (
	"fmt"
	"path"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// ProcessManifest claims the skills' place in the workspace. In lazy mode
// it only checks that no entry of m is at or below the staging path (the
// skills are written there later) and returns m. In eager mode it returns
// a copy of m with one dir entry per skill at <Path>/<name>, holding the
// bundle's files as inline file entries (the bytes read when the
// capability was built; no host path enters the manifest).
//
// An entry above a claimed path must be a plain dir entry: a file, a mount
// or a copied tree there is an error.
func (s *Skills) ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error) {
	var claims []string
	if s.opts.Mode == Lazy {
		claims = []string{s.opts.Path}
	} else {
		for _, b := range s.bundles {
			claims = append(claims, s.dir(b))
		}
	}
	err := m.Walk(func(p string, e *manifest.Entry) error {
		for _, c := range claims {
			switch {
			case p == c || strings.HasPrefix(p, c+"/"):
				return fmt.Errorf("skills: the manifest already has an entry at %q, where skills are staged (%s)", p, c)
			case strings.HasPrefix(c, p+"/") && e.Type != manifest.TypeDir:
				return fmt.Errorf("skills: the manifest's %s entry %q is above %q, where skills are staged; only a dir entry may be there",
					e.Type, p, c)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.opts.Mode == Lazy {
		return m, nil
	}
	out := m.Clone()
	if out.Entries == nil {
		out.Entries = map[string]*manifest.Entry{}
	}
	for _, b := range s.bundles {
		out.Entries[path.Join(s.opts.Path, b.name)] = b.dirEntry()
	}
	return out, nil
}
