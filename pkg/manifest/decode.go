package manifest

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// decoder turns a node tree into a Manifest, strictly: every unknown field,
// wrong type or malformed value is reported with its field path. It keeps
// going after a problem so that one pass reports them all.
type decoder struct {
	p *problems
}

// decodeManifest decodes a parsed document. The result is meaningful only
// when no problem was added.
func decodeManifest(n *node, p *problems) *Manifest {
	d := &decoder{p: p}
	m := &Manifest{}
	if n.kind == kindNull {
		d.p.add(ErrSyntax, "", n.line, "the document is empty; a manifest is a mapping")
		return m
	}
	if !d.isMap(n, "") {
		return m
	}
	known := topLevelFields()
	d.eachField(n, "", known, d.unknownIn(known, ""), func(k string, v *node, fp string) {
		if v.kind == kindNull {
			if k == "root" {
				d.bad(v, fp, "null; omit the field for the default "+DefaultRoot)
			}
			return
		}
		switch k {
		case "version":
			if x, ok := d.uint(v, fp, 1<<16); ok {
				m.Version = int(x)
			}
		case "root":
			if s, ok := d.str(v, fp); ok {
				if s == "" {
					d.bad(v, fp, "empty; omit the field for the default "+DefaultRoot)
				}
				m.Root = s
			}
		case "run_as":
			m.RunAs, _ = d.str(v, fp)
		case "environment":
			m.Environment = mapping(d, v, fp, d.envValue)
		case "users":
			m.Users = list(d, v, fp, d.user)
		case "groups":
			m.Groups = list(d, v, fp, d.group)
		case "extra_path_grants":
			m.ExtraPathGrants = list(d, v, fp, d.grant)
		case "entries":
			m.Entries = mapping(d, v, fp, d.entry)
		case "redacted":
			m.Redaction = d.redaction(v, fp)
		}
	})
	return m
}

func (d *decoder) bad(n *node, path, msg string) {
	d.p.add(ErrSyntax, path, n.line, msg)
}

func (d *decoder) unknown(path, name string, line int, known []string, context string) {
	msg := "unknown field"
	if context != "" {
		msg += " for " + context
	}
	if s := suggest(name, known); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	d.p.add(ErrSyntax, path, line, msg)
}

// unknownIn returns the usual report of a field not in known, for
// eachField: an unknown field (for context), with the closest known name
// as a suggestion.
func (d *decoder) unknownIn(known []string, context string) func(k, fp string, line int) {
	return func(k, fp string, line int) { d.unknown(fp, k, line, known, context) }
}

// fieldFunc decodes the value v of field k of an object; fp is the
// field's path.
type fieldFunc func(k string, v *node, fp string)

// fields walks the keys of mapping n in document order, the usual way of
// decoding an object of the format: a key not in known is reported as an
// unknown field (for what; see unknown), a null value is skipped as if the
// key were absent, and fn gets every other key.
func (d *decoder) fields(n *node, path string, known []string, what string, fn fieldFunc) {
	d.eachField(n, path, known, d.unknownIn(known, what), skipNulls(fn))
}

// eachField is the walk under fields, for the objects that depart from it:
// report gets each key not in known (with its field path and line), and fn
// every other key, null values included.
func (d *decoder) eachField(n *node, path string, known []string, report func(k, fp string, line int), fn fieldFunc) {
	for i, k := range n.keys {
		fp := fieldPath(path, k)
		if !slices.Contains(known, k) {
			report(k, fp, n.keyLines[i])
			continue
		}
		fn(k, n.items[i], fp)
	}
}

// skipNulls makes fn skip null values, as if their keys were absent.
func skipNulls(fn fieldFunc) fieldFunc {
	return func(k string, v *node, fp string) {
		if v.kind != kindNull {
			fn(k, v, fp)
		}
	}
}

// list decodes list n item by item: item gets each item with its path and
// says whether it gave a value. Anything but a list is reported and gives
// nil; a list gives a non-nil slice, even an empty one.
func list[T any](d *decoder, n *node, path string, item func(it *node, ip string) (T, bool)) []T {
	if !d.isList(n, path) {
		return nil
	}
	out := []T{}
	for i, it := range n.items {
		if v, ok := item(it, indexPath(path, i)); ok {
			out = append(out, v)
		}
	}
	return out
}

// mapping decodes mapping n whose keys are names (of variables, entries,
// credentials), value by value: value gets each value with its key path
// and says whether it gave one. Anything but a mapping is reported and
// gives nil.
func mapping[T any](d *decoder, n *node, path string, value func(v *node, kp string) (T, bool)) map[string]T {
	if !d.isMap(n, path) {
		return nil
	}
	out := make(map[string]T, len(n.keys))
	for i, k := range n.keys {
		if v, ok := value(n.items[i], keyPath(path, k)); ok {
			out[k] = v
		}
	}
	return out
}

func (d *decoder) isMap(n *node, path string) bool {
	if n.kind != kindMap {
		d.bad(n, path, "expected a mapping, got "+n.kind.String())
		return false
	}
	return true
}

func (d *decoder) isList(n *node, path string) bool {
	if n.kind != kindList {
		d.bad(n, path, "expected a list, got "+n.kind.String())
		return false
	}
	return true
}

// str reads a string. In YAML any non-null scalar is taken as its text, as
// YAML users expect (ref: 2024, uid-like names); JSON needs a string.
func (d *decoder) str(n *node, path string) (string, bool) {
	if n.kind == kindString || n.yaml && (n.kind == kindNumber || n.kind == kindBool) {
		return n.text, true
	}
	d.bad(n, path, "expected a string, got "+n.kind.String())
	return "", false
}

func (d *decoder) boolean(n *node, path string) (bool, bool) {
	if n.kind == kindBool {
		return strings.EqualFold(n.text, "true"), true
	}
	d.bad(n, path, "expected true or false, got "+n.kind.String())
	return false, false
}

func (d *decoder) uint(n *node, path string, max uint64) (uint64, bool) {
	if n.kind == kindNumber {
		if x, err := strconv.ParseUint(n.text, 10, 64); err == nil && x <= max {
			return x, true
		}
	}
	d.bad(n, path, fmt.Sprintf("expected a whole number between 0 and %d", max))
	return 0, false
}

// id reads a uid or gid.
func (d *decoder) id(n *node, path string) *uint32 {
	x, ok := d.uint(n, path, 1<<32-1)
	if !ok {
		return nil
	}
	id := uint32(x)
	return &id
}

// strList reads a list of strings.
func (d *decoder) strList(n *node, path string) []string {
	return list(d, n, path, d.str)
}

// secretRef reads {secret: NAME}. Unlike other objects, a null name is
// reported rather than skipped.
func (d *decoder) secretRef(n *node, path string) (SecretRef, bool) {
	if n.kind != kindMap {
		d.bad(n, path, "expected a secret reference such as {secret: NAME}; secrets are never written inline")
		return SecretRef{}, false
	}
	var ref SecretRef
	found := false
	known := []string{"secret"}
	d.eachField(n, path, known, d.unknownIn(known, "a secret reference"), func(_ string, v *node, fp string) {
		if s, ok := d.str(v, fp); ok {
			ref.Name, found = s, true
		}
	})
	if !found {
		d.bad(n, fieldPath(path, "secret"), "required")
	}
	return ref, found
}

// envValue reads the value of an environment variable: a string, or the
// long form (see envLong).
func (d *decoder) envValue(v *node, path string) (EnvValue, bool) {
	switch v.kind {
	case kindMap:
		return d.envLong(v, path), true
	case kindNull:
		d.bad(v, path, "expected a string or a mapping, got null")
		return EnvValue{}, false
	}
	s, ok := d.str(v, path)
	return EnvValue{Value: s}, ok
}

func (d *decoder) envLong(n *node, path string) EnvValue {
	var ev EnvValue
	hasValue := false
	d.fields(n, path, envFields(), "an environment value", func(k string, v *node, fp string) {
		switch k {
		case "value":
			ev.Value, hasValue = d.str(v, fp)
		case "secret":
			if s, ok := d.str(v, fp); ok {
				ref := Secret(s)
				ev.Secret = &ref
			}
		case "description":
			ev.Description, _ = d.str(v, fp)
		}
	})
	switch {
	case hasValue && ev.Secret != nil:
		d.bad(n, path, "set either value or secret, not both")
	case !hasValue && ev.Secret == nil:
		d.bad(n, path, "needs a value or a secret")
	}
	return ev
}

// user reads an item of users: a mapping, or a bare name.
func (d *decoder) user(n *node, path string) (User, bool) {
	if n.kind != kindMap {
		s, ok := d.str(n, path)
		return User{Name: s}, ok
	}
	var u User
	d.fields(n, path, userFields(), "a user", func(k string, v *node, fp string) {
		switch k {
		case "name":
			u.Name, _ = d.str(v, fp)
		case "uid":
			u.UID = d.id(v, fp)
		case "groups":
			u.Groups = d.strList(v, fp)
		case "home":
			u.Home, _ = d.str(v, fp)
		case "shell":
			u.Shell, _ = d.str(v, fp)
		}
	})
	return u, true
}

// group reads an item of groups: a mapping, or a bare name.
func (d *decoder) group(n *node, path string) (Group, bool) {
	if n.kind != kindMap {
		s, ok := d.str(n, path)
		return Group{Name: s}, ok
	}
	var g Group
	d.fields(n, path, groupFields(), "a group", func(k string, v *node, fp string) {
		switch k {
		case "name":
			g.Name, _ = d.str(v, fp)
		case "gid":
			g.GID = d.id(v, fp)
		}
	})
	return g, true
}

// grant reads an item of extra_path_grants.
func (d *decoder) grant(n *node, path string) (PathGrant, bool) {
	if !d.isMap(n, path) {
		return PathGrant{}, false
	}
	var g PathGrant
	d.fields(n, path, grantFields(), "a path grant", func(k string, v *node, fp string) {
		switch k {
		case "path":
			g.Path, _ = d.str(v, fp)
		case "read_only":
			g.ReadOnly, _ = d.boolean(v, fp)
		case "description":
			g.Description, _ = d.str(v, fp)
		}
	})
	return g, true
}

func (d *decoder) redaction(n *node, path string) *Redaction {
	if !d.isMap(n, path) {
		return nil
	}
	r := &Redaction{}
	d.fields(n, path, []string{"sources", "grants"}, "redacted", func(k string, v *node, fp string) {
		switch k {
		case "sources":
			r.Sources = d.strList(v, fp)
		case "grants":
			r.Grants = d.strList(v, fp)
		}
	})
	return r
}

// Field names of the file format, per object. The JSON Schema test checks
// that schema/manifest.schema.json declares exactly these.
func topLevelFields() []string {
	return []string{"version", "root", "run_as", "environment", "users", "groups", "extra_path_grants", "entries", "redacted"}
}

func envFields() []string   { return []string{"value", "secret", "description"} }
func userFields() []string  { return []string{"name", "uid", "groups", "home", "shell"} }
func groupFields() []string { return []string{"name", "gid"} }
func grantFields() []string { return []string{"path", "read_only", "description"} }

// entryFields returns the fields an entry of type t may carry.
func entryFields(t EntryType) []string {
	f := []string{"type", "description", "ephemeral", "group", "permissions"}
	switch {
	case t == TypeFile:
		f = append(f, "content", "content_base64")
	case t == TypeDir:
		f = append(f, "children")
	case t.IsHostSource():
		f = append(f, "src")
	case t == TypeGitRepo:
		f = append(f, "host", "repo", "ref", "subpath", "token")
	case t.IsMount():
		for _, name := range []string{"bucket", "account", "container", "prefix", "region", "endpoint",
			"file_system_id", "subpath", "mount_target_ip", "access_point", "extra_options", "read_only", "credentials"} {
			if mountFieldUse(t, name) > 0 {
				f = append(f, name)
			}
		}
	}
	return f
}

// allEntryFields is the union of entryFields over all types.
func allEntryFields() []string {
	var all []string
	for _, t := range EntryTypes() {
		for _, f := range entryFields(t) {
			if !slices.Contains(all, f) {
				all = append(all, f)
			}
		}
	}
	return all
}

// entry reads an entry: its type first, which says what other fields it
// may have.
func (d *decoder) entry(n *node, path string) (*Entry, bool) {
	if !d.isMap(n, path) {
		return nil, false
	}
	ti := slices.Index(n.keys, "type")
	if ti < 0 {
		d.bad(n, fieldPath(path, "type"), "required (one of: "+typeList()+")")
		return nil, false
	}
	ts, ok := d.str(n.items[ti], fieldPath(path, "type"))
	if !ok {
		return nil, false
	}
	t := EntryType(ts)
	if !t.Known() {
		d.bad(n.items[ti], fieldPath(path, "type"), fmt.Sprintf("unknown entry type %q (known: %s)", ts, typeList()))
		return nil, false
	}
	e := &Entry{Type: t}
	switch {
	case t == TypeFile:
		e.Content = []byte{}
	case t == TypeGitRepo:
		e.Git = &GitRepo{}
	case t.IsMount():
		e.Mount = &Mount{}
	}
	allowed := entryFields(t)
	// A field of other entry types is reported as such, without a
	// suggestion.
	report := func(k, fp string, line int) {
		if slices.Contains(allEntryFields(), k) {
			d.unknown(fp, k, line, nil, string(t)+" entries")
		} else {
			d.unknown(fp, k, line, allowed, "")
		}
	}
	var textSet, b64Set bool
	d.eachField(n, path, allowed, report, skipNulls(func(k string, v *node, fp string) {
		switch k {
		case "type":
			// read above
		case "description":
			e.Description, _ = d.str(v, fp)
		case "group":
			e.Group, _ = d.str(v, fp)
		case "ephemeral":
			e.Ephemeral, _ = d.boolean(v, fp)
			if t.IsMount() && !e.Ephemeral && v.kind == kindBool {
				d.bad(v, fp, "mount entries are always ephemeral")
			}
		case "permissions":
			if s, ok := d.str(v, fp); ok {
				perm, err := ParsePermissions(s)
				if err != nil {
					d.bad(v, fp, err.Error())
				} else {
					e.Permissions = &perm
				}
			}
		case "content":
			if s, ok := d.str(v, fp); ok {
				e.Content, textSet = []byte(s), true
			}
		case "content_base64":
			if s, ok := d.str(v, fp); ok {
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					d.bad(v, fp, "not valid standard base64")
				} else {
					e.Content, b64Set = b, true
				}
			}
		case "children":
			e.Children = mapping(d, v, fp, d.entry)
		case "src":
			e.Src, _ = d.str(v, fp)
		case "host":
			e.Git.Host, _ = d.str(v, fp)
		case "repo":
			e.Git.Repo, _ = d.str(v, fp)
		case "ref":
			e.Git.Ref, _ = d.str(v, fp)
		case "subpath":
			if e.Mount != nil {
				e.Mount.Subpath, _ = d.str(v, fp)
			} else {
				e.Git.Subpath, _ = d.str(v, fp)
			}
		case "file_system_id":
			e.Mount.FileSystemID, _ = d.str(v, fp)
		case "mount_target_ip":
			e.Mount.MountTargetIP, _ = d.str(v, fp)
		case "access_point":
			e.Mount.AccessPoint, _ = d.str(v, fp)
		case "extra_options":
			e.Mount.ExtraOptions = d.strList(v, fp)
		case "token":
			if ref, ok := d.secretRef(v, fp); ok {
				e.Git.Token = &ref
			}
		case "bucket":
			e.Mount.Bucket, _ = d.str(v, fp)
		case "account":
			e.Mount.Account, _ = d.str(v, fp)
		case "container":
			e.Mount.Container, _ = d.str(v, fp)
		case "prefix":
			e.Mount.Prefix, _ = d.str(v, fp)
		case "region":
			e.Mount.Region, _ = d.str(v, fp)
		case "endpoint":
			e.Mount.Endpoint, _ = d.str(v, fp)
		case "read_only":
			if b, ok := d.boolean(v, fp); ok {
				e.Mount.ReadOnly = &b
			}
		case "credentials":
			e.Mount.Credentials = mapping(d, v, fp, d.secretRef)
		}
	}))
	if textSet && b64Set {
		d.bad(n, path, "set content or content_base64, not both")
	}
	return e, true
}

// suggest returns the known name closest to name when it is a likely typo.
func suggest(name string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		if dist := editDistance(name, k); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
