package manifest

import (
	"errors"
	"io/fs"
	"reflect"
	"strings"
	"testing"
)

func walkPaths(t *testing.T, m *Manifest, skip string) []string {
	t.Helper()
	var got []string
	err := m.Walk(func(p string, e *Entry) error {
		got = append(got, p+":"+string(e.Type))
		if p == skip {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestWalkOrder(t *testing.T) {
	m := validManifest()
	m.Entries["repo/extra"] = &Entry{Type: TypeDir}
	m.Entries["repo-b"] = &Entry{Type: TypeDir}
	want := []string{
		"cfg.json:local_file",
		"data/az:azure_blob_mount",
		"data/efs:s3_files_mount",
		"data/gcs:gcs_mount",
		"data/r2:r2_mount",
		"data/s3:s3_mount",
		"dataroom:local_dir",
		"repo:dir",
		"repo/docs/ref.md:file",
		"repo/extra:dir",
		"repo/task.md:file",
		"repo-b:dir",
		"scratch:dir",
		"vendor/lib:git_repo",
	}
	for range 5 { // map iteration order must not matter
		if got := walkPaths(t, m, ""); !reflect.DeepEqual(got, want) {
			t.Fatalf("Walk order:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	got := walkPaths(t, m, "repo")
	if strings.Contains(strings.Join(got, " "), "repo/") || !strings.Contains(strings.Join(got, " "), "repo-b") {
		t.Errorf("SkipDir: %v", got)
	}
	stop := errors.New("stop")
	n := 0
	if err := m.Walk(func(string, *Entry) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("Walk error = %v after %d calls", err, n)
	}
	bad := &Manifest{Entries: map[string]*Entry{"/abs": {Type: TypeFile}}}
	called := false
	if err := bad.Walk(func(string, *Entry) error { called = true; return nil }); err == nil || called {
		t.Errorf("Walk over an invalid path: err %v, called %v", err, called)
	}
}

func TestEphemeralAndMountPaths(t *testing.T) {
	m := validManifest()
	m.Entries["scratch"].Children = map[string]*Entry{"tmp": {Type: TypeDir, Ephemeral: true}}
	m.Entries["repo"].Children["cache"] = &Entry{Type: TypeDir, Ephemeral: true}
	m.Entries["repo"].Children["cache/inner"] = &Entry{Type: TypeFile, Ephemeral: true}
	want := []string{"data/az", "data/efs", "data/gcs", "data/r2", "data/s3", "repo/cache", "scratch"}
	if got := m.EphemeralPaths(); !reflect.DeepEqual(got, want) {
		t.Errorf("EphemeralPaths = %q, want %q", got, want)
	}
	if got := m.MountPaths(); !reflect.DeepEqual(got, []string{"data/az", "data/efs", "data/gcs", "data/r2", "data/s3"}) {
		t.Errorf("MountPaths = %q", got)
	}
	if e := m.Lookup("repo/cache/inner"); e == nil || e.Type != TypeFile {
		t.Errorf("Lookup = %v", e)
	}
	if m.Lookup("repo/nothing") != nil {
		t.Error("Lookup found a missing path")
	}
}

func TestCloneIsDeep(t *testing.T) {
	orig := validManifest()
	c := orig.Clone()
	if !reflect.DeepEqual(orig, c) {
		t.Fatal("Clone differs from the original")
	}
	// Change everything reachable in the clone...
	c.Entries["repo"].Children["task.md"].Content[0] = 'X'
	c.Entries["repo"].Children["new"] = &Entry{Type: TypeFile}
	c.Entries["repo"].Permissions.Owner = 0
	c.Entries["vendor/lib"].Git.Token.Name = "changed"
	c.Entries["data/s3"].Mount.Credentials["session_token"] = Secret("x")
	*c.Entries["data/az"].Mount.ReadOnly = true
	c.Entries["data/efs"].Mount.ExtraOptions[0] = "changed"
	c.Users[0].Groups[0] = "changed"
	*c.Users[0].UID = 1
	*c.Groups[0].GID = 1
	c.Environment["TOKEN"].Secret.Name = "changed"
	c.ExtraPathGrants[0].Path = "/changed"
	delete(c.Entries, "scratch")
	// ...and the original is as it was.
	if !reflect.DeepEqual(orig, validManifest()) {
		t.Error("changing the clone changed the original")
	}
	var nilManifest *Manifest
	if nilManifest.Clone() != nil {
		t.Error("Clone(nil) != nil")
	}
}

func TestRedactedAndRebind(t *testing.T) {
	trusted := validManifest()
	r := trusted.Redacted()
	if err := r.Validate(); err != nil {
		t.Fatalf("a redacted manifest must stay valid: %v", err)
	}
	if r.Entries["dataroom"].Src != "" || r.Entries["cfg.json"].Src != "" || len(r.ExtraPathGrants) != 0 {
		t.Errorf("host paths or grants kept: %+v", r)
	}
	want := &Redaction{Sources: []string{"cfg.json", "dataroom"}, Grants: []string{"/opt/toolchain", "/tmp"}}
	if !reflect.DeepEqual(r.Redaction, want) {
		t.Errorf("Redaction = %+v, want %+v", r.Redaction, want)
	}
	if r.Environment["TOKEN"].Secret == nil || r.Entries["vendor/lib"].Git.Token.Name != "git-token" {
		t.Error("secret references must be kept")
	}
	if trusted.Entries["dataroom"].Src == "" || len(trusted.ExtraPathGrants) != 2 {
		t.Error("Redacted modified its receiver")
	}
	for _, f := range []Format{FormatYAML, FormatJSON} {
		out, err := Marshal(r, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, leak := range []string{"fixtures/dataroom", "config/cfg.json"} {
			if strings.Contains(string(out), leak) {
				t.Errorf("%s output contains %q", f, leak)
			}
		}
		back, err := LoadTrusted(out, f)
		if err != nil {
			t.Fatalf("reloading the redacted %s: %v", f, err)
		}
		if !reflect.DeepEqual(back.Redaction, want) {
			t.Errorf("reloaded Redaction = %+v", back.Redaction)
		}
	}
	// Redacting twice changes nothing more.
	if rr := r.Redacted(); !reflect.DeepEqual(rr, r) {
		t.Errorf("Redacted twice: %+v", rr.Redaction)
	}

	restored, err := r.Rebind(trusted)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(restored, trusted) {
		t.Error("Rebind did not restore the trusted manifest")
	}
	// A trusted manifest that no longer matches is refused.
	other := validManifest()
	other.ExtraPathGrants = other.ExtraPathGrants[:1]
	if _, err := r.Rebind(other); err == nil || !strings.Contains(err.Error(), "grants") {
		t.Errorf("Rebind with other grants = %v", err)
	}
	other = validManifest()
	other.Entries["dataroom"] = &Entry{Type: TypeDir}
	if _, err := r.Rebind(other); err == nil || !strings.Contains(err.Error(), `no local_dir entry with a src at "dataroom"`) {
		t.Errorf("Rebind with another entry type = %v", err)
	}
	// A copy that lost its marker cannot get grants back.
	tampered := r.Clone()
	tampered.Redaction = nil
	if got, _ := tampered.Rebind(trusted); len(got.ExtraPathGrants) != 0 {
		t.Error("grants restored without a redaction marker")
	}
	// Without a redaction marker, a local entry must have its src.
	if err := tampered.Validate(); err == nil || !strings.Contains(err.Error(), `entries["cfg.json"].src: required`) {
		t.Errorf("tampered Validate = %v", err)
	}
}

func TestWithRunAs(t *testing.T) {
	m := &Manifest{}
	r := m.WithRunAs("agent")
	if r.RunAs != "agent" || len(r.Users) != 1 || r.Users[0].Name != "agent" || m.RunAs != "" {
		t.Errorf("WithRunAs = %+v (receiver %+v)", r, m)
	}
	if err := r.Validate(); err != nil {
		t.Error(err)
	}
	if again := r.WithRunAs("agent"); len(again.Users) != 1 {
		t.Error("user added twice")
	}
	if root := m.WithRunAs("root"); len(root.Users) != 0 || root.Validate() != nil {
		t.Errorf("run as root: %+v", root)
	}
}
