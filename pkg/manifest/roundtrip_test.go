package manifest

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// awkwardStrings are texts YAML and JSON writers commonly get wrong.
func awkwardStrings() []string {
	return []string{
		"", "true", "false", "null", "~", "0755", "0o17", "1e3", ".inf", "- x", "a: b", "#comment", "key: [v]",
		"\r\n", "a\rb", "trailing  \n", "  leading\n", "tab\there\n", "\t\n", "multi\nline\nno newline at end",
		"\n\nleading newlines\n", "ends with spaces   ", "line\n  indented\n", "'single", "\"double", "|", ">", "*alias",
		"&anchor", "!tag", "%percent", "@at", "`tick", "---", "...", "unicode ü 😀\n", "\u0085nel\u2028ls", "\x00nul\x01",
		"<html>&amp;</html>", strings.Repeat("long line ", 200) + "\n", "\xef\xbb\xbfbom",
	}
}

// canonical returns what Marshal produces for m in format f after a reload:
// the canonical form, which must be a fixed point.
func roundTrip(t *testing.T, m *Manifest, f Format) *Manifest {
	t.Helper()
	out, err := Marshal(m, f)
	if err != nil {
		t.Fatalf("Marshal %s: %v", f, err)
	}
	back, err := LoadTrusted(out, f)
	if err != nil {
		t.Fatalf("reloading %s output: %v\n%s", f, err, out)
	}
	again, err := Marshal(back, f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, again) {
		t.Fatalf("%s output is not stable:\n%s\n---\n%s", f, out, again)
	}
	return back
}

func TestRoundTrip(t *testing.T) {
	m := validManifest()
	m.Version = 1
	for i, s := range awkwardStrings() {
		key := "files/f" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		m.Entries[key] = &Entry{Type: TypeFile, Content: []byte(s)}
		if !strings.ContainsRune(s, 0) {
			m.Environment["AWK_"+strings.ToUpper(key[7:])] = EnvValue{Value: s, Description: strings.ToValidUTF8(s, "?")}
		}
	}
	m.Entries["bin"] = &Entry{Type: TypeFile, Content: []byte{0xff, 0xfe, 0, 1}, Description: "binary"}
	m.Entries["data/s3"].Mount.ReadOnly = new(true)
	for _, f := range []Format{FormatYAML, FormatJSON} {
		back := roundTrip(t, m, f)
		if !reflect.DeepEqual(back, m) {
			for k, e := range m.Entries {
				if !reflect.DeepEqual(back.Entries[k], e) {
					t.Errorf("%s: entry %q: got %#v, want %#v", f, k, back.Lookup(k), e)
				}
			}
			t.Fatalf("%s round trip changed the manifest", f)
		}
	}
	// YAML and JSON agree.
	y, _ := Marshal(m, FormatYAML)
	j, _ := Marshal(m, FormatJSON)
	fromY, err := LoadTrusted(y, FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	fromJ, err := LoadTrusted(j, FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromY, fromJ) {
		t.Error("YAML and JSON forms decode differently")
	}
}

func TestMarshalerInterfaces(t *testing.T) {
	m := validManifest()
	js, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back Manifest
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	m.Version = 1
	if !reflect.DeepEqual(&back, m) {
		t.Error("json.Unmarshal(json.Marshal(m)) != m")
	}
	// Embedded in a larger YAML document.
	type config struct {
		Name     string    `yaml:"name"`
		Manifest *Manifest `yaml:"manifest"`
	}
	ys, err := yaml.Marshal(config{Name: "x", Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	var cfg config
	if err := yaml.Unmarshal(ys, &cfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Manifest, m) {
		t.Errorf("YAML embedding changed the manifest:\n%s", ys)
	}
	// Strictness applies through the interfaces too.
	err = yaml.Unmarshal([]byte("manifest:\n  entries:\n    a: {type: dir, colour: red}\n"), &cfg)
	if err == nil || !strings.Contains(err.Error(), `entries["a"].colour: unknown field`) {
		t.Errorf("yaml.Unmarshal = %v", err)
	}
	err = json.Unmarshal([]byte(`{"entries": {"a": {"type": "dir", "colour": "red"}}}`), &back)
	if err == nil || !strings.Contains(err.Error(), `entries["a"].colour: unknown field`) {
		t.Errorf("json.Unmarshal = %v", err)
	}
	// An entry on its own.
	ej, err := json.Marshal(m.Entries["vendor/lib"])
	if err != nil || string(ej) != `{"type":"git_repo","repo":"acme/lib","ref":"v1.2.3","subpath":"pkg","token":{"secret":"git-token"}}` {
		t.Errorf("entry JSON = %s, %v", ej, err)
	}
}
