package manifest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// fieldObject is one object of the file format: the names its decoder
// accepts, a YAML sample value for each, and a YAML document holding the
// object with the given fields ("name: value", or "" for none).
type fieldObject struct {
	name    string
	fields  []string          // the decoder's list (decode.go)
	samples map[string]string // field -> YAML value
	doc     func(field string) string
}

// fieldObjects lists every object of the format. Each sample must decode to
// something other than the field's absence.
func fieldObjects() []fieldObject {
	objs := []fieldObject{
		{name: "top level", fields: topLevelFields(), doc: inFlow("%s"), samples: map[string]string{
			"version": "1", "root": "/ws", "run_as": "root", "environment": "{A: b}", "users": "[u]",
			"groups": "[g]", "extra_path_grants": "[{path: /opt}]", "entries": "{f: {type: file}}",
			"redacted": "{sources: [f]}",
		}},
		{name: "environment value", fields: envFields(), doc: inFlow("{environment: {A: %s}}"), samples: map[string]string{
			"value": "v", "secret": "S", "description": "d",
		}},
		{name: "user", fields: userFields(), doc: inFlow("{users: [%s]}"), samples: map[string]string{
			"name": "u", "uid": "5", "groups": "[g]", "home": "/h", "shell": "/s",
		}},
		{name: "group", fields: groupFields(), doc: inFlow("{groups: [%s]}"), samples: map[string]string{
			"name": "g", "gid": "5",
		}},
		{name: "path grant", fields: grantFields(), doc: inFlow("{extra_path_grants: [%s]}"), samples: map[string]string{
			"path": "/opt", "read_only": "true", "description": "d",
		}},
		{name: "redacted", fields: []string{"sources", "grants"}, doc: inFlow("{redacted: %s}"), samples: map[string]string{
			"sources": "[a]", "grants": "[/b]",
		}},
	}
	entrySamples := map[string]string{
		"description": "d", "ephemeral": "true", "group": "g", "permissions": "'0600'",
		"content": "x", "content_base64": "eA==", "children": "{c: {type: file}}", "src": "s",
		"host": "h.example", "repo": "o/r", "ref": "main", "subpath": "p", "token": "{secret: T}",
		"bucket": "b", "account": "a", "container": "c", "prefix": "p/", "region": "r", "endpoint": "https://e.example",
		"read_only": "false", "credentials": "{k: {secret: C}}",
		"file_system_id": "fs-0123456789abcdef0", "mount_target_ip": "10.0.1.25", "access_point": "fsap-0123456789abcdef0",
		"extra_options": "[nconnect=4]",
	}
	for _, t := range EntryTypes() {
		objs = append(objs, fieldObject{
			name:    string(t) + " entry",
			fields:  slices.DeleteFunc(entryFields(t), func(f string) bool { return f == "type" }),
			samples: entrySamples,
			doc: func(field string) string {
				if field != "" {
					field = ", " + field
				}
				return "{entries: {e: {type: " + string(t) + field + "}}}"
			},
		})
	}
	return objs
}

// inFlow returns a doc function placing the object, a flow mapping, at %s
// in format.
func inFlow(format string) func(string) string {
	return func(field string) string { return fmt.Sprintf(format, "{"+field+"}") }
}

// decodeOnly decodes a YAML document without validating it, failing the
// test on an unknown-field or wrong-type problem (not on rules such as an
// environment value needing a value or a secret).
func decodeOnly(t *testing.T, doc string) *Manifest {
	t.Helper()
	n, ferr := parseDocument([]byte(doc), FormatYAML)
	if ferr != nil {
		t.Fatalf("parsing %s: %v", doc, ferr)
	}
	var p problems
	m := decodeManifest(n, &p)
	for _, fe := range p.list {
		if errors.Is(fe, ErrSyntax) && (strings.HasPrefix(fe.Msg, "unknown field") || strings.HasPrefix(fe.Msg, "expected")) {
			t.Fatalf("decoding %s: %v", doc, fe)
		}
	}
	return m
}

// Every field a decoder accepts is decoded (a name in the lists of
// decode.go without a case in the decoder's switch would be accepted and
// silently dropped) and written back by Marshal (a field without an o.add
// in encode.go would be lost on the way out). See "Adding a field" in
// doc.go.
func TestEveryAcceptedFieldIsDecodedAndEncoded(t *testing.T) {
	for _, obj := range fieldObjects() {
		for _, f := range obj.fields {
			t.Run(obj.name+"/"+f, func(t *testing.T) {
				sample, ok := obj.samples[f]
				if !ok {
					t.Fatalf("no sample value for %s field %q: add one to fieldObjects (fields_test.go)", obj.name, f)
				}
				without := decodeOnly(t, obj.doc(""))
				with := decodeOnly(t, obj.doc(f+": "+sample))
				if reflect.DeepEqual(with, without) {
					t.Fatalf("%s field %q is accepted but not decoded", obj.name, f)
				}
				out, err := Marshal(with, FormatYAML)
				if err != nil {
					t.Fatal(err)
				}
				back := decodeOnly(t, string(out))
				back.Version, with.Version = CurrentVersion, CurrentVersion
				if !reflect.DeepEqual(back, with) {
					t.Fatalf("%s field %q does not survive Marshal; wrote:\n%s", obj.name, f, out)
				}
			})
		}
	}
}
