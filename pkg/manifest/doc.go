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
package manifest
