package manifest

import _ "embed"

//go:embed schema/manifest.schema.json
var schemaText string

// JSONSchema returns the JSON Schema (draft 2020-12) of the manifest file
// format, for editors and other tools. The Go decoder is the authority; the
// schema mirrors it.
// Each call returns a new copy.
func JSONSchema() []byte {
	b := make([]byte, len(schemaText))
	copy(b, schemaText)
	return b
}
