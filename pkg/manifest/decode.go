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
	for i, k := range n.keys {
		v, fp := n.items[i], fieldPath("", k)
		if !slices.Contains(known, k) {
			d.unknown(fp, n.keys[i], n.keyLines[i], known, "")
			continue
		}
		if v.kind == kindNull {
			if k == "root" {
				d.bad(v, fp, "null; omit the field for the default "+DefaultRoot)
			}
			continue
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
			m.Environment = d.environment(v, fp)
		case "users":
			m.Users = d.users(v, fp)
		case "groups":
			m.Groups = d.groups(v, fp)
		case "extra_path_grants":
			m.ExtraPathGrants = d.grants(v, fp)
		case "entries":
			m.Entries = d.entries(v, fp)
		case "redacted":
			m.Redaction = d.redaction(v, fp)
		}
	}
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

func (d *decoder) strList(n *node, path string) []string {
	if !d.isList(n, path) {
		return nil
	}
	out := []string{}
	for i, it := range n.items {
		if s, ok := d.str(it, indexPath(path, i)); ok {
			out = append(out, s)
		}
	}
	return out
}

func (d *decoder) secretRef(n *node, path string) (SecretRef, bool) {
	if n.kind != kindMap {
		d.bad(n, path, "expected a secret reference such as {secret: NAME}; secrets are never written inline")
		return SecretRef{}, false
	}
	var ref SecretRef
	found := false
	for i, k := range n.keys {
		fp := fieldPath(path, k)
		if k != "secret" {
			d.unknown(fp, n.keys[i], n.keyLines[i], []string{"secret"}, "a secret reference")
			continue
		}
		if s, ok := d.str(n.items[i], fp); ok {
			ref.Name, found = s, true
		}
	}
	if !found {
		d.bad(n, fieldPath(path, "secret"), "required")
	}
	return ref, found
}

func (d *decoder) environment(n *node, path string) map[string]EnvValue {
	if !d.isMap(n, path) {
		return nil
	}
	out := make(map[string]EnvValue, len(n.keys))
	for i, name := range n.keys {
		v, fp := n.items[i], keyPath(path, name)
		switch {
		case v.kind == kindMap:
			out[name] = d.envLong(v, fp)
		case v.kind == kindNull:
			d.bad(v, fp, "expected a string or a mapping, got null")
		default:
			if s, ok := d.str(v, fp); ok {
				out[name] = EnvValue{Value: s}
			}
		}
	}
	return out
}

func (d *decoder) envLong(n *node, path string) EnvValue {
	var ev EnvValue
	hasValue := false
	known := envFields()
	for i, k := range n.keys {
		v, fp := n.items[i], fieldPath(path, k)
		if !slices.Contains(known, k) {
			d.unknown(fp, n.keys[i], n.keyLines[i], known, "an environment value")
			continue
		}
		if v.kind == kindNull {
			continue
		}
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
	}
	switch {
	case hasValue && ev.Secret != nil:
		d.bad(n, path, "set either value or secret, not both")
	case !hasValue && ev.Secret == nil:
		d.bad(n, path, "needs a value or a secret")
	}
	return ev
}

func (d *decoder) users(n *node, path string) []User {
	if !d.isList(n, path) {
		return nil
	}
	out := []User{}
	known := userFields()
	for i, it := range n.items {
		fp := indexPath(path, i)
		if it.kind != kindMap {
			if s, ok := d.str(it, fp); ok {
				out = append(out, User{Name: s})
			}
			continue
		}
		var u User
		for j, k := range it.keys {
			v, kp := it.items[j], fieldPath(fp, k)
			if !slices.Contains(known, k) {
				d.unknown(kp, it.keys[j], it.keyLines[j], known, "a user")
				continue
			}
			if v.kind == kindNull {
				continue
			}
			switch k {
			case "name":
				u.Name, _ = d.str(v, kp)
			case "uid":
				if x, ok := d.uint(v, kp, 1<<32-1); ok {
					id := uint32(x)
					u.UID = &id
				}
			case "groups":
				u.Groups = d.strList(v, kp)
			case "home":
				u.Home, _ = d.str(v, kp)
			case "shell":
				u.Shell, _ = d.str(v, kp)
			}
		}
		out = append(out, u)
	}
	return out
}

func (d *decoder) groups(n *node, path string) []Group {
	if !d.isList(n, path) {
		return nil
	}
	out := []Group{}
	known := groupFields()
	for i, it := range n.items {
		fp := indexPath(path, i)
		if it.kind != kindMap {
			if s, ok := d.str(it, fp); ok {
				out = append(out, Group{Name: s})
			}
			continue
		}
		var g Group
		for j, k := range it.keys {
			v, kp := it.items[j], fieldPath(fp, k)
			if !slices.Contains(known, k) {
				d.unknown(kp, it.keys[j], it.keyLines[j], known, "a group")
				continue
			}
			if v.kind == kindNull {
				continue
			}
			switch k {
			case "name":
				g.Name, _ = d.str(v, kp)
			case "gid":
				if x, ok := d.uint(v, kp, 1<<32-1); ok {
					id := uint32(x)
					g.GID = &id
				}
			}
		}
		out = append(out, g)
	}
	return out
}

func (d *decoder) grants(n *node, path string) []PathGrant {
	if !d.isList(n, path) {
		return nil
	}
	out := []PathGrant{}
	known := grantFields()
	for i, it := range n.items {
		fp := indexPath(path, i)
		if !d.isMap(it, fp) {
			continue
		}
		var g PathGrant
		for j, k := range it.keys {
			v, kp := it.items[j], fieldPath(fp, k)
			if !slices.Contains(known, k) {
				d.unknown(kp, it.keys[j], it.keyLines[j], known, "a path grant")
				continue
			}
			if v.kind == kindNull {
				continue
			}
			switch k {
			case "path":
				g.Path, _ = d.str(v, kp)
			case "read_only":
				g.ReadOnly, _ = d.boolean(v, kp)
			case "description":
				g.Description, _ = d.str(v, kp)
			}
		}
		out = append(out, g)
	}
	return out
}

func (d *decoder) redaction(n *node, path string) *Redaction {
	if !d.isMap(n, path) {
		return nil
	}
	r := &Redaction{}
	known := []string{"sources", "grants"}
	for i, k := range n.keys {
		v, fp := n.items[i], fieldPath(path, k)
		if !slices.Contains(known, k) {
			d.unknown(fp, n.keys[i], n.keyLines[i], known, "redacted")
			continue
		}
		if v.kind == kindNull {
			continue
		}
		switch k {
		case "sources":
			r.Sources = d.strList(v, fp)
		case "grants":
			r.Grants = d.strList(v, fp)
		}
	}
	return r
}

func (d *decoder) entries(n *node, path string) map[string]*Entry {
	if !d.isMap(n, path) {
		return nil
	}
	out := make(map[string]*Entry, len(n.keys))
	for i, k := range n.keys {
		if e := d.entry(n.items[i], keyPath(path, k)); e != nil {
			out[k] = e
		}
	}
	return out
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

func (d *decoder) entry(n *node, path string) *Entry {
	if !d.isMap(n, path) {
		return nil
	}
	ti := slices.Index(n.keys, "type")
	if ti < 0 {
		d.bad(n, fieldPath(path, "type"), "required (one of: "+typeList()+")")
		return nil
	}
	ts, ok := d.str(n.items[ti], fieldPath(path, "type"))
	if !ok {
		return nil
	}
	t := EntryType(ts)
	if !t.Known() {
		d.bad(n.items[ti], fieldPath(path, "type"), fmt.Sprintf("unknown entry type %q (known: %s)", ts, typeList()))
		return nil
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
	var textSet, b64Set bool
	for i, k := range n.keys {
		v, fp := n.items[i], fieldPath(path, k)
		if k == "type" {
			continue
		}
		if !slices.Contains(allowed, k) {
			if slices.Contains(allEntryFields(), k) {
				d.unknown(fp, n.keys[i], n.keyLines[i], nil, string(t)+" entries")
			} else {
				d.unknown(fp, n.keys[i], n.keyLines[i], allowed, "")
			}
			continue
		}
		if v.kind == kindNull {
			continue
		}
		switch k {
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
			e.Children = d.entries(v, fp)
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
			e.Mount.Credentials = d.credentials(v, fp)
		}
	}
	if textSet && b64Set {
		d.bad(n, path, "set content or content_base64, not both")
	}
	return e
}

func (d *decoder) credentials(n *node, path string) map[string]SecretRef {
	if !d.isMap(n, path) {
		return nil
	}
	out := make(map[string]SecretRef, len(n.keys))
	for i, k := range n.keys {
		if ref, ok := d.secretRef(n.items[i], keyPath(path, k)); ok {
			out[k] = ref
		}
	}
	return out
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
