package manifest

import (
	"fmt"
	"slices"
)

// Redacted returns a copy of m that is safe to keep in run state, snapshots
// metadata or anywhere else outside the harness:
//
//   - the host paths (src) of local_file and local_dir entries are removed,
//     and their workspace paths listed in Redaction.Sources;
//   - extra path grants are removed, and their paths listed in
//     Redaction.Grants, so that a tampered copy can never grant itself access:
//     grants only come back through Rebind, from the trusted manifest;
//   - secret references stay, as references, with any resolved value dropped.
//
// File contents, descriptions and everything else are kept.
func (m *Manifest) Redacted() *Manifest {
	out := m.Clone()
	var sources, grants []string
	if m.Redaction != nil {
		sources = slices.Clone(m.Redaction.Sources)
		grants = slices.Clone(m.Redaction.Grants)
	}
	walkAll(out.Entries, "entries", "", func(_, full string, e *Entry) {
		if e != nil && e.Type.IsHostSource() && e.Src != "" {
			e.Src = ""
			if !slices.Contains(sources, full) {
				sources = append(sources, full)
			}
		}
	})
	for _, g := range out.ExtraPathGrants {
		if !slices.Contains(grants, g.Path) {
			grants = append(grants, g.Path)
		}
	}
	out.ExtraPathGrants = nil
	for _, s := range out.secretSites() {
		s.set(s.ref.Unresolved())
	}
	if len(sources) > 0 || len(grants) > 0 {
		slices.SortFunc(sources, comparePaths)
		slices.Sort(grants)
		out.Redaction = &Redaction{Sources: sources, Grants: grants}
	}
	return out
}

// Rebind undoes Redacted using the application's trusted manifest: host
// sources and grants are copied back from trusted, which must declare an
// entry of the same type at every redacted source path and exactly the
// redacted grant paths. Secret references stay unresolved. A manifest that
// was not redacted is returned as a copy.
func (m *Manifest) Rebind(trusted *Manifest) (*Manifest, error) {
	out := m.Clone()
	if m.Redaction == nil {
		return out, nil
	}
	for _, p := range m.Redaction.Sources {
		mine, theirs := out.Lookup(p), trusted.Lookup(p)
		switch {
		case mine == nil:
			return nil, fmt.Errorf("manifest: rebind: redacted source %q is not an entry", p)
		case theirs == nil || theirs.Type != mine.Type || theirs.Src == "":
			return nil, fmt.Errorf("manifest: rebind: the trusted manifest has no %s entry with a src at %q", mine.Type, p)
		}
		mine.Src = theirs.Src
	}
	var have []string
	for _, g := range trusted.ExtraPathGrants {
		have = append(have, g.Path)
	}
	slices.Sort(have)
	want := slices.Sorted(slices.Values(m.Redaction.Grants))
	if !slices.Equal(have, want) {
		return nil, fmt.Errorf("manifest: rebind: the trusted manifest grants %q, the redacted one had %q", have, want)
	}
	out.ExtraPathGrants = slices.Clone(trusted.ExtraPathGrants)
	out.Redaction = nil
	return out, nil
}
