package manifest

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzLoad feeds arbitrary bytes to LoadUntrusted and LoadTrusted (as YAML,
// as JSON and auto-detected). It
// must never panic, must fail only with a *ValidationError, and whatever it
// accepts must be valid, render, and survive a Marshal/LoadTrusted round trip
// unchanged. Seeds: testdata/fuzz/FuzzLoad.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("entries:\n  a: {type: file, content: hi}\n"))
	f.Add([]byte(`{"entries": {"a": {"type": "dir", "children": {"b": {"type": "file"}}}}}`))
	permissive := UntrustedOptions{AllowHostSources: true, AllowGrants: true, AllowMounts: true, Root: "/workspace"}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, format := range []Format{FormatYAML, FormatJSON, FormatAuto} {
			if _, err := LoadUntrusted(data, format, UntrustedOptions{}); err != nil {
				checkLoadError(t, err)
			}
			if m, err := LoadUntrusted(data, format, permissive); err != nil {
				checkLoadError(t, err)
			} else {
				checkAccepted(t, m)
			}
			if m, err := LoadTrusted(data, format); err != nil {
				checkLoadError(t, err)
			} else {
				checkAccepted(t, m)
			}
		}
	})
}

func checkLoadError(t *testing.T, err error) {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) == 0 {
		t.Fatalf("error %v (%T) is not a *ValidationError with problems", err, err)
	}
	for _, p := range ve.Problems {
		if p == nil || p.Kind == nil || p.Msg == "" {
			t.Fatalf("malformed problem %#v", p)
		}
	}
}

func checkAccepted(t *testing.T, m *Manifest) {
	t.Helper()
	if err := m.Validate(); err != nil {
		t.Fatalf("accepted an invalid manifest: %v", err)
	}
	err := m.Walk(func(p string, _ *Entry) error {
		checkAcceptedPath(t, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tree, err := m.RenderTree(TreeOptions{})
	if err != nil || len(tree) > DefaultTreeMaxBytes {
		t.Fatalf("RenderTree: %d bytes, %v", len(tree), err)
	}
	if _, err := m.RenderTree(TreeOptions{Depth: -1, MaxBytes: 200, MaxLines: 3}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Format{FormatYAML, FormatJSON} {
		out, err := Marshal(m, f)
		if err != nil {
			t.Fatalf("Marshal %s: %v", f, err)
		}
		back, err := LoadTrusted(out, f)
		if err != nil {
			t.Fatalf("reloading %s: %v\n%s", f, err, out)
		}
		again, err := Marshal(back, f)
		if err != nil || !bytes.Equal(out, again) {
			t.Fatalf("%s round trip is not stable:\n%s\n---\n%s", f, out, again)
		}
	}
	if err := m.Redacted().Validate(); err != nil {
		t.Fatalf("Redacted is invalid: %v", err)
	}
	_ = m.EphemeralPaths()
	_ = m.MountPaths()
	_ = m.Clone()
}
