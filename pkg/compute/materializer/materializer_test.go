package materializer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func perms(m fs.FileMode) *manifest.Permissions {
	p := manifest.PermissionsFromMode(m)
	return &p
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// hostTree makes a host source directory.
func hostTree(t *testing.T) string {
	base := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(base, "src", "pkg", "deep"), 0o755))
	must(t, os.WriteFile(filepath.Join(base, "src", "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(base, "src", "pkg", "deep", "data.txt"), []byte("deep"), 0o644))
	must(t, os.WriteFile(filepath.Join(base, "config.toml"), []byte("x = 1\n"), 0o600))
	return base
}

// gitRepo makes a local repository with a file, a subdirectory and an
// in-repo symlink, and returns its path.
func gitRepo(t *testing.T) string {
	testenv.Require(t, testenv.Git)
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	run("init", "--quiet", "--initial-branch=main")
	must(t, os.MkdirAll(filepath.Join(dir, "lib"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "README.md"), []byte("# repo\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "lib", "code.py"), []byte("print(1)\n"), 0o644))
	must(t, os.Symlink("lib/code.py", filepath.Join(dir, "entry.py")))
	run("add", ".")
	run("commit", "--quiet", "-m", "initial")
	run("tag", "v1")
	return dir
}

func TestApplyManifest(t *testing.T) {
	root := os.Geteuid() == 0
	etc := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(etc, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(etc, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(etc, "etc", "group"), []byte("root:x:0:\n"), 0o644))
	d := agentdtest.Start(t, func(c *agentd.Config) { c.EtcRoot = etc })
	base := hostTree(t)
	repo := gitRepo(t)

	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md":  {Type: manifest.TypeFile, Content: []byte("fix the bug\n")},
		"out":      {Type: manifest.TypeDir, Permissions: perms(0o770)},
		"vendor":   {Type: manifest.TypeLocalDir, Src: "src"},
		"cfg.toml": {Type: manifest.TypeLocalFile, Src: "config.toml", Permissions: perms(0o640)},
		"repo":     {Type: manifest.TypeGitRepo, Git: &manifest.GitRepo{Repo: "acme/repo", Ref: "v1"}},
		"nested": {Type: manifest.TypeDir, Children: map[string]*manifest.Entry{
			"a.txt": {Type: manifest.TypeFile, Content: []byte("a")},
		}},
	}}
	if root {
		m.Groups = []manifest.Group{{Name: "analysts"}}
		m.Users = []manifest.User{{Name: "analyst", Groups: []string{"analysts"}}}
		m.RunAs = "analyst"
		m.Entries["out"].Group = "analysts"
	}
	opts := materializer.Options{BaseDir: base, Git: materializer.GitCLI{URL: func(*manifest.GitRepo) string { return repo }}}
	resp, err := materializer.Apply(ctxT(t), d.Client, m, opts)
	if err != nil {
		t.Fatal(err)
	}
	ws := d.Workspace
	for p, want := range map[string]string{
		"task.md": "fix the bug\n", "vendor/run.sh": "#!/bin/sh\necho run\n", "vendor/pkg/deep/data.txt": "deep",
		"cfg.toml": "x = 1\n", "repo/README.md": "# repo\n", "repo/lib/code.py": "print(1)\n", "nested/a.txt": "a",
	} {
		data, err := os.ReadFile(filepath.Join(ws, p))
		if err != nil || string(data) != want {
			t.Errorf("%s: %q, %v; want %q", p, data, err, want)
		}
	}
	if target, err := os.Readlink(filepath.Join(ws, "repo", "entry.py")); err != nil || target != "lib/code.py" {
		t.Errorf("repo/entry.py: %q %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "repo", ".git")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("repo/.git was materialized: %v", err)
	}
	for p, want := range map[string]fs.FileMode{"vendor/run.sh": 0o755, "cfg.toml": 0o640, "out": fs.ModeDir | 0o770, "task.md": 0o755} {
		fi, err := os.Lstat(filepath.Join(ws, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, fi.Mode(), err, want)
		}
	}
	sums := map[string]string{}
	for _, f := range resp.Files {
		sums[f.Path] = f.SHA256
	}
	h := sha256.Sum256([]byte("fix the bug\n"))
	if sums["task.md"] != hex.EncodeToString(h[:]) || len(sums) != 7 {
		t.Errorf("reported files: %v", sums)
	}
	if root {
		if got := strings.Join(resp.UsersCreated, ","); got != "analyst" {
			t.Errorf("users created: %q", got)
		}
		fi, _ := os.Stat(filepath.Join(ws, "out"))
		st := fi.Sys().(*syscall.Stat_t)
		passwd, _ := os.ReadFile(filepath.Join(etc, "etc", "passwd"))
		group, _ := os.ReadFile(filepath.Join(etc, "etc", "group"))
		// An entry with a group is shared through it: root:analysts.
		if st.Uid != 0 || !strings.Contains(string(group), fmt.Sprintf("\nanalysts:x:%d:analyst\n", st.Gid)) {
			t.Errorf("out owned by %d:%d; want root:analysts\n%s%s", st.Uid, st.Gid, passwd, group)
		}
		// Entries without a group belong to the run_as account.
		fi, _ = os.Stat(filepath.Join(ws, "task.md"))
		st = fi.Sys().(*syscall.Stat_t)
		if !strings.Contains(string(passwd), fmt.Sprintf("\nanalyst:x:%d:%d:", st.Uid, st.Gid)) {
			t.Errorf("task.md owned by %d:%d; want analyst\n%s", st.Uid, st.Gid, passwd)
		}
		// So does the workspace root, so the agent can create files at
		// the top of its workspace.
		fi, _ = os.Stat(ws)
		if rst := fi.Sys().(*syscall.Stat_t); rst.Uid != st.Uid || rst.Gid != st.Gid {
			t.Errorf("workspace root owned by %d:%d; want analyst (%d:%d)", rst.Uid, rst.Gid, st.Uid, st.Gid)
		}
		// Materializing again is idempotent: accounts exist, files replaced.
		resp, err = materializer.Apply(ctxT(t), d.Client, m, opts)
		if err != nil || len(resp.UsersCreated) != 0 {
			t.Fatalf("second apply: %v %v", resp.UsersCreated, err)
		}
	}
}

func TestHostSourcesRefuseLinksAndEscapes(t *testing.T) {
	d := agentdtest.Start(t, nil)
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cret"), 0o600))
	cases := map[string]func(base string) *manifest.Entry{
		"symlink inside a local_dir": func(base string) *manifest.Entry {
			must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(base, "src", "leak")))
			return &manifest.Entry{Type: manifest.TypeLocalDir, Src: "src"}
		},
		"local_file is a symlink": func(base string) *manifest.Entry {
			must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(base, "link")))
			return &manifest.Entry{Type: manifest.TypeLocalFile, Src: "link"}
		},
		"symlinked parent directory": func(base string) *manifest.Entry {
			must(t, os.Symlink(outside, filepath.Join(base, "via")))
			return &manifest.Entry{Type: manifest.TypeLocalFile, Src: "via/secret"}
		},
		"symlink to a directory inside the base": func(base string) *manifest.Entry {
			must(t, os.Symlink("src", filepath.Join(base, "alias")))
			return &manifest.Entry{Type: manifest.TypeLocalDir, Src: "alias"}
		},
		"fifo in a local_dir": func(base string) *manifest.Entry {
			must(t, syscall.Mkfifo(filepath.Join(base, "src", "pipe"), 0o644))
			return &manifest.Entry{Type: manifest.TypeLocalDir, Src: "src"}
		},
		"missing source": func(string) *manifest.Entry {
			return &manifest.Entry{Type: manifest.TypeLocalFile, Src: "nope"}
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			base := hostTree(t)
			m := &manifest.Manifest{Entries: map[string]*manifest.Entry{"a.txt": {Type: manifest.TypeFile, Content: []byte("a")}, "x": setup(base)}}
			_, err := materializer.Apply(ctxT(t), d.Client, m, materializer.Options{BaseDir: base})
			if err == nil {
				t.Fatal("materialized")
			}
			if strings.Contains(err.Error(), outside) {
				t.Errorf("error reveals a host path: %v", err)
			}
			entries, _ := os.ReadDir(d.Workspace)
			if len(entries) != 0 {
				t.Errorf("workspace changed: %v", entries)
			}
		})
	}
	// Without a base directory, host sources are refused.
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{"x": {Type: manifest.TypeLocalFile, Src: "config.toml"}}}
	if _, err := materializer.Apply(ctxT(t), d.Client, m, materializer.Options{}); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("no base dir: %v", err)
	}
}

// TestHostGrants checks absolute host sources are read only inside the
// application's host grants (the innermost holding them is their root),
// with the same refusals as below the base directory, and that a manifest
// cannot reach outside them.
func TestHostGrants(t *testing.T) {
	d := agentdtest.Start(t, nil)
	granted, other := hostTree(t), hostTree(t)
	must(t, os.Symlink(filepath.Join(other, "config.toml"), filepath.Join(granted, "src", "leak")))
	opts := materializer.Options{HostGrants: []string{filepath.Join(granted, "nowhere"), granted, filepath.Join(granted, "src")}}
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"cfg.toml": {Type: manifest.TypeLocalFile, Src: filepath.Join(granted, "config.toml")},
		"deep":     {Type: manifest.TypeLocalDir, Src: filepath.Join(granted, "src", "pkg")},
	}}
	must(t, m.Validate())
	if _, err := materializer.Apply(ctxT(t), d.Client, m, opts); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"cfg.toml": "x = 1\n", "deep/deep/data.txt": "deep"} {
		if b, err := os.ReadFile(filepath.Join(d.Workspace, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	for name, tc := range map[string]struct {
		src  string
		typ  manifest.EntryType
		opts materializer.Options
		want error
	}{
		"outside every grant":      {filepath.Join(other, "config.toml"), manifest.TypeLocalFile, opts, errkind.ErrPermissionDenied},
		"no grants at all":         {filepath.Join(granted, "config.toml"), manifest.TypeLocalFile, materializer.Options{BaseDir: granted}, errkind.ErrPermissionDenied},
		"a sibling sharing prefix": {granted + "-x/config.toml", manifest.TypeLocalFile, opts, errkind.ErrPermissionDenied},
		"symlink below a grant":    {filepath.Join(granted, "src", "leak"), manifest.TypeLocalFile, opts, errkind.ErrPermissionDenied},
		"directory with a symlink": {filepath.Join(granted, "src"), manifest.TypeLocalDir, opts, errkind.ErrPermissionDenied},
		"relative grant":           {filepath.Join(granted, "config.toml"), manifest.TypeLocalFile, materializer.Options{HostGrants: []string{"rel"}}, errkind.ErrInvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			d := agentdtest.Start(t, nil)
			m := &manifest.Manifest{Entries: map[string]*manifest.Entry{"x": {Type: tc.typ, Src: tc.src}}}
			must(t, m.Validate())
			_, err := materializer.Apply(ctxT(t), d.Client, m, tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if entries, _ := os.ReadDir(d.Workspace); len(entries) != 0 {
				t.Errorf("workspace changed: %v", entries)
			}
		})
	}
}

func TestSourceSwappedAfterPlanning(t *testing.T) {
	base := hostTree(t)
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{"cfg": {Type: manifest.TypeLocalFile, Src: "config.toml"}}}
	p, err := materializer.Prepare(ctxT(t), m, materializer.Options{BaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Replace the planned file with another one of the same size (the old
	// one kept open so its inode number cannot be reused).
	old, err := os.Open(filepath.Join(base, "config.toml"))
	must(t, err)
	defer old.Close()
	must(t, os.Remove(filepath.Join(base, "config.toml")))
	must(t, os.WriteFile(filepath.Join(base, "config.toml"), []byte("y = 2\n"), 0o600))
	if err := p.WriteTar(ctxT(t), &bytes.Buffer{}); !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("swapped source: %v", err)
	}
}

func TestIncludeSelectsEntries(t *testing.T) {
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"keep.txt": {Type: manifest.TypeFile, Content: []byte("k")},
		"tmp":      {Type: manifest.TypeDir, Ephemeral: true, Children: map[string]*manifest.Entry{"x": {Type: manifest.TypeFile}}},
	}}
	p, err := materializer.Prepare(ctxT(t), m, materializer.Options{Include: func(_ string, e *manifest.Entry) bool { return e.IsEphemeral() }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var paths []string
	for _, e := range p.Plan.Entries {
		paths = append(paths, e.Path)
	}
	sort.Strings(paths)
	// x is not ephemeral itself, so Include leaves it out.
	if got := fmt.Sprint(paths); got != "[tmp]" {
		t.Fatalf("planned %s", got)
	}
}

// treeOf describes a tree: type, mode, content and link target of each path.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	must(t, filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			h := sha256.Sum256(data)
			line += " " + hex.EncodeToString(h[:8])
		}
		lines = append(lines, line)
		return nil
	}))
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestRoundTripThroughArchive(t *testing.T) {
	src := agentdtest.Start(t, nil)
	dst := agentdtest.Start(t, nil)
	ctx := ctxT(t)
	base := hostTree(t)
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md": {Type: manifest.TypeFile, Content: []byte("task")},
		"ro":      {Type: manifest.TypeDir, Permissions: perms(0o550), Children: map[string]*manifest.Entry{"f": {Type: manifest.TypeFile, Content: []byte("f"), Permissions: perms(0o440)}}},
		"vendor":  {Type: manifest.TypeLocalDir, Src: "src"},
	}}
	if _, err := materializer.Apply(ctx, src.Client, m, materializer.Options{BaseDir: base}); err != nil {
		t.Fatal(err)
	}
	// The agent's changes: edit, add, link, hard link, delete.
	ws := src.Workspace
	must(t, os.WriteFile(filepath.Join(ws, "task.md"), []byte("task, done"), 0o600))
	must(t, os.WriteFile(filepath.Join(ws, "vendor", "new.bin"), bytes.Repeat([]byte{0, 1, 2}, 100_000), 0o644))
	must(t, os.Symlink("../task.md", filepath.Join(ws, "vendor", "task-link")))
	must(t, os.Link(filepath.Join(ws, "vendor", "run.sh"), filepath.Join(ws, "run-hard.sh")))
	must(t, os.Remove(filepath.Join(ws, "vendor", "pkg", "deep", "data.txt")))

	var archive bytes.Buffer
	if _, err := src.Client.Archive(ctx, agentclient.ArchiveOptions{}, &archive); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Client.Restore(ctx, agentclient.RestoreOptions{}, &archive); err != nil {
		t.Fatal(err)
	}
	if got, want := treeOf(t, dst.Workspace), treeOf(t, ws); got != want {
		t.Fatalf("restored tree differs:\n%s\nwant\n%s", got, want)
	}
	a, _ := os.Stat(filepath.Join(dst.Workspace, "run-hard.sh"))
	b, _ := os.Stat(filepath.Join(dst.Workspace, "vendor", "run.sh"))
	if !os.SameFile(a, b) {
		t.Error("hard link not preserved")
	}
	fa, err := src.Client.Fingerprint(ctx, agentclient.FingerprintOptions{})
	must(t, err)
	fb, err := dst.Client.Fingerprint(ctx, agentclient.FingerprintOptions{})
	must(t, err)
	if fa != fb {
		t.Errorf("fingerprints differ: %s vs %s", fa, fb)
	}
}

// TestMountEntriesRefused: without a Mounter (Options.Mounts) no mount
// type works, so a manifest with one is refused with ErrUnimplemented
// before anything is written, never applied with the mount silently
// missing.
func TestMountEntriesRefused(t *testing.T) {
	mounts := map[manifest.EntryType]*manifest.Mount{
		manifest.TypeS3Mount:        {Bucket: "b"},
		manifest.TypeGCSMount:       {Bucket: "b"},
		manifest.TypeR2Mount:        {Bucket: "b", Account: "a"},
		manifest.TypeAzureBlobMount: {Account: "a", Container: "c"},
		manifest.TypeS3FilesMount:   {FileSystemID: "fs-0123456789abcdef0", Region: "us-east-1"},
	}
	for typ, mt := range mounts {
		t.Run(string(typ), func(t *testing.T) {
			m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
				"task.md": {Type: manifest.TypeFile, Content: []byte("t")},
				"data":    {Type: typ, Mount: mt},
			}}
			_, err := materializer.Prepare(ctxT(t), m, materializer.Options{})
			if !errors.Is(err, errkind.ErrUnimplemented) || !strings.Contains(err.Error(), "data") || !strings.Contains(err.Error(), string(typ)) {
				t.Fatalf("want ErrUnimplemented naming the entry and type, got %v", err)
			}
			// After a restore only ephemeral entries are applied; mounts
			// are among them and are refused there too.
			_, err = materializer.Prepare(ctxT(t), m, materializer.Options{Include: func(_ string, e *manifest.Entry) bool { return e.IsEphemeral() }})
			if !errors.Is(err, errkind.ErrUnimplemented) {
				t.Fatalf("ephemeral-only: want ErrUnimplemented, got %v", err)
			}
		})
	}
	// With a Mounter configured, s3_files_mount is the Mounter's to plan
	// (package mount reads the file system's backing bucket), like the
	// other mount types.
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md": {Type: manifest.TypeFile, Content: []byte("t")},
		"data":    {Type: manifest.TypeS3FilesMount, Mount: mounts[manifest.TypeS3FilesMount]},
	}}
	fm := &fakeMounter{}
	p, err := materializer.Prepare(ctxT(t), m, materializer.Options{Mounts: fm})
	if err != nil {
		t.Fatalf("s3_files_mount with a Mounter: %v", err)
	}
	p.Close()
	if fm.req.Entry == nil || fm.req.Entry.Type != manifest.TypeS3FilesMount || fm.req.Path != "data" {
		t.Errorf("the Mounter was not asked to plan the s3_files_mount: %+v", fm.req)
	}
	d := agentdtest.Start(t, nil)
	m = &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md": {Type: manifest.TypeFile, Content: []byte("t")},
		"data":    {Type: manifest.TypeS3Mount, Mount: &manifest.Mount{Bucket: "b"}},
	}}
	if _, err := materializer.Apply(ctxT(t), d.Client, m, materializer.Options{}); !errors.Is(err, errkind.ErrUnimplemented) {
		t.Fatalf("apply: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Workspace, "task.md")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused manifest wrote task.md: %v", err)
	}
}
