package manifest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrustedVersusUntrusted(t *testing.T) {
	cases := []struct {
		name  string
		doc   string
		want  []string         // problems from LoadUntrusted with zero options
		allow UntrustedOptions // options under which the document is accepted
	}{
		{"plain", `
entries:
  repo: {type: dir, children: {task.md: {type: file, content: hi}}}
  r: {type: git_repo, repo: a/b, ref: main}
environment: {TZ: UTC}
users: [analyst]
run_as: analyst
`, nil, UntrustedOptions{}},
		{"path grant", `
extra_path_grants: [{path: /tmp}]
`, []string{`extra_path_grants: path grants are not allowed in an untrusted manifest (line 2)`}, UntrustedOptions{AllowGrants: true}},
		{"local_dir", `
entries:
  d: {type: local_dir, src: data}
`, []string{`entries["d"]: local_dir entries read files of the harness host and are not allowed in an untrusted manifest (line 3)`},
			UntrustedOptions{AllowHostSources: true}},
		{"nested local_file", `
entries:
  repo: {type: dir, children: {cfg: {type: local_file, src: x/cfg}}}
`, []string{`entries["repo"].children["cfg"]: local_file entries read files of the harness host and are not allowed in an untrusted manifest (line 3)`},
			UntrustedOptions{AllowHostSources: true}},
		{"git credentials", `
entries:
  r: {type: git_repo, repo: a/b, ref: main, token: {secret: gh}}
`, []string{`entries["r"].token: git credentials (secret "gh") are not allowed in an untrusted manifest (line 3)`},
			UntrustedOptions{AllowedSecrets: []string{"gh"}}},
		{"environment secret", `
environment:
  OPENAI_API_KEY: {secret: openai}
`, []string{`environment["OPENAI_API_KEY"].secret: secret "openai" is not allowed in an untrusted manifest (line 3)`},
			UntrustedOptions{AllowedSecrets: []string{"openai"}}},
		{"mount with credentials", `
entries:
  m: {type: s3_mount, bucket: b, credentials: {access_key_id: {secret: id}, secret_access_key: {secret: key}}}
`, []string{
			`entries["m"]: s3_mount entries are not allowed in an untrusted manifest (line 3)`,
			`entries["m"].credentials["access_key_id"]: secret "id" is not allowed in an untrusted manifest (line 3)`,
			`entries["m"].credentials["secret_access_key"]: secret "key" is not allowed in an untrusted manifest (line 3)`,
		}, UntrustedOptions{AllowMounts: true, AllowedSecrets: []string{"id", "key"}}},
		{"s3 files mount", `
entries:
  shared: {type: s3_files_mount, file_system_id: fs-0123456789abcdef0, region: us-east-1}
`, []string{`entries["shared"]: s3_files_mount entries are not allowed in an untrusted manifest (line 3)`},
			UntrustedOptions{AllowMounts: true}},
		{"other root", `
root: /etc
entries: {passwd: {type: file, content: "x"}}
`, []string{`root: an untrusted manifest cannot move the workspace root (expected "/workspace") (line 2)`},
			UntrustedOptions{Root: "/etc"}},
		{"run_as root", `
run_as: root
`, []string{`run_as: an untrusted manifest cannot run as root (line 2)`}, UntrustedOptions{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := []byte(tc.doc)
			if _, err := LoadTrusted(doc, FormatYAML); err != nil {
				t.Fatalf("LoadTrusted: %v", err)
			}
			m, err := LoadUntrusted(doc, FormatYAML, UntrustedOptions{})
			if tc.want == nil {
				if err != nil || m == nil {
					t.Fatalf("LoadUntrusted: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("LoadUntrusted accepted the document")
			}
			if !errors.Is(err, ErrUntrusted) {
				t.Errorf("errors.Is(err, ErrUntrusted) = false")
			}
			if got := problemsOf(t, err); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if tc.name == "run_as root" {
				return
			}
			if _, err := LoadUntrusted(doc, FormatYAML, tc.allow); err != nil {
				t.Errorf("LoadUntrusted with %+v: %v", tc.allow, err)
			}
		})
	}
}

// An untrusted manifest names git hosts by DNS name, without a port: an
// address or a port would point the harness's fetch at a service of the
// tenant's choosing (loopback, the metadata service, an internal network).
// A trusted manifest keeps both.
func TestUntrustedGitHost(t *testing.T) {
	cases := map[string]string{
		"127.0.0.1:8080":     `entries["r"].host: git host must be a DNS name such as github.com, not an IP address (in an untrusted manifest) (line 3)`,
		"169.254.169.254":    `entries["r"].host: git host must be a DNS name such as github.com, not an IP address (in an untrusted manifest) (line 3)`,
		"127.1":              `entries["r"].host: git host must be a DNS name such as github.com, not an IP address (in an untrusted manifest) (line 3)`,
		"0x7f.0.0.1":         `entries["r"].host: git host must be a DNS name such as github.com, not an IP address (in an untrusted manifest) (line 3)`,
		"github.com:443":     `entries["r"].host: git host must not carry a port: git repositories of untrusted manifests are fetched over https on port 443 (in an untrusted manifest) (line 3)`,
		"git.example.com:22": `entries["r"].host: git host must not carry a port: git repositories of untrusted manifests are fetched over https on port 443 (in an untrusted manifest) (line 3)`,
	}
	for host, want := range cases {
		doc := []byte("entries:\n  r:\n    {type: git_repo, host: \"" + host + "\", repo: a/b, ref: main}\n")
		if _, err := LoadTrusted(doc, FormatYAML); err != nil {
			t.Errorf("%s: LoadTrusted: %v", host, err)
		}
		_, err := LoadUntrusted(doc, FormatYAML, UntrustedOptions{})
		if !errors.Is(err, ErrUntrusted) {
			t.Errorf("%s: LoadUntrusted = %v, want ErrUntrusted", host, err)
			continue
		}
		if got := problemsOf(t, err); len(got) != 1 || got[0] != want {
			t.Errorf("%s: problems %q, want %q", host, got, want)
		}
		// The same rule holds for a manifest built in Go.
		m, _ := LoadTrusted(doc, FormatYAML)
		if err := m.CheckUntrusted(UntrustedOptions{}); !errors.Is(err, ErrUntrusted) {
			t.Errorf("%s: CheckUntrusted = %v, want ErrUntrusted", host, err)
		}
	}
	for _, host := range []string{"github.com", "GitLab.Example.org"} {
		doc := []byte("entries:\n  r: {type: git_repo, host: " + host + ", repo: a/b, ref: main}\n")
		if _, err := LoadUntrusted(doc, FormatYAML, UntrustedOptions{}); err != nil {
			t.Errorf("%s: LoadUntrusted: %v", host, err)
		}
	}
}

func TestUntrustedRootOption(t *testing.T) {
	opts := UntrustedOptions{Root: "/srv/ws"}
	if _, err := LoadUntrusted([]byte("root: /srv/ws\n"), FormatYAML, opts); err != nil {
		t.Errorf("expected root: %v", err)
	}
	_, err := LoadUntrusted([]byte("entries: {}\n"), FormatYAML, opts)
	if got := problemsOf(t, err); len(got) != 1 || got[0] != `root: an untrusted manifest cannot move the workspace root (expected "/srv/ws")` {
		t.Errorf("default root against Root option: %q", got)
	}
}

// Validation and trust problems come back together.
func TestUntrustedReportsEverything(t *testing.T) {
	doc := `
extra_path_grants: [{path: /}]
entries:
  ../etc: {type: file}
  d: {type: local_dir, src: /etc/../root}
`
	_, err := LoadUntrusted([]byte(doc), FormatYAML, UntrustedOptions{})
	want := []string{
		`extra_path_grants[0].path: a grant must not be the filesystem root "/" (line 2)`,
		`entries["../etc"]: path has a ".." component; entries cannot leave the workspace (line 4)`,
		`entries["d"].src: path has a ".." component; entries cannot leave the workspace (line 5)`,
		`extra_path_grants: path grants are not allowed in an untrusted manifest (line 2)`,
		`entries["d"]: local_dir entries read files of the harness host and are not allowed in an untrusted manifest (line 5)`,
	}
	if got := problemsOf(t, err); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrUntrusted) || errors.Is(err, ErrSyntax) {
		t.Error("kinds not reported through errors.Is")
	}
}

func TestUntrustedLimits(t *testing.T) {
	doc := []byte(`
entries:
  a: {type: file, content: "12345"}
  b: {type: dir, children: {c: {type: file, content: "678"}}}
`)
	cases := []struct {
		limits Limits
		want   string
	}{
		{Limits{MaxDocumentBytes: 20}, "the document is 108 bytes; the limit is 20"},
		{Limits{MaxEntries: 2}, "entries: 3 entries; the limit is 2 (line 2)"},
		{Limits{MaxContentBytes: 7}, "entries: 8 bytes of inline file content; the limit is 7 (line 2)"},
	}
	for _, tc := range cases {
		_, err := LoadUntrusted(doc, FormatYAML, UntrustedOptions{Limits: tc.limits})
		if got := problemsOf(t, err); len(got) != 1 || got[0] != tc.want {
			t.Errorf("limits %+v: %q, want %q", tc.limits, got, tc.want)
		}
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("limits %+v: not ErrTooLarge", tc.limits)
		}
	}
	if _, err := LoadUntrusted(doc, FormatYAML, UntrustedOptions{Limits: Limits{MaxEntries: 3, MaxContentBytes: 8, MaxDocumentBytes: 108}}); err != nil {
		t.Errorf("at the limits: %v", err)
	}
	// Trusted manifests have no size limits; CheckLimits applies them on request.
	m, err := LoadTrusted(doc, FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckLimits(Limits{MaxEntries: 1}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("CheckLimits = %v", err)
	}
	if err := m.CheckLimits(Limits{}); err != nil {
		t.Errorf("CheckLimits(defaults) = %v", err)
	}
}

func TestCheckUntrusted(t *testing.T) {
	m := validManifest()
	err := m.CheckUntrusted(UntrustedOptions{})
	for _, want := range []string{"extra_path_grants", `entries["dataroom"]`, `entries["vendor/lib"].token`, `entries["data/s3"]`, `environment["TOKEN"].secret`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckUntrusted: missing %s in %v", want, err)
		}
	}
	all := UntrustedOptions{AllowHostSources: true, AllowGrants: true, AllowMounts: true,
		AllowedSecrets: validManifest().SecretNames()}
	if err := m.CheckUntrusted(all); err != nil {
		t.Errorf("CheckUntrusted(all allowed) = %v", err)
	}
}

func TestExampleManifest(t *testing.T) {
	m, err := LoadTrustedFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if m.RunAs != "analyst" || len(m.Users) != 2 || m.Users[1].Name != "coordinator" {
		t.Errorf("users = %+v, run_as = %q", m.Users, m.RunAs)
	}
	task := m.Lookup("repo/task.md")
	if task == nil || !strings.HasPrefix(string(task.Content), "# Task\n") {
		t.Errorf("repo/task.md = %v", task)
	}
	room := m.Lookup("dataroom")
	if room == nil || room.Type != TypeLocalDir || room.EffectivePermissions().String() != "dr-xr-x---" {
		t.Errorf("dataroom = %+v", room)
	}
	if room.EffectivePermissions().Owner&AccessWrite != 0 || room.EffectivePermissions().Group&AccessWrite != 0 {
		t.Error("the dataroom must be read-only")
	}
	if got := m.EphemeralPaths(); strings.Join(got, ",") != "scratch" {
		t.Errorf("EphemeralPaths = %q", got)
	}
	// The example needs host sources, a grant and a secret: an untrusted
	// load must say so.
	data, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadUntrusted(data, FormatYAML, UntrustedOptions{}); !errors.Is(err, ErrUntrusted) {
		t.Errorf("LoadUntrusted(example) = %v", err)
	}
	opts := UntrustedOptions{AllowHostSources: true, AllowGrants: true, AllowedSecrets: []string{"analytics-api-token"}}
	if _, err := LoadUntrusted(data, FormatYAML, opts); err != nil {
		t.Errorf("LoadUntrusted(example, allowed) = %v", err)
	}
	if _, err := LoadTrustedFile(filepath.Join("testdata", "missing.yaml")); err == nil {
		t.Error("missing file loaded")
	}
}

func TestByteOrderMark(t *testing.T) {
	for _, f := range []Format{FormatAuto, FormatJSON, FormatYAML} {
		if _, err := LoadTrusted([]byte("\xef\xbb\xbf{\"entries\": {}}"), f); err != nil {
			t.Errorf("%s with a BOM: %v", f, err)
		}
	}
}

// A shared manifest (an agent's default) is used by many runs at once:
// every method only reads its receiver. Run with -race.
func TestConcurrentUse(t *testing.T) {
	shared := validManifest()
	done := make(chan error)
	for range 8 {
		go func() {
			var err error
			defer func() { done <- err }()
			if err = shared.Validate(); err != nil {
				return
			}
			if _, err = shared.RenderTree(TreeOptions{}); err != nil {
				return
			}
			if _, err = Marshal(shared, FormatJSON); err != nil {
				return
			}
			var r *Manifest
			if r, err = shared.ResolveSecrets(context.Background(), SecretMap(secretValues)); err != nil {
				return
			}
			_, err = r.Redacted().Rebind(shared)
			_ = shared.EphemeralPaths()
			_ = shared.CheckUntrusted(UntrustedOptions{})
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
