package manifest

import (
	"errors"
	"strings"
	"testing"
)

// problemsOf returns the problem strings of a loader error.
func problemsOf(t *testing.T, err error) []string {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	var out []string
	for _, p := range ve.Problems {
		out = append(out, p.Error())
	}
	return out
}

func TestStrictDecodingYAML(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // exact problem strings, in order
	}{
		{"unknown entry field", `
entries:
  src/app.py:
    type: file
    permisions: "0644"
`, []string{`entries["src/app.py"].permisions: unknown field; did you mean "permissions"? (line 5)`}},
		{"unknown top-level field", `
entires: {}
`, []string{`entires: unknown field; did you mean "entries"? (line 2)`}},
		{"field of another entry type", `
entries:
  repo:
    type: dir
    content: hello
`, []string{`entries["repo"].content: unknown field for dir entries (line 5)`}},
		{"unknown field in a child", `
entries:
  repo:
    type: dir
    children:
      task.md:
        type: file
        contnet: x
`, []string{`entries["repo"].children["task.md"].contnet: unknown field; did you mean "content"? (line 8)`}},
		{"unknown field in a user", `
users:
  - name: a
    uuid: 7
`, []string{`users[0].uuid: unknown field for a user; did you mean "uid"? (line 4)`}},
		{"unknown field in a grant", `
extra_path_grants:
  - path: /tmp
    readonly: true
`, []string{`extra_path_grants[0].readonly: unknown field for a path grant; did you mean "read_only"? (line 4)`}},
		{"unknown field in an env value", `
environment:
  A: {value: x, secrets: y}
`, []string{`environment["A"].secrets: unknown field for an environment value; did you mean "secret"? (line 3)`}},
		{"unknown credential field", `
entries:
  d:
    type: s3_mount
    bucket: b
    credentials:
      access_key_id: {secret: id, value: inline}
`, []string{`entries["d"].credentials["access_key_id"].value: unknown field for a secret reference (line 7)`}},
		{"all problems at once", `
rot: /x
entries:
  a: {type: file, mode: "0644"}
  b: {type: dir, ephemeral: "yes"}
users: [{name: a, uid: -1}]
`, []string{
			`rot: unknown field; did you mean "root"? (line 2)`,
			`entries["a"].mode: unknown field (line 4)`,
			`entries["b"].ephemeral: expected true or false, got a string (line 5)`,
			`users[0].uid: expected a whole number between 0 and 4294967295 (line 6)`,
		}},
		{"missing type", `
entries:
  a: {content: x}
`, []string{`entries["a"].type: required (one of: file, dir, local_file, local_dir, git_repo, s3_mount, gcs_mount, r2_mount, azure_blob_mount, s3_files_mount) (line 3)`}},
		{"unknown type", `
entries:
  a: {type: symlink}
`, []string{`entries["a"].type: unknown entry type "symlink" (known: file, dir, local_file, local_dir, git_repo, s3_mount, gcs_mount, r2_mount, azure_blob_mount, s3_files_mount) (line 3)`}},
		{"entry is not a mapping", `
entries:
  a: file
`, []string{`entries["a"]: expected a mapping, got a string (line 3)`}},
		{"entries is a list", `
entries: [a, b]
`, []string{`entries: expected a mapping, got a list (line 2)`}},
		{"bad permissions", `
entries:
  a: {type: file, permissions: rwsr-xr-x}
`, []string{`entries["a"].permissions: permission "rwsr-xr-x" sets setuid, setgid or sticky bits, which are not supported (line 3)`}},
		{"bad base64", `
entries:
  a: {type: file, content_base64: "!!!"}
`, []string{`entries["a"].content_base64: not valid standard base64 (line 3)`}},
		{"both contents", `
entries:
  a: {type: file, content: x, content_base64: eA==}
`, []string{`entries["a"]: set content or content_base64, not both (line 3)`}},
		{"inline credential", `
entries:
  d:
    type: s3_mount
    bucket: b
    credentials:
      secret_access_key: AKIAEXAMPLE
`, []string{`entries["d"].credentials["secret_access_key"]: expected a secret reference such as {secret: NAME}; secrets are never written inline (line 7)`}},
		{"inline git token", `
entries:
  r: {type: git_repo, repo: a/b, ref: main, token: ghp_example}
`, []string{`entries["r"].token: expected a secret reference such as {secret: NAME}; secrets are never written inline (line 3)`}},
		{"mount not ephemeral", `
entries:
  d: {type: gcs_mount, bucket: b, ephemeral: false}
`, []string{`entries["d"].ephemeral: mount entries are always ephemeral (line 3)`}},
		{"region on r2", `
entries:
  d: {type: r2_mount, bucket: b, account: a, region: auto}
`, []string{`entries["d"].region: unknown field for r2_mount entries (line 3)`}},
		{"env value and secret", `
environment:
  A: {value: x, secret: y}
`, []string{`environment["A"]: set either value or secret, not both (line 3)`}},
		{"env value empty mapping", `
environment:
  A: {description: nothing}
`, []string{`environment["A"]: needs a value or a secret (line 3)`}},
		{"env null", `
environment:
  A:
`, []string{`environment["A"]: expected a string or a mapping, got null (line 3)`}},
		{"explicit empty root", `
root: ""
`, []string{`root: empty; omit the field for the default /workspace (line 2)`}},
		{"null root", `
root:
`, []string{`root: null; omit the field for the default /workspace (line 2)`}},
		{"version not a number", `
version: one
`, []string{`version: expected a whole number between 0 and 65536 (line 2)`}},
		{"duplicate key", `
entries:
  a: {type: dir}
  a: {type: file}
`, []string{`duplicate key "a" (line 4)`}},
		{"two documents", "entries: {}\n---\nentries: {}\n", []string{`more than one YAML document; a manifest is a single document (line 2)`}},
		{"empty document", "", []string{`the document is empty; a manifest is a mapping (line 1)`}},
		{"not a mapping", "- a\n- b\n", []string{`expected a mapping, got a list (line 1)`}},
		{"syntax error", "entries: {a: [\n", []string{`invalid YAML: did not find expected node content (line 1)`}},
		{"merge key", "base: &b {type: dir}\n", []string{`base: unknown field (line 1)`}},
		{"merge key use", "entries:\n  a:\n    <<: {type: dir}\n", []string{`merge keys (<<) are not supported (line 3)`}},
		{"binary tag", "entries:\n  a: {type: file, content: !!binary aGk=}\n", []string{`!!binary values are not supported; use content_base64 (line 2)`}},
		{"custom tag", "entries:\n  a: {type: !custom file}\n", []string{`unsupported YAML tag "!custom" (line 2)`}},
		{"alias cycle", "entries: &a\n  x: *a\n", []string{`alias refers to itself (line 2)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTrusted([]byte(tc.doc), FormatYAML)
			if err == nil {
				t.Fatal("LoadTrusted accepted the document")
			}
			got := problemsOf(t, err)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("errors.Is(err, ErrSyntax) = false for %v", err)
			}
		})
	}
}

// TestYAMLSyntaxErrorLine: a YAML syntax error names the line the fault
// is on, not the line of the mapping holding it (yaml.v3 says "line 2" for
// a key indented wrongly on line 5) nor a line past it (an unclosed bracket
// or quote is noticed at the end of the document).
func TestYAMLSyntaxErrorLine(t *testing.T) {
	head := "root: /workspace\nentries:\n  a.txt:\n    type: file\n"
	tail := "\n# more\n\n  b.txt:\n    type: file\n"
	cases := []struct{ name, line5, want string }{
		{"key indented wrongly", "   content: x", "did not find expected key"},
		{"tab indentation", "\tcontent: x", "found a tab character that violates indentation"},
		{"unclosed bracket", "    content: [x", "did not find expected ',' or ']'"},
		{"unclosed quote", `    content: "x`, "found unexpected end of stream"},
		{"mapping in a plain value", "    content: a: b", "mapping values are not allowed in this context"},
		{"list item in a mapping", "  - c.txt", "did not find expected key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := head + tc.line5 + tail
			if got := strings.Split(doc, "\n")[4]; got != tc.line5 {
				t.Fatalf("line 5 of the document is %q", got)
			}
			_, err := LoadTrusted([]byte(doc), FormatYAML)
			got := problemsOf(t, err)
			if want := "invalid YAML: " + tc.want + " (line 5)"; len(got) != 1 || got[0] != want {
				t.Errorf("problems %q, want %q", got, want)
			}
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("errors.Is(err, ErrSyntax) = false for %v", err)
			}
		})
	}
	// A fault on the first line, and one past a long valid flow mapping
	// that spans lines (prefixes of it do not parse on their own).
	_, err := LoadTrusted([]byte("root: [\n"), FormatYAML)
	if got := problemsOf(t, err); len(got) != 1 || !strings.HasSuffix(got[0], "(line 1)") {
		t.Errorf("fault on line 1: %q", got)
	}
	doc := "environment: {A: x,\n  B: y,\n  C: z}\nentries:\n  a.txt:\n   type: file\n  content: x\n     bad: 1\n"
	_, err = LoadTrusted([]byte(doc), FormatYAML)
	if got := problemsOf(t, err); len(got) != 1 || !strings.HasSuffix(got[0], "(line 8)") {
		t.Errorf("fault on line 8 after a flow mapping: %q", got)
	}
}

func TestStrictDecodingJSON(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string
	}{
		{"unknown entry field", `{
  "entries": {
    "src/app.py": {
      "type": "file",
      "permisions": "0644"
    }
  }
}`, []string{`entries["src/app.py"].permisions: unknown field; did you mean "permissions"? (line 5)`}},
		{"permissions must be a string", `{"entries": {"a": {"type": "file", "permissions": 644}}}`,
			[]string{`entries["a"].permissions: expected a string, got a number (line 1)`}},
		{"strings are strings", `{"entries": {"r": {"type": "git_repo", "repo": "a/b", "ref": 2024}}}`,
			[]string{`entries["r"].ref: expected a string, got a number (line 1)`}},
		{"env number", `{"environment": {"PORT": 8080}}`,
			[]string{`environment["PORT"]: expected a string, got a number (line 1)`}},
		{"duplicate key", "{\"entries\": {\n\"a\": {\"type\": \"dir\"},\n\"a\": {\"type\": \"dir\"}}}",
			[]string{`duplicate key "a" (line 3)`}},
		{"trailing data", `{"entries": {}} {"entries": {}}`, []string{`unexpected data after the JSON document (line 1)`}},
		{"truncated", "{\"entries\":\n {\n\n", []string{`invalid JSON: unexpected end of input (line 3)`}},
		{"syntax", "{\"entries\": {,}}", []string{`invalid JSON: invalid character ',' (line 1)`}},
		{"null document", `null`, []string{`the document is empty; a manifest is a mapping (line 1)`}},
		{"uid too large", `{"users": [{"name": "a", "uid": 4294967296}]}`, []string{`users[0].uid: expected a whole number between 0 and 4294967295 (line 1)`}},
		{"uid fraction", `{"users": [{"name": "a", "uid": 1.5}]}`, []string{`users[0].uid: expected a whole number between 0 and 4294967295 (line 1)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTrusted([]byte(tc.doc), FormatJSON)
			if err == nil {
				t.Fatal("LoadTrusted accepted the document")
			}
			got := problemsOf(t, err)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
	// Auto-detection sends a document starting with '{' to the JSON reader.
	_, err := LoadTrusted([]byte(" \n{\"entries\": {\"a\": {\"type\": \"dir\", \"x\": 1}}}"), FormatAuto)
	if got := problemsOf(t, err); len(got) != 1 || got[0] != `entries["a"].x: unknown field (line 2)` {
		t.Errorf("auto-detected JSON: %q", got)
	}
}

func TestDecodeForms(t *testing.T) {
	doc := `
version: 1
users: [analyst, {name: coordinator, uid: 1002}]
groups: [research, {name: ops, gid: 3000}]
environment:
  PORT: 8080
  DEBUG: true
  TZ: UTC
  LONG: {value: x, description: d}
  TOKEN: {secret: api-token}
entries:
  bin: {type: file, content_base64: AAEC/w==}
  empty: {type: file}
  nulls: {type: dir, description: null, children: null}
  r: {type: git_repo, repo: a/b, ref: 2024.01}
  m: {type: s3_mount, bucket: b, read_only: false}
  shared: &tmpl {type: dir, permissions: 0750}
  copy: *tmpl
  oct: {type: file, permissions: 644}
`
	m, err := LoadTrusted([]byte(doc), FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Users) != 2 || m.Users[0].Name != "analyst" || *m.Users[1].UID != 1002 {
		t.Errorf("users = %+v", m.Users)
	}
	if len(m.Groups) != 2 || m.Groups[0].Name != "research" || *m.Groups[1].GID != 3000 {
		t.Errorf("groups = %+v", m.Groups)
	}
	env := m.Environment
	if env["PORT"].Value != "8080" || env["DEBUG"].Value != "true" || env["LONG"].Description != "d" || env["TOKEN"].Secret.Name != "api-token" {
		t.Errorf("environment = %v", env)
	}
	if got := m.Entries["bin"].Content; string(got) != "\x00\x01\x02\xff" {
		t.Errorf("base64 content = %q", got)
	}
	if got := m.Entries["empty"].Content; got == nil || len(got) != 0 {
		t.Errorf("empty file content = %#v", got)
	}
	if m.Entries["r"].Git.Ref != "2024.01" {
		t.Errorf("YAML number as a string: %q", m.Entries["r"].Git.Ref)
	}
	if m.Entries["m"].Mount.IsReadOnly() {
		t.Error("read_only: false ignored")
	}
	if got := m.Entries["copy"].Permissions.Octal(); got != "0750" {
		t.Errorf("alias permissions = %s", got)
	}
	if got := m.Entries["oct"].Permissions.Octal(); got != "0644" {
		t.Errorf("unquoted 644 = %s, want octal 0644", got)
	}
}

// YAML aliases cannot blow up the decoder.
func TestYAMLAliasBomb(t *testing.T) {
	doc := `
a: &a ["x","x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
`
	_, err := LoadUntrusted([]byte(doc), FormatYAML, UntrustedOptions{})
	if got := problemsOf(t, err); len(got) != 1 || !strings.Contains(got[0], "too many values") {
		t.Errorf("alias bomb: %q", got)
	}
}

func TestDeepNesting(t *testing.T) {
	for _, doc := range []string{
		strings.Repeat("[", 100000) + strings.Repeat("]", 100000),
		`{"entries":` + strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5001),
	} {
		_, err := LoadUntrusted([]byte(doc), FormatAuto, UntrustedOptions{})
		if err == nil {
			t.Fatal("deep document accepted")
		}
	}
}

// Problems found after decoding still point into the document.
func TestValidationProblemsHaveLines(t *testing.T) {
	doc := `
users:
  - name: a
    uid: 0
entries:
  repo:
    type: dir
    children:
      ../x: {type: file}
  b:
    type: file
    group: staff
  "c.d":
    type: git_repo
    repo: nope
    ref: main
`
	_, err := LoadTrusted([]byte(doc), FormatYAML)
	want := []string{
		`users[0].uid: uid 0 is root's; declare another id (line 4)`,
		`entries["repo"].children["../x"]: path has a ".." component; entries cannot leave the workspace (line 9)`,
		`entries["b"].group: group "staff" is not declared in groups or users (line 12)`,
		`entries["c.d"].repo: repository must be "owner/name" (line 15)`,
	}
	if got := problemsOf(t, err); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for path, parent := range map[string]string{
		`entries["a.b"].children["c[\"d"].type`: `entries["a.b"].children["c[\"d"]`,
		`entries["a.b"].children["c[\"d"]`:      `entries["a.b"].children`,
		`users[3]`:                              `users`,
		`users`:                                 ``,
	} {
		if got := parentPath(path); got != parent {
			t.Errorf("parentPath(%s) = %s, want %s", path, got, parent)
		}
	}
}
