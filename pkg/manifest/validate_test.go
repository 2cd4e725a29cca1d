package manifest

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func perms(s string) *Permissions {
	p, err := ParsePermissions(s)
	if err != nil {
		panic(err)
	}
	return &p
}

func id(v uint32) *uint32 { return &v }

// validManifest uses every kind of entry and every top-level field.
func validManifest() *Manifest {
	tok := Secret("git-token")
	return &Manifest{
		Root:  "/workspace",
		RunAs: "analyst",
		Users: []User{
			{Name: "analyst", UID: id(1001), Groups: []string{"research"}, Home: "/home/analyst", Shell: "/bin/bash"},
			{Name: "coordinator", UID: id(1002)},
		},
		Groups: []Group{{Name: "research", GID: id(2001)}},
		Environment: map[string]EnvValue{
			"TZ":    Literal("UTC"),
			"TOKEN": SecretEnv("api-token"),
		},
		ExtraPathGrants: []PathGrant{{Path: "/opt/toolchain", ReadOnly: true, Description: "tools"}, {Path: "/tmp"}},
		Entries: map[string]*Entry{
			"repo": {Type: TypeDir, Group: "research", Permissions: perms("drwxrwx---"), Children: map[string]*Entry{
				"task.md":     {Type: TypeFile, Content: []byte("# Task\n"), Permissions: perms("0644")},
				"docs/ref.md": {Type: TypeFile, Content: []byte{}},
			}},
			"dataroom":   {Type: TypeLocalDir, Src: "fixtures/dataroom", Group: "analyst", Permissions: perms("dr-xr-x---")},
			"cfg.json":   {Type: TypeLocalFile, Src: "config/cfg.json"},
			"vendor/lib": {Type: TypeGitRepo, Git: &GitRepo{Repo: "acme/lib", Ref: "v1.2.3", Subpath: "pkg", Token: &tok}},
			"data/s3":    {Type: TypeS3Mount, Mount: &Mount{Bucket: "b", Prefix: "in/", Region: "eu-west-1", Endpoint: "https://s3.example.com", Credentials: map[string]SecretRef{"access_key_id": Secret("s3-id"), "secret_access_key": Secret("s3-key")}}},
			"data/gcs":   {Type: TypeGCSMount, Mount: &Mount{Bucket: "g"}},
			"data/r2":    {Type: TypeR2Mount, Mount: &Mount{Bucket: "r", Account: "acct"}},
			"data/az":    {Type: TypeAzureBlobMount, Mount: &Mount{Account: "acct", Container: "c", ReadOnly: new(false)}},
			"data/efs": {Type: TypeS3FilesMount, Description: "shared results", Mount: &Mount{FileSystemID: "fs-0123456789abcdef0", Region: "us-east-1",
				Subpath: "/runs/in", MountTargetIP: "10.0.1.25", AccessPoint: "fsap-0123456789abcdef0", ExtraOptions: []string{"nconnect=4", "noresvport"}}},
			"scratch": {Type: TypeDir, Ephemeral: true, Description: "temporary"},
		},
	}
}

func TestValidManifests(t *testing.T) {
	cases := map[string]func(m *Manifest){
		"all kinds":               func(*Manifest) {},
		"empty manifest":          func(m *Manifest) { *m = Manifest{} },
		"custom root":             func(m *Manifest) { m.Root = "/home/agent/ws" },
		"default root":            func(m *Manifest) { m.Root = "" },
		"run_as root":             func(m *Manifest) { m.RunAs = "root" },
		"no run_as":               func(m *Manifest) { m.RunAs = "" },
		"entry group is a user":   func(m *Manifest) { m.Entries["scratch"].Group = "coordinator" },
		"entry group is root":     func(m *Manifest) { m.Entries["scratch"].Group = "root" },
		"dirs overlap":            func(m *Manifest) { m.Entries["repo/extra"] = &Entry{Type: TypeDir} },
		"file in a git checkout":  func(m *Manifest) { m.Entries["vendor/lib/EXTRA.md"] = &Entry{Type: TypeFile} },
		"file in a local_dir":     func(m *Manifest) { m.Entries["dataroom/README"] = &Entry{Type: TypeFile} },
		"local_dir of base dir":   func(m *Manifest) { m.Entries["dataroom"].Src = "." },
		"git host with port":      func(m *Manifest) { m.Entries["vendor/lib"].Git.Host = "git.example.com:8443" },
		"git commit ref":          func(m *Manifest) { m.Entries["vendor/lib"].Git.Ref = "0123abc" },
		"git nested repo path":    func(m *Manifest) { m.Entries["vendor/lib"].Git.Repo = "group/sub/name" },
		"git no subpath no token": func(m *Manifest) { g := m.Entries["vendor/lib"].Git; g.Subpath, g.Token = "", nil },
		"grants inside each other": func(m *Manifest) {
			m.ExtraPathGrants = append(m.ExtraPathGrants, PathGrant{Path: "/opt/toolchain/bin"})
		},
		"grant beside root": func(m *Manifest) { m.ExtraPathGrants = []PathGrant{{Path: "/workspace2"}} },
		"version 1":         func(m *Manifest) { m.Version = 1 },
		"max uid":           func(m *Manifest) { m.Users[1].UID = id(math.MaxUint32 - 1) },
		"description with newlines": func(m *Manifest) {
			m.Entries["scratch"].Description = "line one\nline two"
		},
		"redacted source": func(m *Manifest) {
			m.Entries["dataroom"].Src = ""
			m.Redaction = &Redaction{Sources: []string{"dataroom"}, Grants: []string{"/srv/x"}}
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			m := validManifest()
			mutate(m)
			if err := m.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
}

// Every rule, broken once. want lists fragments that must each appear in one
// problem, the field path first.
func TestValidateRules(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(m *Manifest)
		want   []string
	}{
		{"unsupported version", func(m *Manifest) { m.Version = 2 }, []string{"version: unsupported version 2"}},
		{"relative root", func(m *Manifest) { m.Root = "workspace" }, []string{"root: must be an absolute path"}},
		{"root slash", func(m *Manifest) { m.Root = "/" }, []string{`root: the workspace root must not be "/"`}},
		{"unclean root", func(m *Manifest) { m.Root = "/workspace/" }, []string{`root: must be a clean path ("/workspace")`}},
		{"root dotdot", func(m *Manifest) { m.Root = "/a/../b" }, []string{`root: must be a clean path ("/b")`}},

		// Entry paths.
		{"absolute entry", func(m *Manifest) { m.Entries["/etc/passwd"] = &Entry{Type: TypeFile} }, []string{`entries["/etc/passwd"]: must be relative`}},
		{"dotdot entry", func(m *Manifest) { m.Entries["../x"] = &Entry{Type: TypeFile} }, []string{`entries["../x"]: path has a ".." component`}},
		{"inner dotdot", func(m *Manifest) { m.Entries["a/../b"] = &Entry{Type: TypeFile} }, []string{`entries["a/../b"]: path has a ".." component`}},
		{"empty component", func(m *Manifest) { m.Entries["a//b"] = &Entry{Type: TypeFile} }, []string{`entries["a//b"]: path has an empty component`}},
		{"trailing slash", func(m *Manifest) { m.Entries["a/"] = &Entry{Type: TypeDir} }, []string{`entries["a/"]: path has an empty component`}},
		{"empty key", func(m *Manifest) { m.Entries[""] = &Entry{Type: TypeDir} }, []string{`entries[""]: empty path`}},
		{"dot component", func(m *Manifest) { m.Entries["./a"] = &Entry{Type: TypeFile} }, []string{`entries["./a"]: path has a "." component`}},
		{"backslash", func(m *Manifest) { m.Entries[`a\b`] = &Entry{Type: TypeFile} }, []string{`entries["a\\b"]: path contains a backslash`}},
		{"newline", func(m *Manifest) { m.Entries["a\nb"] = &Entry{Type: TypeFile} }, []string{`entries["a\nb"]: path contains a control character`}},
		{"drive letter", func(m *Manifest) { m.Entries["C:/x"] = &Entry{Type: TypeFile} }, []string{`entries["C:/x"]: looks like a Windows absolute path`}},
		{"bad child path", func(m *Manifest) { m.Entries["repo"].Children["../escape"] = &Entry{Type: TypeFile} }, []string{`entries["repo"].children["../escape"]: path has a ".." component`}},
		{"nil entry", func(m *Manifest) { m.Entries["x"] = nil }, []string{`entries["x"]: entry is empty`}},
		{"duplicate via child", func(m *Manifest) { m.Entries["repo/task.md"] = &Entry{Type: TypeFile} }, []string{`path "repo/task.md" is already declared at`}},
		{"duplicate nested keys", func(m *Manifest) {
			m.Entries["repo"].Children["docs"] = &Entry{Type: TypeDir, Children: map[string]*Entry{"ref.md": {Type: TypeFile}}}
		}, []string{`entries["repo"].children["docs/ref.md"]: path "repo/docs/ref.md" is already declared at entries["repo"].children["docs"].children["ref.md"]`}},
		{"below a file", func(m *Manifest) { m.Entries["repo/task.md/x"] = &Entry{Type: TypeFile} }, []string{`entries["repo/task.md/x"]: path "repo/task.md/x" is below entries["repo"].children["task.md"], which is not a directory`}},
		{"below a local_file", func(m *Manifest) { m.Entries["cfg.json/inner"] = &Entry{Type: TypeDir} }, []string{`entries["cfg.json/inner"]: path "cfg.json/inner" is below entries["cfg.json"]`}},
		{"inside a mount", func(m *Manifest) { m.Entries["data/s3/x.txt"] = &Entry{Type: TypeFile} }, []string{`entries["data/s3/x.txt"]: path "data/s3/x.txt" is inside the mount entries["data/s3"]`}},
		{"mount inside mount", func(m *Manifest) { m.Entries["data/s3/inner"] = &Entry{Type: TypeGCSMount, Mount: &Mount{Bucket: "x"}} }, []string{`entries["data/s3/inner"]: path "data/s3/inner" is inside the mount`}},

		// Entry fields.
		{"missing type", func(m *Manifest) { m.Entries["x"] = &Entry{} }, []string{`entries["x"].type: required`}},
		{"unknown type", func(m *Manifest) { m.Entries["x"] = &Entry{Type: "symlink"} }, []string{`entries["x"].type: unknown entry type "symlink"`}},
		{"permissions out of range", func(m *Manifest) { m.Entries["scratch"].Permissions = &Permissions{Owner: 9} }, []string{`entries["scratch"].permissions: access values must be between 0 and 7`}},
		{"directory mode on a file", func(m *Manifest) { m.Entries["repo"].Children["task.md"].Permissions = perms("drwxr-xr-x") }, []string{`entries["repo"].children["task.md"].permissions: a directory mode on a file entry`}},
		{"permissions on a mount", func(m *Manifest) { m.Entries["data/gcs"].Permissions = perms("0755") }, []string{`entries["data/gcs"].permissions: mount entries take no permissions`}},
		{"undeclared group", func(m *Manifest) { m.Entries["scratch"].Group = "staff" }, []string{`entries["scratch"].group: group "staff" is not declared in groups or users`}},
		{"bad group name", func(m *Manifest) { m.Entries["scratch"].Group = "a b" }, []string{`entries["scratch"].group: name contains ' '`}},
		{"bad description", func(m *Manifest) { m.Entries["scratch"].Description = "\xff" }, []string{`entries["scratch"].description: text is not valid UTF-8`}},
		{"content on a dir", func(m *Manifest) { m.Entries["scratch"].Content = []byte("x") }, []string{`entries["scratch"].content: only file entries have content`}},
		{"children on a file", func(m *Manifest) {
			m.Entries["repo"].Children["task.md"].Children = map[string]*Entry{"x": {Type: TypeFile}}
		}, []string{`entries["repo"].children["task.md"].children: only dir entries have children`, `is below entries["repo"].children["task.md"], which is not a directory`}},
		{"src on a file", func(m *Manifest) { m.Entries["repo"].Children["task.md"].Src = "x" }, []string{`entries["repo"].children["task.md"].src: only local_file and local_dir entries have src`}},
		{"git fields on a dir", func(m *Manifest) { m.Entries["scratch"].Git = &GitRepo{} }, []string{`entries["scratch"]: git repository fields on a dir entry`}},
		{"mount fields on a file", func(m *Manifest) { m.Entries["repo"].Children["task.md"].Mount = &Mount{} }, []string{`entries["repo"].children["task.md"]: mount fields on a file entry`}},

		// Host sources.
		{"local_file without src", func(m *Manifest) { m.Entries["cfg.json"].Src = "" }, []string{`entries["cfg.json"].src: required`}},
		{"root src", func(m *Manifest) { m.Entries["dataroom"].Src = "/" }, []string{`entries["dataroom"].src: must not be the file system root`}},
		{"absolute src with ..", func(m *Manifest) { m.Entries["cfg.json"].Src = "/srv/data/../../etc/shadow" }, []string{`entries["cfg.json"].src: path has a ".." component`}},
		{"unclean absolute src", func(m *Manifest) { m.Entries["cfg.json"].Src = "/srv//data" }, []string{`entries["cfg.json"].src: path has an empty component`}},
		{"drive letter src", func(m *Manifest) { m.Entries["cfg.json"].Src = "C:/data" }, []string{`entries["cfg.json"].src: must be a POSIX path`}},
		{"src escapes base", func(m *Manifest) { m.Entries["dataroom"].Src = "../../secrets" }, []string{`entries["dataroom"].src: path has a ".." component`}},
		{"local_file of base dir", func(m *Manifest) { m.Entries["cfg.json"].Src = "." }, []string{`entries["cfg.json"].src: path has a "." component`}},

		// Git.
		{"git without fields", func(m *Manifest) { m.Entries["vendor/lib"].Git = nil }, []string{`entries["vendor/lib"].repo: required`, `entries["vendor/lib"].ref: required`}},
		{"git host with scheme", func(m *Manifest) { m.Entries["vendor/lib"].Git.Host = "https://github.com" }, []string{`entries["vendor/lib"].host: port must be a number`}},
		{"git host with user", func(m *Manifest) { m.Entries["vendor/lib"].Git.Host = "user@github.com" }, []string{`entries["vendor/lib"].host: host must be a DNS name`}},
		{"git host with path", func(m *Manifest) { m.Entries["vendor/lib"].Git.Host = "github.com/evil" }, []string{`entries["vendor/lib"].host: host must be a DNS name`}},
		{"git repo without owner", func(m *Manifest) { m.Entries["vendor/lib"].Git.Repo = "lib" }, []string{`entries["vendor/lib"].repo: repository must be "owner/name"`}},
		{"git repo .git", func(m *Manifest) { m.Entries["vendor/lib"].Git.Repo = "acme/lib.git" }, []string{`entries["vendor/lib"].repo: write the repository without the ".git" suffix`}},
		{"git repo dotdot", func(m *Manifest) { m.Entries["vendor/lib"].Git.Repo = "acme/../x" }, []string{`entries["vendor/lib"].repo: repository must be "owner/name" with non-empty segments`}},
		{"git missing ref", func(m *Manifest) { m.Entries["vendor/lib"].Git.Ref = "" }, []string{`entries["vendor/lib"].ref: required`}},
		{"git ref dotdot", func(m *Manifest) { m.Entries["vendor/lib"].Git.Ref = "main..evil" }, []string{`entries["vendor/lib"].ref: not a valid git ref`}},
		{"git ref option", func(m *Manifest) { m.Entries["vendor/lib"].Git.Ref = "--upload-pack=x" }, []string{`entries["vendor/lib"].ref: not a valid git ref`}},
		{"git ref space", func(m *Manifest) { m.Entries["vendor/lib"].Git.Ref = "a b" }, []string{`entries["vendor/lib"].ref: ref contains ' '`}},
		{"git subpath escape", func(m *Manifest) { m.Entries["vendor/lib"].Git.Subpath = "../x" }, []string{`entries["vendor/lib"].subpath: path has a ".." component`}},
		{"git subpath absolute", func(m *Manifest) { m.Entries["vendor/lib"].Git.Subpath = "/x" }, []string{`entries["vendor/lib"].subpath: must be relative`}},
		{"git token name", func(m *Manifest) { m.Entries["vendor/lib"].Git.Token = &SecretRef{Name: "bad name"} }, []string{`entries["vendor/lib"].token.secret: secret name contains ' '`}},

		// Mounts.
		{"s3 without bucket", func(m *Manifest) { m.Entries["data/s3"].Mount.Bucket = "" }, []string{`entries["data/s3"].bucket: required`}},
		{"mount without fields", func(m *Manifest) { m.Entries["data/r2"].Mount = nil }, []string{`entries["data/r2"].bucket: required`, `entries["data/r2"].account: required`}},
		{"azure without container", func(m *Manifest) { m.Entries["data/az"].Mount.Container = "" }, []string{`entries["data/az"].container: required`}},
		{"region on azure", func(m *Manifest) { m.Entries["data/az"].Mount.Region = "westeurope" }, []string{`entries["data/az"].region: not used by azure_blob_mount entries`}},
		{"bucket on azure", func(m *Manifest) { m.Entries["data/az"].Mount.Bucket = "b" }, []string{`entries["data/az"].bucket: not used by azure_blob_mount entries`}},
		{"bucket with slash", func(m *Manifest) { m.Entries["data/gcs"].Mount.Bucket = "a/b" }, []string{`entries["data/gcs"].bucket: must not contain '/'`}},
		{"endpoint scheme", func(m *Manifest) { m.Entries["data/s3"].Mount.Endpoint = "ftp://x" }, []string{`entries["data/s3"].endpoint: endpoint must be an http or https URL`}},
		{"endpoint userinfo", func(m *Manifest) { m.Entries["data/s3"].Mount.Endpoint = "https://id:key@s3.example.com" }, []string{`entries["data/s3"].endpoint: endpoint must not carry user information`}},
		{"endpoint query", func(m *Manifest) { m.Entries["data/s3"].Mount.Endpoint = "https://s3.example.com/?x=1" }, []string{`entries["data/s3"].endpoint: endpoint must not have a query`}},
		{"prefix escape", func(m *Manifest) { m.Entries["data/s3"].Mount.Prefix = "../other" }, []string{`entries["data/s3"].prefix: path has a ".." component`}},
		{"unknown credential", func(m *Manifest) { m.Entries["data/s3"].Mount.Credentials["account_key"] = Secret("x") }, []string{`entries["data/s3"].credentials["account_key"]: unknown credential for s3_mount`}},
		{"credential name", func(m *Manifest) { m.Entries["data/s3"].Mount.Credentials["session_token"] = Secret("") }, []string{`entries["data/s3"].credentials["session_token"].secret: empty secret name`}},
		// s3_files_mount.
		{"s3 files without fields", func(m *Manifest) { m.Entries["data/efs"].Mount = nil }, []string{`entries["data/efs"].region: required`, `entries["data/efs"].file_system_id: required`}},
		{"s3 files id shape", func(m *Manifest) { m.Entries["data/efs"].Mount.FileSystemID = "my-fs" }, []string{`entries["data/efs"].file_system_id: must be "fs-" followed by 8 to 40 lowercase hexadecimal digits`}},
		{"s3 files id upper hex", func(m *Manifest) { m.Entries["data/efs"].Mount.FileSystemID = "fs-0123456789ABCDEF0" }, []string{`entries["data/efs"].file_system_id: must be "fs-"`}},
		{"s3 files id short", func(m *Manifest) { m.Entries["data/efs"].Mount.FileSystemID = "fs-0123" }, []string{`entries["data/efs"].file_system_id: must be "fs-"`}},
		{"s3 files access point shape", func(m *Manifest) { m.Entries["data/efs"].Mount.AccessPoint = "fs-0123456789abcdef0" }, []string{`entries["data/efs"].access_point: must be "fsap-"`}},
		{"s3 files region", func(m *Manifest) { m.Entries["data/efs"].Mount.Region = "us east" }, []string{`entries["data/efs"].region: must not contain`}},
		{"s3 files ip", func(m *Manifest) { m.Entries["data/efs"].Mount.MountTargetIP = "10.0.1" }, []string{`entries["data/efs"].mount_target_ip: must be an IPv4 or IPv6 address`}},
		{"s3 files ip with port", func(m *Manifest) { m.Entries["data/efs"].Mount.MountTargetIP = "10.0.1.25:2049" }, []string{`entries["data/efs"].mount_target_ip: must be an IPv4 or IPv6 address`}},
		{"s3 files ip zone", func(m *Manifest) { m.Entries["data/efs"].Mount.MountTargetIP = "fe80::1%eth0" }, []string{`entries["data/efs"].mount_target_ip: must not carry an IPv6 zone`}},
		{"s3 files ip unspecified", func(m *Manifest) { m.Entries["data/efs"].Mount.MountTargetIP = "0.0.0.0" }, []string{`entries["data/efs"].mount_target_ip: must be the address of a host`}},
		{"s3 files subpath relative", func(m *Manifest) { m.Entries["data/efs"].Mount.Subpath = "runs/in" }, []string{`entries["data/efs"].subpath: must be absolute inside the file system`}},
		{"s3 files subpath unclean", func(m *Manifest) { m.Entries["data/efs"].Mount.Subpath = "/runs/../etc" }, []string{`entries["data/efs"].subpath: must be a clean path ("/etc")`}},
		{"s3 files subpath trailing slash", func(m *Manifest) { m.Entries["data/efs"].Mount.Subpath = "/runs/" }, []string{`entries["data/efs"].subpath: must be a clean path ("/runs")`}},
		{"s3 files subpath control", func(m *Manifest) { m.Entries["data/efs"].Mount.Subpath = "/runs\n" }, []string{`entries["data/efs"].subpath: path contains a control character`}},
		{"s3 files option comma", func(m *Manifest) { m.Entries["data/efs"].Mount.ExtraOptions = []string{"port=2049,exec"} }, []string{`entries["data/efs"].extra_options[0]: the value must be`}},
		{"s3 files option comma in name", func(m *Manifest) { m.Entries["data/efs"].Mount.ExtraOptions = []string{"ok", "a,b"} }, []string{`entries["data/efs"].extra_options[1]: must be "name" or "name=value"`}},
		{"s3 files option space", func(m *Manifest) { m.Entries["data/efs"].Mount.ExtraOptions = []string{"port=20 49"} }, []string{`entries["data/efs"].extra_options[0]: the value must be`}},
		{"s3 files option empty value", func(m *Manifest) { m.Entries["data/efs"].Mount.ExtraOptions = []string{"port="} }, []string{`entries["data/efs"].extra_options[0]: the value must be`}},
		{"s3 files option twice", func(m *Manifest) { m.Entries["data/efs"].Mount.ExtraOptions = []string{"nconnect=4", "nconnect=8"} }, []string{`entries["data/efs"].extra_options[1]: option "nconnect" is given twice`}},
		{"s3 files too many options", func(m *Manifest) {
			m.Entries["data/efs"].Mount.ExtraOptions = make([]string, 33)
		}, []string{`entries["data/efs"].extra_options: 33 options; at most 32`}},
		{"bucket on s3 files", func(m *Manifest) { m.Entries["data/efs"].Mount.Bucket = "b" }, []string{`entries["data/efs"].bucket: not used by s3_files_mount entries`}},
		{"credentials on s3 files", func(m *Manifest) {
			m.Entries["data/efs"].Mount.Credentials = map[string]SecretRef{"access_key_id": Secret("x")}
		}, []string{`entries["data/efs"].credentials: not used by s3_files_mount entries`}},
		{"endpoint on s3 files", func(m *Manifest) { m.Entries["data/efs"].Mount.Endpoint = "https://x.example" }, []string{`entries["data/efs"].endpoint: not used by s3_files_mount entries`}},
		{"file system id on s3", func(m *Manifest) { m.Entries["data/s3"].Mount.FileSystemID = "fs-0123456789abcdef0" }, []string{`entries["data/s3"].file_system_id: not used by s3_mount entries`}},
		{"extra options on gcs", func(m *Manifest) { m.Entries["data/gcs"].Mount.ExtraOptions = []string{"ro"} }, []string{`entries["data/gcs"].extra_options: not used by gcs_mount entries`}},
		{"permissions on s3 files", func(m *Manifest) { m.Entries["data/efs"].Permissions = perms("0755") }, []string{`entries["data/efs"].permissions: mount entries take no permissions`}},

		// Users and groups.
		{"bad user name", func(m *Manifest) { m.Users[1].Name = "-rf" }, []string{`users[1].name: name must not start with "-"`}},
		{"numeric user name", func(m *Manifest) { m.Users[1].Name = "1002" }, []string{`users[1].name: name must not be all digits`}},
		{"long user name", func(m *Manifest) { m.Users[1].Name = strings.Repeat("u", 33) }, []string{`users[1].name: name is longer than 32 bytes`}},
		{"duplicate user", func(m *Manifest) { m.Users[1].Name = "analyst" }, []string{`users[1].name: user "analyst" is declared twice`}},
		{"uid zero", func(m *Manifest) { m.Users[1].UID = id(0) }, []string{`users[1].uid: uid 0 is root's`}},
		{"uid reserved", func(m *Manifest) { m.Users[1].UID = id(math.MaxUint32) }, []string{`users[1].uid: uid 4294967295 is reserved`}},
		{"duplicate uid", func(m *Manifest) { m.Users[1].UID = id(1001) }, []string{`users[1].uid: uid 1001 is already used by users[0].uid`}},
		{"undeclared user group", func(m *Manifest) { m.Users[1].Groups = []string{"wheel"} }, []string{`users[1].groups[0]: group "wheel" is not declared in groups`}},
		{"group listed twice", func(m *Manifest) { m.Users[0].Groups = []string{"research", "research"} }, []string{`users[0].groups[1]: group "research" is listed twice`}},
		{"relative home", func(m *Manifest) { m.Users[0].Home = "home/analyst" }, []string{`users[0].home: must be an absolute path`}},
		{"unclean shell", func(m *Manifest) { m.Users[0].Shell = "/bin//sh" }, []string{`users[0].shell: must be a clean path`}},
		{"bad group name", func(m *Manifest) { m.Groups[0].Name = "" }, []string{`groups[0].name: empty name`}},
		{"duplicate group", func(m *Manifest) { m.Groups = append(m.Groups, Group{Name: "research"}) }, []string{`groups[1].name: group "research" is declared twice`}},
		{"gid zero", func(m *Manifest) { m.Groups[0].GID = id(0) }, []string{`groups[0].gid: gid 0 is root's`}},
		{"duplicate gid", func(m *Manifest) { m.Groups = append(m.Groups, Group{Name: "ops", GID: id(2001)}) }, []string{`groups[1].gid: gid 2001 is already used by groups[0].gid`}},
		{"user named like a group", func(m *Manifest) { m.Groups = append(m.Groups, Group{Name: "coordinator"}) }, []string{`users[1].name: "coordinator" is also declared as a group`}},
		{"root user declared", func(m *Manifest) { m.Users[1].Name = "root" }, []string{`users[1].name: user "root" exists in every sandbox`}},
		{"root group declared", func(m *Manifest) { m.Groups[0].Name = "root"; m.Users[0].Groups = nil; m.Entries["repo"].Group = "" }, []string{`groups[0].name: group "root" exists in every sandbox`}},
		{"run_as undeclared", func(m *Manifest) { m.RunAs = "ghost" }, []string{`run_as: user "ghost" is not declared in users`}},
		{"run_as invalid", func(m *Manifest) { m.RunAs = "a;b" }, []string{`run_as: name contains ';'`}},

		// Environment.
		{"env name digit", func(m *Manifest) { m.Environment["1X"] = Literal("x") }, []string{`environment["1X"]: variable names are`}},
		{"env name dash", func(m *Manifest) { m.Environment["A-B"] = Literal("x") }, []string{`environment["A-B"]: variable names are`}},
		{"env value and secret", func(m *Manifest) { v := SecretEnv("s"); v.Value = "x"; m.Environment["B"] = v }, []string{`environment["B"]: set either value or secret, not both`}},
		{"env secret name", func(m *Manifest) { m.Environment["B"] = SecretEnv("-x") }, []string{`environment["B"].secret: secret name contains '-' at byte 0`}},
		{"env NUL", func(m *Manifest) { m.Environment["B"] = Literal("a\x00b") }, []string{`environment["B"].value: value contains a NUL byte`}},

		// Grants.
		{"relative grant", func(m *Manifest) { m.ExtraPathGrants[1].Path = "tmp" }, []string{`extra_path_grants[1].path: must be an absolute path`}},
		{"root grant", func(m *Manifest) { m.ExtraPathGrants[1].Path = "/" }, []string{`extra_path_grants[1].path: a grant must not be the filesystem root "/"`}},
		{"unclean grant", func(m *Manifest) { m.ExtraPathGrants[1].Path = "/tmp/" }, []string{`extra_path_grants[1].path: must be a clean path ("/tmp")`}},
		{"duplicate grant", func(m *Manifest) { m.ExtraPathGrants[1].Path = "/opt/toolchain" }, []string{`extra_path_grants[1].path: "/opt/toolchain" is already granted by extra_path_grants[0]`}},
		{"grant is root", func(m *Manifest) { m.ExtraPathGrants[1].Path = "/workspace" }, []string{`extra_path_grants[1].path: "/workspace" overlaps the workspace root`}},
		{"grant inside root", func(m *Manifest) { m.ExtraPathGrants[1].Path = "/workspace/repo" }, []string{`extra_path_grants[1].path: "/workspace/repo" overlaps the workspace root`}},
		{"grant above root", func(m *Manifest) { m.Root = "/home/agent/ws"; m.ExtraPathGrants[1].Path = "/home" }, []string{`extra_path_grants[1].path: "/home" overlaps the workspace root "/home/agent/ws"`}},

		// Redaction markers.
		{"redacted non-source", func(m *Manifest) { m.Redaction = &Redaction{Sources: []string{"scratch"}} }, []string{`redacted.sources[0]: "scratch" is not a local_file or local_dir entry without src`}},
		{"redacted bad grant", func(m *Manifest) { m.Redaction = &Redaction{Grants: []string{"tmp"}} }, []string{`redacted.grants[0]: must be an absolute path`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := validManifest()
			tc.mutate(m)
			err := m.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want problems")
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate() = %T, want *ValidationError", err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false")
			}
			for _, want := range tc.want {
				found := false
				for _, p := range ve.Problems {
					if strings.Contains(p.Error(), want) {
						found = true
					}
				}
				if !found {
					t.Errorf("no problem contains %q; got:\n%v", want, err)
				}
			}
			for _, p := range ve.Problems {
				if p.Path == "" || !errors.Is(p, ErrInvalid) {
					t.Errorf("problem without a field path or kind: %#v", p)
				}
			}
		})
	}
}

// One pass reports every problem.
func TestValidateCollectsAll(t *testing.T) {
	m := validManifest()
	m.Root = "relative"
	m.Entries["../x"] = &Entry{Type: TypeFile}
	m.Users[0].UID = id(0)
	m.ExtraPathGrants[0].Path = "/"
	m.Environment["BAD-NAME"] = Literal("v")
	err := m.Validate()
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 5 {
		t.Fatalf("Validate() = %v; want exactly 5 problems", err)
	}
	want := "manifest: 5 problems:\n  root: must be an absolute path\n  users[0].uid: uid 0 is root's; declare another id\n"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message:\n%s\nwant prefix:\n%s", err, want)
	}
	var one *FieldError
	if !errors.As(err, &one) || one.Path != "root" {
		t.Errorf("errors.As(*FieldError) = %v", one)
	}
}
