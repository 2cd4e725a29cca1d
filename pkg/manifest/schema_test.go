package manifest

import (
	"encoding/json"
	"slices"
	"testing"
)

type schemaObj = map[string]any

func obj(t *testing.T, v any, what string) schemaObj {
	t.Helper()
	o, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("schema: %s is not an object", what)
	}
	return o
}

func propNames(t *testing.T, o schemaObj, what string) []string {
	t.Helper()
	props := obj(t, o["properties"], what+".properties")
	var names []string
	for k := range props {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	g, w := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if !slices.Equal(g, w) {
		t.Errorf("schema %s: fields %q, decoder %q", what, g, w)
	}
}

// The editor schema declares exactly the fields the decoder reads.
func TestJSONSchemaMatchesDecoder(t *testing.T) {
	var root schemaObj
	if err := json.Unmarshal(JSONSchema(), &root); err != nil {
		t.Fatalf("schema is not JSON: %v", err)
	}
	if root["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %v", root["$schema"])
	}
	sameSet(t, "top level", propNames(t, root, "root"), topLevelFields())
	defs := obj(t, root["$defs"], "$defs")

	objectForm := func(name string) schemaObj {
		for _, alt := range obj(t, defs[name], name)["oneOf"].([]any) {
			if o := obj(t, alt, name); o["type"] == "object" {
				return o
			}
		}
		t.Fatalf("schema: %s has no object form", name)
		return nil
	}
	sameSet(t, "user", propNames(t, objectForm("user"), "user"), userFields())
	sameSet(t, "group", propNames(t, objectForm("group"), "group"), groupFields())
	sameSet(t, "pathGrant", propNames(t, obj(t, defs["pathGrant"], "pathGrant"), "pathGrant"), grantFields())
	var envProps []string
	for _, alt := range obj(t, defs["envValue"], "envValue")["oneOf"].([]any) {
		if o := obj(t, alt, "envValue"); o["type"] == "object" {
			envProps = append(envProps, propNames(t, o, "envValue")...)
		}
	}
	sameSet(t, "envValue", slices.Compact(slices.Sorted(slices.Values(envProps))), envFields())

	entry := obj(t, defs["entry"], "entry")
	base := propNames(t, entry, "entry")
	typeEnum := obj(t, obj(t, entry["properties"], "entry")["type"], "entry.type")["enum"].([]any)
	if len(typeEnum) != len(EntryTypes()) {
		t.Errorf("schema entry types %v", typeEnum)
	}
	branches := map[EntryType]schemaObj{}
	for _, b := range entry["allOf"].([]any) {
		bo := obj(t, b, "allOf item")
		cond := obj(t, obj(t, obj(t, bo["if"], "if")["properties"], "if")["type"], "if.type")
		branches[EntryType(cond["const"].(string))] = obj(t, bo["then"], "then")
	}
	for _, typ := range EntryTypes() {
		then, ok := branches[typ]
		if !ok {
			t.Errorf("schema has no branch for %s", typ)
			continue
		}
		fields := append(slices.Clone(base), propNames(t, then, string(typ))...)
		sameSet(t, string(typ), slices.Compact(slices.Sorted(slices.Values(fields))), entryFields(typ))
		if typ.IsMount() && len(CredentialKeys(typ)) == 0 {
			if _, ok := obj(t, then["properties"], "then")["credentials"]; ok {
				t.Errorf("schema: %s takes no credentials", typ)
			}
		} else if typ.IsMount() {
			creds := obj(t, obj(t, then["properties"], "then")["credentials"], "credentials")
			sameSet(t, string(typ)+".credentials", propNames(t, creds, "credentials"), CredentialKeys(typ))
		}
	}
	got := JSONSchema()
	got[0] = 'X'
	if JSONSchema()[0] != '{' {
		t.Error("JSONSchema must return a fresh copy")
	}
}
