// Package manifest is Bulkhead's workspace manifest: the model of what a fresh
// sandbox workspace starts with (files, directories, host copies, git
// checkouts, storage mounts), the accounts, environment and extra path access
// it runs with, and the code to read, check, render and redact it.
//
// The package is pure: no network, no sandbox, no global state. Reading a
// manifest goes through one of two doors. LoadTrusted is for the
// application's own configuration. LoadUntrusted is for anything a model or a
// user could have written: it also enforces size limits and refuses host
// sources, path grants, mounts, secret references, another workspace root and
// run_as root unless UntrustedOptions allows them. Both decode strictly
// (unknown fields, wrong types and duplicate keys are errors naming the field,
// such as entries["src/app.py"].permisions) and return every problem at once
// in a *ValidationError.
//
// Secrets are references ({secret: NAME}) resolved by the harness with
// ResolveSecrets; a resolved value is never serialized or printed. Redacted
// gives the copy that may be stored in run state, and Rebind restores it
// against the trusted manifest.
//
// The YAML/JSON format, field by field, is described by the JSON Schema in
// schema/manifest.schema.json (also returned by JSONSchema).
//
// # Adding a field to the file format
//
// The codec is written by hand, so a field's name appears in several places
// that must agree. To add one (`shell` of a user and `region` of a mount are
// worked examples to follow through these places):
//
//  1. The model (manifest.go): a field of Manifest, Entry, GitRepo, Mount,
//     User, Group or PathGrant, with a doc comment saying what empty or nil
//     means. A pointer, slice or map field is deep-copied in Clone (Manifest
//     or Entry, same file), and TestCloneIsDeep (walk_test.go), which changes
//     every pointer, slice and map of a clone by hand, gets a line for it.
//  2. The accepted names (decode.go): add the name to the list of its
//     object: topLevelFields, envFields, userFields, groupFields,
//     grantFields, the inline list in (*decoder).redaction, or, for entries,
//     entryFields under the entry types that carry it. For a mount field
//     entryFields takes the name from the list inside its mount branch and
//     keeps it only for the types where mountFieldUse (validate.go) returns
//     1 (optional) or 2 (required): add it to both.
//  3. Decoding (decode.go): a case for the name in the switch of the
//     object's decoder (decodeManifest, envLong, user, group, grant,
//     redaction, entry), reading the value with d.str, d.boolean, d.uint,
//     d.id, d.strList or d.secretRef, which report a wrong type with the
//     field path. A name in the list of step 2 without a case would be
//     accepted and silently dropped; TestEveryAcceptedFieldIsDecodedAndEncoded
//     (fields_test.go) catches that, and a field that step 4 does not write
//     back, once the field has a sample value in its fieldObjects table
//     (it fails until it has one).
//  4. Encoding (encode.go): an o.add(name, value) in the object's wire
//     function ((*Manifest).wire, (*Entry).wire, User.wire, Group.wire,
//     PathGrant.wire, or envWire and secretWire in secret.go), at the place
//     that gives the order of the format's documentation, normally only when
//     the value is not the zero value.
//     Values are strings, bools, ints, uint32s, []string, []any or *omap
//     (toYAMLNode panics on anything else).
//  5. Validation (validate.go): its rules in validate or the validate*
//     function of the object, reporting with p.invalid(fieldPath(fp, name),
//     ...), and a line in the rules listed in Validate's doc comment. A mount
//     field of the token kind goes into the tokens table of validateMount.
//  6. The JSON Schema (schema/manifest.schema.json): a property in the
//     object's schema (top-level "properties", or "$defs" user, group,
//     pathGrant, envValue, or the "then" branch of each entry type in
//     $defs.entry.allOf), with a description. TestJSONSchemaMatchesDecoder
//     (schema_test.go) fails until the schema and the lists of step 2 name
//     the same fields.
//  7. Trust and secrets, when the field reaches outside the sandbox: a field
//     that makes the harness read host files or grants access goes into
//     checkTrust (load.go) and Redacted/Rebind (redact.go); a secret
//     reference goes into secretSites (secret.go), which ResolveSecrets,
//     Redacted, SecretNames and checkTrust all walk; bulk data counts in
//     checkLimits (load.go). RenderTree (tree.go), the model's view of the
//     workspace, shows an entry's path, kind (file or directory) and
//     description only; a field the model should see goes there too.
//  8. Tests: a sample value in fieldObjects (fields_test.go, see step 3);
//     the field set in validManifest (validate_test.go), which TestRoundTrip
//     (roundtrip_test.go) marshals and reloads in YAML and JSON and compares
//     with reflect.DeepEqual (steps 3 and 4 again, with a realistic value
//     among all the others); wrong-type and unknown-name cases in
//     TestStrictDecodingYAML and TestStrictDecodingJSON (decode_test.go);
//     rule cases in TestValidateRules (validate_test.go); and
//     testdata/example.yaml (TestExampleManifest) when the field is worth
//     showing.
//
// Outside this package, whatever acts on the field reads it from the model:
// pkg/compute/materializer turns entries and accounts into the daemon's
// Materialize plan (agentdv1.MaterializePlan: a field the daemon must act on
// also needs its proto message and pkg/agentd/materialize), and the
// providers and pkg/compute read environment and run_as.
package manifest
