package materialize

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// fakeAccounts resolves "alice" (uid 4242) and "staff" (gid 4343) and
// records what it was asked to create.
type fakeAccounts struct {
	groups, users []string
	fail          error
}

func (f *fakeAccounts) EnsureGroup(_ context.Context, g Group) (bool, error) {
	if f.fail != nil {
		return false, f.fail
	}
	f.groups = append(f.groups, g.Name)
	return true, nil
}

func (f *fakeAccounts) EnsureUser(_ context.Context, u User) (bool, error) {
	if f.fail != nil {
		return false, f.fail
	}
	f.users = append(f.users, u.Name)
	return true, nil
}

func (f *fakeAccounts) IDs(user, group string) (uint32, uint32, error) {
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	switch user {
	case "":
	case "alice":
		uid, gid = 4242, 4242
	default:
		return 0, 0, errkind.Errorf(errkind.ErrNotFound, "user %q", user)
	}
	switch group {
	case "":
	case "staff":
		gid = 4343
	default:
		return 0, 0, errkind.Errorf(errkind.ErrNotFound, "group %q", group)
	}
	return uid, gid, nil
}

// member is one tar member of a test stream.
type member struct {
	name string
	data []byte
	typ  byte
}

func tarOf(t *testing.T, members ...member) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range members {
		typ := m.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: m.name, Typeflag: typ, Mode: 0o644, Size: int64(len(m.data))}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write(m.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// treeOf describes a directory tree (type, mode, owner, content, link)
// for before/after comparisons.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			line += " " + string(data)
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

func TestApplyBuildsTheTree(t *testing.T) {
	root := t.TempDir()
	// What is already there: a file the plan replaces, a directory it
	// merges into (with a file it must keep).
	must(t, os.MkdirAll(filepath.Join(root, "repo"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "repo", "keep.txt"), []byte("keep"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "notes.txt"), []byte("old"), 0o644))

	large := bytes.Repeat([]byte("0123456789abcdef"), (smallFile*3)/16+7) // written inline
	plan := Plan{
		Groups: []Group{{Name: "staff"}},
		Users:  []User{{Name: "alice", Groups: []string{"staff"}}},
		Entries: []Entry{
			{Path: "repo", Kind: KindDir, Mode: 0o750},
			{Path: "repo/src/main.go", Kind: KindFile, Size: 12, Mode: 0o600},
			{Path: "notes.txt", Kind: KindFile, Size: 3},
			{Path: "big.bin", Kind: KindFile, Size: int64(len(large))},
			{Path: "readonly", Kind: KindDir, Mode: 0o555},
			{Path: "readonly/data.csv", Kind: KindFile, Size: 4, Mode: 0o444},
			{Path: "link", Kind: KindSymlink, LinkTarget: "repo/src/main.go"},
			{Path: "empty", Kind: KindFile, Size: 0},
		},
	}
	stream := tarOf(t,
		member{name: "repo/src/main.go", data: []byte("package main")},
		member{name: "notes.txt", data: []byte("new")},
		member{name: "big.bin", data: large},
		member{name: "readonly/data.csv", data: []byte("a,b\n")},
		member{name: "empty"},
	)
	acct := &fakeAccounts{}
	res, err := Apply(context.Background(), root, plan, bytes.NewReader(stream), acct, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(acct.groups, ","); got != "staff" {
		t.Errorf("groups created: %q", got)
	}
	if got := strings.Join(acct.users, ","); got != "alice" {
		t.Errorf("users created: %q", got)
	}
	if res.Dirs != 2 || res.Symlinks != 1 || len(res.Files) != 5 {
		t.Fatalf("result: %+v", res)
	}
	want := map[string]string{"repo/src/main.go": sum([]byte("package main")), "notes.txt": sum([]byte("new")),
		"big.bin": sum(large), "readonly/data.csv": sum([]byte("a,b\n")), "empty": sum(nil)}
	for _, f := range res.Files {
		if want[f.Path] != f.SHA256 {
			t.Errorf("%s: sha256 %s, want %s", f.Path, f.SHA256, want[f.Path])
		}
	}
	check := func(p string, mode fs.FileMode, content string) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), mode)
		}
		if content != "" {
			data, _ := os.ReadFile(filepath.Join(root, p))
			if string(data) != content {
				t.Errorf("%s: %q, want %q", p, data, content)
			}
		}
	}
	check("repo", fs.ModeDir|0o750, "")
	check("repo/src", fs.ModeDir|0o755, "")
	check("repo/src/main.go", 0o600, "package main")
	check("repo/keep.txt", 0o644, "keep")
	check("notes.txt", 0o644, "new")
	check("readonly", fs.ModeDir|0o555, "")
	check("readonly/data.csv", 0o444, "a,b\n")
	check("empty", 0o644, "")
	if target, err := os.Readlink(filepath.Join(root, "link")); err != nil || target != "repo/src/main.go" {
		t.Errorf("link: %q %v", target, err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "big.bin")); !bytes.Equal(data, large) {
		t.Error("big.bin differs")
	}
	assertNoStaging(t, root)
}

func TestApplyOwners(t *testing.T) {
	testenv.Require(t, testenv.Root) // giving files to other users needs root
	root := t.TempDir()
	plan := Plan{Entries: []Entry{
		{Path: "home", Kind: KindDir, User: "alice"},
		{Path: "home/a.txt", Kind: KindFile, Size: 1, User: "alice", Group: "staff"},
		{Path: "home/l", Kind: KindSymlink, LinkTarget: "a.txt", User: "alice"},
	}}
	_, err := Apply(context.Background(), root, plan, bytes.NewReader(tarOf(t, member{name: "home/a.txt", data: []byte("x")})), &fakeAccounts{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][2]uint32{"home": {4242, 4242}, "home/a.txt": {4242, 4343}, "home/l": {4242, 4242}} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s: owner %d:%d, want %d:%d", p, st.Uid, st.Gid, want[0], want[1])
		}
	}
}

// TestApplyRootUser checks Plan.RootUser gives the workspace root itself
// to the user and its primary group, keeping its mode.
func TestApplyRootUser(t *testing.T) {
	testenv.Require(t, testenv.Root) // giving files to other users needs root
	root := t.TempDir()
	must(t, os.Chmod(root, 0o750))
	plan := Plan{RootUser: "alice", Entries: []Entry{{Path: "a.txt", Kind: KindFile, Size: 1, User: "alice"}}}
	for range 2 { // the second time it is the owner already
		if _, err := Apply(context.Background(), root, plan, bytes.NewReader(tarOf(t, member{name: "a.txt", data: []byte("x")})), &fakeAccounts{}, Options{}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(root)
		must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4242 || st.Gid != 4242 || fi.Mode().Perm() != 0o750 {
			t.Fatalf("workspace root %d:%d %v, want 4242:4242 0750", st.Uid, st.Gid, fi.Mode().Perm())
		}
	}
}

// TestApplyImplicitParentsBelongToRootUser: a parent directory the plan
// creates only as a parent (repo/ of repo/a.txt) belongs to Plan.RootUser,
// so the run_as user can create files in it; an existing one keeps its
// owner.
func TestApplyImplicitParentsBelongToRootUser(t *testing.T) {
	testenv.Require(t, testenv.Root) // giving files to other users needs root
	root := t.TempDir()
	must(t, os.Mkdir(filepath.Join(root, "old"), 0o755))
	plan := Plan{RootUser: "alice", Entries: []Entry{
		{Path: "repo/src/a.txt", Kind: KindFile, Size: 1, User: "alice"},
		{Path: "old/b.txt", Kind: KindFile, Size: 1, User: "alice"},
	}}
	stream := tarOf(t, member{name: "repo/src/a.txt", data: []byte("x")}, member{name: "old/b.txt", data: []byte("y")})
	if _, err := Apply(context.Background(), root, plan, bytes.NewReader(stream), &fakeAccounts{}, Options{}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"repo": 4242, "repo/src": 4242, "old": 0} {
		fi, err := os.Stat(filepath.Join(root, p))
		must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != want || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: owner %d mode %v, want %d 0755", p, st.Uid, fi.Mode().Perm(), want)
		}
	}
}

func TestApplyRejectsAndChangesNothing(t *testing.T) {
	okFile := []Entry{{Path: "a.txt", Kind: KindFile, Size: 2}}
	okStream := func(t *testing.T) []byte { return tarOf(t, member{name: "a.txt", data: []byte("hi")}) }
	cases := []struct {
		name    string
		entries []Entry
		stream  func(t *testing.T) []byte
		acctErr error
		users   []User
		root    string // Plan.RootUser
		want    error
	}{
		{name: "absolute path", entries: []Entry{{Path: "/etc/passwd", Kind: KindDir}}, want: errkind.ErrPathEscape},
		{name: "dot dot", entries: []Entry{{Path: "a/../../x", Kind: KindDir}}, want: errkind.ErrInvalidArgument},
		{name: "dot dot clean", entries: []Entry{{Path: "../x", Kind: KindDir}}, want: errkind.ErrPathEscape},
		{name: "unclean", entries: []Entry{{Path: "a//b", Kind: KindDir}}, want: errkind.ErrInvalidArgument},
		{name: "empty path", entries: []Entry{{Path: "", Kind: KindDir}}, want: errkind.ErrInvalidArgument},
		{name: "reserved name", entries: []Entry{{Path: "x/.bulkhead-tmp-1", Kind: KindDir}}, want: errkind.ErrInvalidArgument},
		{name: "duplicate", entries: []Entry{{Path: "d", Kind: KindDir}, {Path: "d", Kind: KindDir}}, want: errkind.ErrInvalidArgument},
		{name: "entry below a file entry", entries: []Entry{{Path: "f", Kind: KindFile}, {Path: "f/g", Kind: KindDir}},
			stream: func(t *testing.T) []byte { return tarOf(t, member{name: "f"}) }, want: errkind.ErrNotDirectory},
		{name: "absolute symlink", entries: []Entry{{Path: "l", Kind: KindSymlink, LinkTarget: "/etc"}}, want: errkind.ErrPathEscape},
		{name: "escaping symlink", entries: []Entry{{Path: "d/l", Kind: KindSymlink, LinkTarget: "../../x"}}, want: errkind.ErrPathEscape},
		{name: "type bits in mode", entries: []Entry{{Path: "d", Kind: KindDir, Mode: fs.ModeDevice | 0o644}}, want: errkind.ErrInvalidArgument},
		{name: "unknown kind", entries: []Entry{{Path: "d"}}, want: errkind.ErrInvalidArgument},
		{name: "size on a directory", entries: []Entry{{Path: "d", Kind: KindDir, Size: 3}}, want: errkind.ErrInvalidArgument},
		{name: "file too large", entries: []Entry{{Path: "f", Kind: KindFile, Size: 1 << 30}}, want: errkind.ErrResourceExhausted},
		{name: "directory over an existing file", entries: []Entry{{Path: "existing.txt/sub", Kind: KindDir}}, want: errkind.ErrNotDirectory},
		{name: "file over an existing directory", entries: []Entry{{Path: "dir", Kind: KindFile}}, stream: func(t *testing.T) []byte { return tarOf(t, member{name: "dir"}) }, want: errkind.ErrIsDirectory},
		{name: "through a symlinked directory", entries: []Entry{{Path: "out/x", Kind: KindDir}}, want: errkind.ErrConflict},
		{name: "unknown owner", entries: []Entry{{Path: "d", Kind: KindDir, User: "mallory"}}, want: errkind.ErrNotFound},
		{name: "unknown root owner", entries: okFile, stream: okStream, root: "mallory", want: errkind.ErrNotFound},
		{name: "accounts fail", entries: okFile, stream: okStream, users: []User{{Name: "bob"}}, acctErr: errkind.Errorf(errkind.ErrFailedPrecondition, "no root"), want: errkind.ErrFailedPrecondition},
		{name: "member missing", entries: []Entry{{Path: "a.txt", Kind: KindFile, Size: 2}, {Path: "b.txt", Kind: KindFile, Size: 1}}, stream: okStream, want: errkind.ErrInvalidArgument},
		{name: "members out of order", entries: []Entry{{Path: "a.txt", Kind: KindFile, Size: 2}, {Path: "b.txt", Kind: KindFile, Size: 1}},
			stream: func(t *testing.T) []byte {
				return tarOf(t, member{name: "b.txt", data: []byte("b")}, member{name: "a.txt", data: []byte("hi")})
			}, want: errkind.ErrInvalidArgument},
		{name: "size differs", entries: []Entry{{Path: "a.txt", Kind: KindFile, Size: 3}}, stream: okStream, want: errkind.ErrInvalidArgument},
		{name: "extra member", entries: okFile, stream: func(t *testing.T) []byte {
			return tarOf(t, member{name: "a.txt", data: []byte("hi")}, member{name: "evil", data: []byte("x")})
		}, want: errkind.ErrInvalidArgument},
		{name: "symlink member", entries: []Entry{{Path: "a.txt", Kind: KindFile}}, stream: func(t *testing.T) []byte {
			return tarOf(t, member{name: "a.txt", typ: tar.TypeSymlink})
		}, want: errkind.ErrInvalidArgument},
		{name: "truncated stream", entries: okFile, stream: func(t *testing.T) []byte { return okStream(t)[:513] }, want: errkind.ErrInvalidArgument},
		{name: "garbage after the archive", entries: okFile, stream: func(t *testing.T) []byte { return append(okStream(t), "trailing"...) }, want: errkind.ErrInvalidArgument},
		{name: "no tar at all", entries: okFile, stream: func(t *testing.T) []byte { return []byte("not a tar stream at all") }, want: errkind.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			root := filepath.Join(base, "ws")
			must(t, os.MkdirAll(outside, 0o755))
			must(t, os.MkdirAll(filepath.Join(root, "dir"), 0o755))
			must(t, os.WriteFile(filepath.Join(root, "existing.txt"), []byte("keep"), 0o644))
			must(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("old"), 0o644))
			must(t, os.Symlink(outside, filepath.Join(root, "out")))
			before, beforeOutside := treeOf(t, root), treeOf(t, outside)
			var stream []byte
			if tc.stream != nil {
				stream = tc.stream(t)
			} else {
				stream = tarOf(t)
			}
			_, err := Apply(context.Background(), root, Plan{Users: tc.users, Entries: tc.entries, RootUser: tc.root}, bytes.NewReader(stream),
				&fakeAccounts{fail: tc.acctErr}, Options{MaxFileBytes: 1 << 20})
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if after := treeOf(t, root); after != before {
				t.Errorf("workspace changed:\n%s\nwant\n%s", after, before)
			}
			if after := treeOf(t, outside); after != beforeOutside {
				t.Errorf("outside changed:\n%s", after)
			}
		})
	}
}

// failingReader yields n bytes of r, then fails.
type failingReader struct {
	r   io.Reader
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	p = p[:min(len(p), f.n)]
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

func TestApplyStreamFailureLeavesNothing(t *testing.T) {
	root := t.TempDir()
	must(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("old"), 0o644))
	before := treeOf(t, root)
	var entries []Entry
	var members []member
	for i := range 50 {
		name := fmt.Sprintf("d/f%02d", i)
		entries = append(entries, Entry{Path: name, Kind: KindFile, Size: 1000})
		members = append(members, member{name: name, data: bytes.Repeat([]byte{'x'}, 1000)})
	}
	entries = append(entries, Entry{Path: "a.txt", Kind: KindFile, Size: 3})
	members = append(members, member{name: "a.txt", data: []byte("new")})
	stream := tarOf(t, members...)
	for _, cut := range []int{0, 512, 30_000, len(stream) - 1100} {
		ctx, cancel := context.WithCancel(context.Background())
		r := &failingReader{r: bytes.NewReader(stream), n: cut, err: context.Canceled}
		_, err := Apply(ctx, root, Plan{Entries: entries}, r, &fakeAccounts{}, Options{})
		cancel()
		if err == nil {
			t.Fatalf("cut at %d: no error", cut)
		}
		if after := treeOf(t, root); after != before {
			t.Fatalf("cut at %d: workspace changed:\n%s", cut, after)
		}
	}
}

func TestApplyCancelledContext(t *testing.T) {
	root := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Apply(ctx, root, Plan{Entries: []Entry{{Path: "a", Kind: KindFile, Size: 1}}},
		bytes.NewReader(tarOf(t, member{name: "a", data: []byte("x")})), &fakeAccounts{}, Options{})
	if !errors.Is(err, errkind.ErrCanceled) {
		t.Fatalf("error %v, want ErrCanceled", err)
	}
	assertNoStaging(t, root)
	if _, err := os.Lstat(filepath.Join(root, "a")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a was created")
	}
}

func TestCleanupStaging(t *testing.T) {
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, StagePrefix+"dead", "x"), 0o700))
	must(t, os.MkdirAll(filepath.Join(root, "keep"), 0o700))
	n, err := CleanupStaging(root)
	if err != nil || n != 1 {
		t.Fatalf("CleanupStaging = %d, %v", n, err)
	}
	assertNoStaging(t, root)
	if _, err := os.Stat(filepath.Join(root, "keep")); err != nil {
		t.Fatal(err)
	}
}

func assertNoStaging(t *testing.T, root string) {
	t.Helper()
	names, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n.Name(), ".bulkhead-") {
			t.Errorf("left behind: %s", n.Name())
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestApplyFlushesUnlessAllVolatile: a plan is flushed once before its
// entries become visible, except when every entry is volatile (re-created
// at each start, like a remote mount's objects); a flush that fails fails
// the plan and leaves nothing visible.
func TestApplyFlushesUnlessAllVolatile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		volatile []bool // per entry: mnt (dir), mnt/a.txt
		flushes  int
	}{
		{"durable", []bool{false, false}, 1},
		{"mixed", []bool{true, false}, 1},
		{"all volatile", []bool{true, true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			plan := Plan{Entries: []Entry{
				{Path: "mnt", Kind: KindDir, Volatile: tc.volatile[0]},
				{Path: "mnt/a.txt", Kind: KindFile, Size: 1, Volatile: tc.volatile[1]},
			}}
			flushes := 0
			opts := Options{Flush: func(d *os.File) error {
				flushes++
				// The entries are staged, not yet visible.
				if _, err := os.Stat(filepath.Join(root, "mnt", "a.txt")); !os.IsNotExist(err) {
					t.Errorf("flush: the entry is visible before the flush (%v)", err)
				}
				return nil
			}}
			stream := tarOf(t, member{name: "mnt/a.txt", data: []byte("x")})
			if _, err := Apply(context.Background(), root, plan, bytes.NewReader(stream), &fakeAccounts{}, opts); err != nil {
				t.Fatal(err)
			}
			if flushes != tc.flushes {
				t.Fatalf("flushed %d times, want %d", flushes, tc.flushes)
			}
			if b, err := os.ReadFile(filepath.Join(root, "mnt", "a.txt")); err != nil || string(b) != "x" {
				t.Fatalf("a.txt = %q, %v", b, err)
			}
		})
	}
	t.Run("flush fails", func(t *testing.T) {
		root := t.TempDir()
		plan := Plan{Entries: []Entry{{Path: "a.txt", Kind: KindFile, Size: 1}}}
		opts := Options{Flush: func(*os.File) error { return syscall.EIO }}
		_, err := Apply(context.Background(), root, plan, bytes.NewReader(tarOf(t, member{name: "a.txt", data: []byte("x")})), &fakeAccounts{}, opts)
		if err == nil || !strings.Contains(err.Error(), "flush staged entries") {
			t.Fatalf("err = %v, want a flush error", err)
		}
		if _, err := os.Stat(filepath.Join(root, "a.txt")); !os.IsNotExist(err) {
			t.Fatalf("a.txt is visible after a failed flush (%v)", err)
		}
	})
}
