package manifest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
)

// SecretRef names a secret held by the harness (its secret store, its
// environment, a vault). A manifest only ever carries the name: written as
// {secret: NAME} in YAML or JSON. The harness resolves references with
// Manifest.ResolveSecrets; the resolved value lives in memory only. It is never
// serialized (JSON, YAML), never printed by fmt (%v, %+v, %#v, %s) and never
// logged by slog: all of those show the reference.
type SecretRef struct {
	// Name of the secret in the harness's store.
	Name string
	// value is set by ResolveSecrets. It is held through a pointer so that
	// even reflection-based printers that descend into unexported fields show
	// an address rather than the text.
	value *string
}

// Secret returns a reference to the named secret.
func Secret(name string) SecretRef { return SecretRef{Name: name} }

// Value returns the resolved value and whether the reference was resolved.
func (s SecretRef) Value() (string, bool) {
	if s.value == nil {
		return "", false
	}
	return *s.value, true
}

// WithValue returns a copy of s holding the resolved value v.
func (s SecretRef) WithValue(v string) SecretRef {
	return SecretRef{Name: s.Name, value: &v}
}

// Unresolved returns a copy of s without its resolved value.
func (s SecretRef) Unresolved() SecretRef { return SecretRef{Name: s.Name} }

// String shows the reference, never the value.
func (s SecretRef) String() string { return "secret:" + s.Name }

// GoString keeps %#v from showing the value.
func (s SecretRef) GoString() string { return "manifest.Secret(" + strconv.Quote(s.Name) + ")" }

// LogValue keeps slog from showing the value.
func (s SecretRef) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON writes the reference: {"secret":"NAME"}.
func (s SecretRef) MarshalJSON() ([]byte, error) {
	return json.Marshal(secretWire(s))
}

// MarshalYAML writes the reference: {secret: NAME}.
func (s SecretRef) MarshalYAML() (any, error) {
	return toYAMLNode(secretWire(s)), nil
}

func secretWire(s SecretRef) *omap {
	o := &omap{}
	o.add("secret", s.Name)
	return o
}

// EnvValue is one environment variable of the sandbox: a literal Value or a
// Secret reference the harness resolves before starting processes.
//
// In YAML a literal may be written as a plain scalar (NAME: value); the long
// forms are {value: ..., description: ...} and {secret: NAME, description: ...}.
type EnvValue struct {
	Value       string
	Secret      *SecretRef
	Description string
}

// Literal returns a plain environment value.
func Literal(v string) EnvValue { return EnvValue{Value: v} }

// SecretEnv returns an environment value taken from the named secret.
func SecretEnv(name string) EnvValue {
	ref := Secret(name)
	return EnvValue{Secret: &ref}
}

// String never shows the value: logs must not carry environment values.
func (v EnvValue) String() string {
	if v.Secret != nil {
		return v.Secret.String()
	}
	return fmt.Sprintf("value(%d bytes)", len(v.Value))
}

// GoString keeps %#v from showing the value.
func (v EnvValue) GoString() string { return "manifest.EnvValue{" + v.String() + "}" }

// LogValue keeps slog from showing the value.
func (v EnvValue) LogValue() slog.Value { return slog.StringValue(v.String()) }

// MarshalJSON writes the manifest form; a secret is written as its reference.
func (v EnvValue) MarshalJSON() ([]byte, error) { return json.Marshal(envWire(v)) }

// MarshalYAML writes the manifest form; a secret is written as its reference.
func (v EnvValue) MarshalYAML() (any, error) { return toYAMLNode(envWire(v)), nil }

func envWire(v EnvValue) any {
	if v.Secret == nil && v.Description == "" {
		return v.Value
	}
	o := &omap{}
	if v.Secret != nil {
		o.add("secret", v.Secret.Name)
	} else {
		o.add("value", v.Value)
	}
	if v.Description != "" {
		o.add("description", v.Description)
	}
	return o
}

// SecretResolver looks up secrets by name for Manifest.ResolveSecrets.
// Implementations must not put the value in the error they return.
type SecretResolver interface {
	ResolveSecret(ctx context.Context, name string) (string, error)
}

// SecretResolverFunc adapts a function to SecretResolver.
type SecretResolverFunc func(ctx context.Context, name string) (string, error)

// ResolveSecret calls f.
func (f SecretResolverFunc) ResolveSecret(ctx context.Context, name string) (string, error) {
	return f(ctx, name)
}

// SecretMap resolves secrets from a map of names to values (tests,
// benchmarks, callers that hold their secrets already). A name it does not
// hold is an error naming it.
type SecretMap map[string]string

// ResolveSecret returns m[name].
func (m SecretMap) ResolveSecret(_ context.Context, name string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("no secret %s", name)
	}
	return v, nil
}

// secretSite is one place in a manifest that holds a secret reference.
type secretSite struct {
	path string // field path, for errors
	kind string // "environment", "git", "mount"
	ref  SecretRef
	set  func(SecretRef)
}

// secretSites lists every secret reference in m, in a fixed order, as
// pointers into m so that ResolveSecrets can fill them in.
func (m *Manifest) secretSites() []secretSite {
	var out []secretSite
	for _, name := range sortedKeys(m.Environment) {
		v := m.Environment[name]
		if v.Secret != nil {
			out = append(out, secretSite{
				path: fieldPath(keyPath("environment", name), "secret"), kind: "environment", ref: *v.Secret,
				set: func(r SecretRef) { *v.Secret = r },
			})
		}
	}
	walkAll(m.Entries, "entries", "", func(fp, _ string, e *Entry) {
		if e == nil {
			return
		}
		if g := e.Git; g != nil && g.Token != nil {
			out = append(out, secretSite{
				path: fieldPath(fp, "token"), kind: "git", ref: *g.Token,
				set: func(r SecretRef) { *g.Token = r },
			})
		}
		if mt := e.Mount; mt != nil {
			for _, k := range sortedKeys(mt.Credentials) {
				out = append(out, secretSite{
					path: keyPath(fieldPath(fp, "credentials"), k), kind: "mount", ref: mt.Credentials[k],
					set: func(r SecretRef) { mt.Credentials[k] = r },
				})
			}
		}
	})
	return out
}

// SecretNames returns the distinct names of all secrets m references, sorted.
func (m *Manifest) SecretNames() []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range m.secretSites() {
		if !seen[s.ref.Name] {
			seen[s.ref.Name] = true
			out = append(out, s.ref.Name)
		}
	}
	sortStrings(out)
	return out
}

// ResolveSecrets returns a copy of m in which every secret reference
// (environment, git tokens, mount credentials) holds its value from r. Each
// distinct name is looked up once. m itself is not modified, so a shared
// default manifest can be resolved per run. Errors name the field and the
// secret, never a value.
func (m *Manifest) ResolveSecrets(ctx context.Context, r SecretResolver) (*Manifest, error) {
	out := m.Clone()
	cache := map[string]string{}
	for _, s := range out.secretSites() {
		v, ok := cache[s.ref.Name]
		if !ok {
			var err error
			v, err = r.ResolveSecret(ctx, s.ref.Name)
			if err != nil {
				return nil, fmt.Errorf("manifest: %s: resolving secret %q: %w", s.path, s.ref.Name, err)
			}
			cache[s.ref.Name] = v
		}
		s.set(s.ref.WithValue(v))
	}
	return out, nil
}

// Environ returns the sandbox environment with secrets resolved, as a map
// from name to value. It fails, naming the variable, when a secret has not
// been resolved (see ResolveSecrets).
func (m *Manifest) Environ() (map[string]string, error) {
	out := make(map[string]string, len(m.Environment))
	for _, name := range sortedKeys(m.Environment) {
		v := m.Environment[name]
		if v.Secret == nil {
			out[name] = v.Value
			continue
		}
		val, ok := v.Secret.Value()
		if !ok {
			return nil, fmt.Errorf("manifest: environment[%q]: secret %q is not resolved", name, v.Secret.Name)
		}
		out[name] = val
	}
	return out, nil
}
