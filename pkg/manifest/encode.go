package manifest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// omap is an ordered mapping, so that JSON and YAML output share one key
// order (the order of the file format's documentation, not alphabetical).
type omap struct {
	keys []string
	vals []any
}

func (o *omap) add(k string, v any) {
	o.keys = append(o.keys, k)
	o.vals = append(o.vals, v)
}

func (o *omap) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := jsonValue(k)
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		vb, err := jsonValue(o.vals[i])
		if err != nil {
			return nil, err
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// jsonValue encodes v without HTML escaping, so that file contents stay
// readable ("<" rather than "\u003c").
func jsonValue(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// toYAMLNode converts the values built by the wire functions to a YAML node.
func toYAMLNode(v any) *yaml.Node {
	switch x := v.(type) {
	case *omap:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for i, k := range x.keys {
			n.Content = append(n.Content, strNode(k), toYAMLNode(x.vals[i]))
		}
		return n
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, it := range x {
			n.Content = append(n.Content, toYAMLNode(it))
		}
		return n
	case []string:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, it := range x {
			n.Content = append(n.Content, strNode(it))
		}
		return n
	case string:
		return strNode(x)
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(x)}
	case int:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(x)}
	case uint32:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(x), 10)}
	}
	panic("manifest: internal error: no YAML form for a value")
}

func strNode(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if strings.Contains(s, "\n") {
		// The encoder would pick a literal block for any multi-line text,
		// including texts a block cannot hold exactly.
		n.Style = yaml.DoubleQuotedStyle
		if literalSafe(s) {
			n.Style = yaml.LiteralStyle
		}
	}
	return n
}

// literalSafe reports whether s reads back exactly from a YAML literal block
// ("|"): printable lines without leading or trailing blanks. Anything else is
// double-quoted.
func literalSafe(s string) bool {
	for line := range strings.SplitSeq(s, "\n") {
		if line == "" {
			continue
		}
		if strings.IndexByte(" \t", line[0]) >= 0 || strings.IndexByte(" \t", line[len(line)-1]) >= 0 {
			return false
		}
		for _, r := range line {
			if r != '\t' && !unicode.IsPrint(r) {
				return false
			}
		}
	}
	return utf8.ValidString(s)
}

// wire builds the ordered file-format form of m. Secret references are
// written as references; resolved values are unreachable from here.
func (m *Manifest) wire() *omap {
	o := &omap{}
	o.add("version", CurrentVersion)
	if m.Root != "" {
		o.add("root", m.Root)
	}
	if m.RunAs != "" {
		o.add("run_as", m.RunAs)
	}
	if len(m.Environment) > 0 {
		env := &omap{}
		for _, k := range sortedKeys(m.Environment) {
			env.add(k, envWire(m.Environment[k]))
		}
		o.add("environment", env)
	}
	if len(m.Users) > 0 {
		o.add("users", wireList(m.Users, User.wire))
	}
	if len(m.Groups) > 0 {
		o.add("groups", wireList(m.Groups, Group.wire))
	}
	if len(m.ExtraPathGrants) > 0 {
		o.add("extra_path_grants", wireList(m.ExtraPathGrants, PathGrant.wire))
	}
	if m.Redaction != nil {
		r := &omap{}
		if len(m.Redaction.Sources) > 0 {
			r.add("sources", m.Redaction.Sources)
		}
		if len(m.Redaction.Grants) > 0 {
			r.add("grants", m.Redaction.Grants)
		}
		o.add("redacted", r)
	}
	if len(m.Entries) > 0 {
		o.add("entries", entriesWire(m.Entries))
	}
	return o
}

// wireList builds the file-format form of a list of objects.
func wireList[T any](items []T, wire func(T) *omap) []any {
	out := make([]any, len(items))
	for i, it := range items {
		out[i] = wire(it)
	}
	return out
}

// wire builds the file-format form of u.
func (u User) wire() *omap {
	o := &omap{}
	o.add("name", u.Name)
	if u.UID != nil {
		o.add("uid", *u.UID)
	}
	if len(u.Groups) > 0 {
		o.add("groups", u.Groups)
	}
	if u.Home != "" {
		o.add("home", u.Home)
	}
	if u.Shell != "" {
		o.add("shell", u.Shell)
	}
	return o
}

// wire builds the file-format form of g.
func (g Group) wire() *omap {
	o := &omap{}
	o.add("name", g.Name)
	if g.GID != nil {
		o.add("gid", *g.GID)
	}
	return o
}

// wire builds the file-format form of g.
func (g PathGrant) wire() *omap {
	o := &omap{}
	o.add("path", g.Path)
	o.add("read_only", g.ReadOnly)
	if g.Description != "" {
		o.add("description", g.Description)
	}
	return o
}

func entriesWire(entries map[string]*Entry) *omap {
	o := &omap{}
	for _, k := range sortedKeys(entries) {
		if e := entries[k]; e != nil {
			o.add(k, e.wire())
		}
	}
	return o
}

func (e *Entry) wire() *omap {
	o := &omap{}
	o.add("type", string(e.Type))
	if e.Description != "" {
		o.add("description", e.Description)
	}
	if e.Ephemeral {
		o.add("ephemeral", true)
	}
	if e.Group != "" {
		o.add("group", e.Group)
	}
	if e.Permissions != nil {
		o.add("permissions", e.Permissions.String())
	}
	if e.Type == TypeFile || e.Content != nil {
		if utf8.Valid(e.Content) {
			o.add("content", string(e.Content))
		} else {
			o.add("content_base64", base64.StdEncoding.EncodeToString(e.Content))
		}
	}
	if len(e.Children) > 0 {
		o.add("children", entriesWire(e.Children))
	}
	if e.Src != "" {
		o.add("src", e.Src)
	}
	if g := e.Git; g != nil {
		if g.Host != "" {
			o.add("host", g.Host)
		}
		o.add("repo", g.Repo)
		o.add("ref", g.Ref)
		if g.Subpath != "" {
			o.add("subpath", g.Subpath)
		}
		if g.Token != nil {
			o.add("token", secretWire(*g.Token))
		}
	}
	if mt := e.Mount; mt != nil {
		for _, f := range [...]struct{ k, v string }{
			{"bucket", mt.Bucket}, {"account", mt.Account}, {"container", mt.Container},
			{"prefix", mt.Prefix}, {"region", mt.Region}, {"endpoint", mt.Endpoint},
			{"file_system_id", mt.FileSystemID}, {"subpath", mt.Subpath},
			{"mount_target_ip", mt.MountTargetIP}, {"access_point", mt.AccessPoint},
		} {
			if f.v != "" {
				o.add(f.k, f.v)
			}
		}
		if mt.ExtraOptions != nil {
			o.add("extra_options", mt.ExtraOptions)
		}
		if mt.ReadOnly != nil {
			o.add("read_only", *mt.ReadOnly)
		}
		if len(mt.Credentials) > 0 {
			c := &omap{}
			for _, k := range sortedKeys(mt.Credentials) {
				c.add(k, secretWire(mt.Credentials[k]))
			}
			o.add("credentials", c)
		}
	}
	return o
}

// MarshalJSON writes the manifest in its file format. Secrets are written as
// references ({"secret": NAME}), never as resolved values.
func (m Manifest) MarshalJSON() ([]byte, error) { return m.wire().MarshalJSON() }

// MarshalYAML writes the manifest in its file format, like MarshalJSON.
func (m Manifest) MarshalYAML() (any, error) { return toYAMLNode(m.wire()), nil }

// MarshalJSON writes the entry in its file format.
func (e *Entry) MarshalJSON() ([]byte, error) { return e.wire().MarshalJSON() }

// MarshalYAML writes the entry in its file format.
func (e *Entry) MarshalYAML() (any, error) { return toYAMLNode(e.wire()), nil }

// UnmarshalJSON decodes strictly and validates, as LoadTrusted does: it is
// meant for manifests embedded in application configuration or run state.
func (m *Manifest) UnmarshalJSON(data []byte) error {
	out, err := LoadTrusted(data, FormatJSON)
	if err != nil {
		return err
	}
	*m = *out
	return nil
}

// UnmarshalYAML decodes strictly and validates, as LoadTrusted does.
func (m *Manifest) UnmarshalYAML(y *yaml.Node) error {
	c := &yamlConv{budget: 1 << 20, expanding: map[*yaml.Node]bool{}}
	n, ferr := c.node(y, 0)
	if ferr != nil {
		return &ValidationError{Problems: []*FieldError{ferr}}
	}
	out, err := finishTrusted(n)
	if err != nil {
		return err
	}
	*m = *out
	return nil
}

// Marshal writes m in the given format (YAML when FormatAuto), indented by
// two spaces and ending with a newline.
func Marshal(m *Manifest, f Format) ([]byte, error) {
	if f == FormatJSON {
		raw, err := m.wire().MarshalJSON()
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := json.Indent(&b, raw, "", "  "); err != nil {
			return nil, err
		}
		b.WriteByte('\n')
		return b.Bytes(), nil
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(toYAMLNode(m.wire())); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
