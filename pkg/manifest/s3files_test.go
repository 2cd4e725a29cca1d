package manifest

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// wantS3Files is the s3_files_mount entry both documents of
// TestS3FilesMountParses describe.
func wantS3Files() *Entry {
	return &Entry{Type: TypeS3FilesMount, Description: "team results", Mount: &Mount{
		FileSystemID: "fs-0123456789abcdef0", Region: "us-east-1", Subpath: "/runs/in",
		MountTargetIP: "10.0.1.25", AccessPoint: "fsap-0123456789abcdef0",
		ExtraOptions: []string{"nconnect=4", "noresvport"}, ReadOnly: new(false),
	}}
}

// TestS3FilesMountParses: an s3_files_mount entry with every field reads
// the same from YAML and JSON, is a mount (a directory, ephemeral, listed by
// MountPaths), and survives Marshal in both formats.
func TestS3FilesMountParses(t *testing.T) {
	docs := map[Format]string{
		FormatYAML: `
entries:
  data/shared:
    type: s3_files_mount
    description: team results
    file_system_id: fs-0123456789abcdef0
    region: us-east-1
    subpath: /runs/in
    mount_target_ip: 10.0.1.25
    access_point: fsap-0123456789abcdef0
    extra_options: [nconnect=4, noresvport]
    read_only: false
`,
		FormatJSON: `{"entries": {"data/shared": {"type": "s3_files_mount", "description": "team results",
  "file_system_id": "fs-0123456789abcdef0", "region": "us-east-1", "subpath": "/runs/in",
  "mount_target_ip": "10.0.1.25", "access_point": "fsap-0123456789abcdef0",
  "extra_options": ["nconnect=4", "noresvport"], "read_only": false}}}`,
	}
	for f, doc := range docs {
		t.Run(f.String(), func(t *testing.T) {
			m, err := LoadTrusted([]byte(doc), f)
			if err != nil {
				t.Fatal(err)
			}
			e := m.Entries["data/shared"]
			if !reflect.DeepEqual(e, wantS3Files()) {
				t.Fatalf("entry = %+v / %+v", e, e.Mount)
			}
			if !e.Type.IsMount() || !e.Type.IsDir() || !e.IsEphemeral() || e.Mount.IsReadOnly() {
				t.Errorf("classification: mount %v dir %v ephemeral %v read-only %v", e.Type.IsMount(), e.Type.IsDir(), e.IsEphemeral(), e.Mount.IsReadOnly())
			}
			if got := m.MountPaths(); !reflect.DeepEqual(got, []string{"data/shared"}) {
				t.Errorf("MountPaths = %q", got)
			}
			for _, out := range []Format{FormatYAML, FormatJSON} {
				b, err := Marshal(m, out)
				if err != nil {
					t.Fatal(err)
				}
				back, err := LoadTrusted(b, out)
				if err != nil {
					t.Fatalf("reload %s: %v\n%s", out, err, b)
				}
				if !reflect.DeepEqual(back.Entries, m.Entries) {
					t.Errorf("%s round trip changed the entry:\n%s", out, b)
				}
			}
		})
	}
	// Only the two required fields.
	m, err := LoadTrusted([]byte("entries: {fs: {type: s3_files_mount, file_system_id: fs-01234567, region: eu-west-1}}"), FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	if mt := m.Entries["fs"].Mount; mt.Subpath != "" || mt.ExtraOptions != nil || !mt.IsReadOnly() {
		t.Errorf("defaults: %+v", mt)
	}
}

// TestS3FilesMountStrictDecoding: fields of other mount types, misspelt
// names and wrong types are refused with the field's path, in both formats;
// a git subpath stays a git field.
func TestS3FilesMountStrictDecoding(t *testing.T) {
	cases := []struct {
		name string
		f    Format
		doc  string
		want string
	}{
		{"bucket", FormatYAML, "entries: {fs: {type: s3_files_mount, file_system_id: fs-01234567, region: r, bucket: b}}",
			`entries["fs"].bucket: unknown field for s3_files_mount entries`},
		{"credentials", FormatYAML, "entries: {fs: {type: s3_files_mount, file_system_id: fs-01234567, region: r, credentials: {access_key_id: {secret: x}}}}",
			`entries["fs"].credentials: unknown field for s3_files_mount entries`},
		{"typo", FormatYAML, "entries: {fs: {type: s3_files_mount, filesystem_id: fs-01234567, region: r}}",
			`entries["fs"].filesystem_id: unknown field; did you mean "file_system_id"?`},
		{"camel case", FormatJSON, `{"entries": {"fs": {"type": "s3_files_mount", "fileSystemId": "fs-01234567", "region": "r"}}}`,
			`entries["fs"].fileSystemId: unknown field`},
		{"options not a list", FormatJSON, `{"entries": {"fs": {"type": "s3_files_mount", "file_system_id": "fs-01234567", "region": "r", "extra_options": "nconnect=4"}}}`,
			`entries["fs"].extra_options: expected a list, got a string`},
		{"ip a number", FormatJSON, `{"entries": {"fs": {"type": "s3_files_mount", "file_system_id": "fs-01234567", "region": "r", "mount_target_ip": 10}}}`,
			`entries["fs"].mount_target_ip: expected a string, got a number`},
		{"not ephemeral", FormatYAML, "entries: {fs: {type: s3_files_mount, file_system_id: fs-01234567, region: r, ephemeral: false}}",
			`entries["fs"].ephemeral: mount entries are always ephemeral`},
		{"file system id on s3_mount", FormatYAML, "entries: {b: {type: s3_mount, bucket: b, file_system_id: fs-01234567}}",
			`entries["b"].file_system_id: unknown field for s3_mount entries`},
		{"access point on git", FormatYAML, "entries: {g: {type: git_repo, repo: a/b, ref: main, access_point: fsap-01234567}}",
			`entries["g"].access_point: unknown field for git_repo entries`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTrusted([]byte(tc.doc), tc.f)
			if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadTrusted = %v\nwant a syntax problem containing %q", err, tc.want)
			}
		})
	}
	m, err := LoadTrusted([]byte("entries: {g: {type: git_repo, repo: a/b, ref: main, subpath: pkg}}"), FormatYAML)
	if err != nil || m.Entries["g"].Git.Subpath != "pkg" || m.Entries["g"].Mount != nil {
		t.Fatalf("git subpath: %v", err)
	}
}

// TestS3FilesMountValidatesFromFiles: the rules of validateMount reach a
// loaded document with line numbers, every bad field reported at once.
func TestS3FilesMountValidatesFromFiles(t *testing.T) {
	doc := `
entries:
  fs:
    type: s3_files_mount
    file_system_id: fs-NOTHEX01
    subpath: runs/in
    mount_target_ip: 10.0.1.256
    access_point: ap-01234567
    extra_options: ["rw,exec"]
`
	_, err := LoadTrusted([]byte(doc), FormatYAML)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("LoadTrusted = %v", err)
	}
	for _, want := range []string{
		`entries["fs"].region: required`,
		`entries["fs"].file_system_id: must be "fs-" followed by 8 to 40 lowercase hexadecimal digits`,
		`entries["fs"].subpath: must be absolute inside the file system`,
		`entries["fs"].mount_target_ip: must be an IPv4 or IPv6 address`,
		`entries["fs"].access_point: must be "fsap-"`,
		`entries["fs"].extra_options[0]: must be "name" or "name=value"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	if !strings.Contains(err.Error(), "(line 5)") {
		t.Errorf("no line numbers: %v", err)
	}
}
