package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestWriteAtomicUnderConcurrentReads alternates two contents of different
// sizes while readers check they always see one of them whole.
func TestWriteAtomicUnderConcurrentReads(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	a := bytes.Repeat([]byte("a"), 1<<20)
	b := bytes.Repeat([]byte("b"), 3<<19)
	_, err := e.w.WriteFile(ctx, nil, WriteOptions{Path: "f", ExpectedSize: -1}, bytes.NewReader(a))
	must(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	reads := 0
	var mu sync.Mutex
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				got, err := readAll(ctx, e.w, nil, "f")
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
					t.Errorf("torn read: %d bytes starting %q", len(got), trunc(got))
					return
				}
				mu.Lock()
				reads++
				mu.Unlock()
			}
		}()
	}
	for i := range 40 {
		content := a
		if i%2 == 0 {
			content = b
		}
		_, err := e.w.WriteFile(ctx, nil, WriteOptions{Path: "f", ExpectedSize: int64(len(content))}, bytes.NewReader(content))
		must(t, err)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d whole reads", reads)
}

// failingReader returns n bytes, then an error.
type failingReader struct {
	n   int
	err error
	// during runs once, after the first bytes were delivered.
	during func()
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		if r.during != nil {
			r.during()
			r.during = nil
		}
		return 0, r.err
	}
	k := min(len(p), r.n, 4096)
	for i := range p[:k] {
		p[i] = 'x'
	}
	r.n -= k
	return k, nil
}

// TestWriteFailureKeepsOldContent checks every way a write can fail midway
// leaves the old file and no temporary file.
func TestWriteFailureKeepsOldContent(t *testing.T) {
	boom := errors.New("client went away")
	cases := []struct {
		name string
		opts WriteOptions
		r    func(cancel func()) io.Reader
		max  int64
		want error
	}{
		{name: "reader error", opts: WriteOptions{ExpectedSize: -1},
			r: func(func()) io.Reader { return &failingReader{n: 100 << 10, err: boom} }, want: boom},
		{name: "context canceled", opts: WriteOptions{ExpectedSize: -1},
			r: func(cancel func()) io.Reader {
				return &failingReader{n: 3 << 20, err: io.EOF, during: cancel}
			}, want: errkind.ErrCanceled},
		{name: "short content", opts: WriteOptions{ExpectedSize: 10},
			r: func(func()) io.Reader { return strings.NewReader("short") }, want: errkind.ErrConflict},
		{name: "long content", opts: WriteOptions{ExpectedSize: 3},
			r: func(func()) io.Reader { return strings.NewReader("too long") }, want: errkind.ErrConflict},
		{name: "checksum mismatch", opts: WriteOptions{ExpectedSize: -1, ExpectedSHA256: make([]byte, 32)},
			r: func(func()) io.Reader { return strings.NewReader("content") }, want: errkind.ErrConflict},
		{name: "write limit", opts: WriteOptions{ExpectedSize: -1}, max: 1000,
			r: func(func()) io.Reader { return &failingReader{n: 5000, err: io.EOF} }, want: errkind.ErrResourceExhausted},
		{name: "announced size over limit", opts: WriteOptions{ExpectedSize: 5000}, max: 1000,
			r: func(func()) io.Reader { return strings.NewReader("x") }, want: errkind.ErrResourceExhausted},
		{name: "never overwrite", opts: WriteOptions{ExpectedSize: -1, Overwrite: OverwriteNever},
			r: func(func()) io.Reader { return strings.NewReader("x") }, want: errkind.ErrAlreadyExists},
		{name: "setuid mode", opts: WriteOptions{ExpectedSize: -1, Mode: fs.ModeSetuid | 0o755},
			r: func(func()) io.Reader { return strings.NewReader("x") }, want: errkind.ErrInvalidArgument},
		{name: "bad checksum length", opts: WriteOptions{ExpectedSize: -1, ExpectedSHA256: []byte{1}},
			r: func(func()) io.Reader { return strings.NewReader("x") }, want: errkind.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.w.maxWrite = c.max
			e.put(t, "f.txt", "old content", 0o640)
			before := fileSnapshot(t, e.root)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := c.opts
			opts.Path = "f.txt"
			_, err := e.w.WriteFile(ctx, nil, opts, c.r(cancel))
			checkErr(t, e, err, c.want)
			b, _ := os.ReadFile(e.path("f.txt"))
			bytesEqual(t, b, []byte("old content"))
			if left := tempFiles(t, e.root); len(left) > 0 {
				t.Fatalf("temporary files left: %v", left)
			}
			if d := diffSnapshots(before, fileSnapshot(t, e.root)); d != "" {
				t.Fatalf("workspace changed:\n%s", d)
			}
		})
	}
}

// TestWriteTempExistsDuringWrite checks the content goes to a hidden
// temporary file next to the target while streaming.
func TestWriteTempExistsDuringWrite(t *testing.T) {
	e := newEnv(t)
	e.put(t, "d/f.txt", "old", 0o644)
	seen := 0
	r := &failingReader{n: 10000, err: io.EOF, during: func() {
		entries, _ := os.ReadDir(e.path("d"))
		for _, de := range entries {
			if IsTempName(de.Name()) {
				seen++
			}
		}
		b, _ := os.ReadFile(e.path("d/f.txt"))
		if string(b) != "old" {
			t.Errorf("target changed mid-write: %q", trunc(b))
		}
	}}
	_, err := e.w.WriteFile(context.Background(), nil, WriteOptions{Path: "d/f.txt", ExpectedSize: 10000}, r)
	must(t, err)
	if seen != 1 {
		t.Fatalf("saw %d temporary files mid-write", seen)
	}
	// The listing hides them.
	res, err := e.w.ListDir(context.Background(), nil, "d", ListOptions{})
	must(t, err)
	if len(res.Entries) != 1 {
		t.Fatalf("entries %+v", res.Entries)
	}
}

// TestWriteSemantics covers modes, policies, parents, links and results.
func TestWriteSemantics(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	content := "hello\n"
	sum := sha256.Sum256([]byte(content))

	res, err := e.w.WriteFile(ctx, nil, WriteOptions{Path: "new/dir/f.txt", CreateParents: true, ExpectedSize: 6, ExpectedSHA256: sum[:]}, strings.NewReader(content))
	must(t, err)
	if !bytes.Equal(res.SHA256, sum[:]) || res.Info.Size != 6 || res.Info.Mode != DefaultFileMode || res.Info.Name != "f.txt" || res.Info.Path != "new/dir/f.txt" || res.Info.Owner != "root" {
		t.Fatalf("result %+v", res)
	}
	checkErr(t, e, writeString(ctx, e.w, nil, "missing/f.txt", "x"), errkind.ErrNotFound)

	// The digest is computed when asked for, and only then.
	res, err = e.w.WriteFile(ctx, nil, WriteOptions{Path: "h1.txt", ExpectedSize: UnknownSize, ComputeSHA256: true}, strings.NewReader(content))
	must(t, err)
	if !bytes.Equal(res.SHA256, sum[:]) {
		t.Fatalf("ComputeSHA256: digest %x", res.SHA256)
	}
	res, err = e.w.WriteFile(ctx, nil, WriteOptions{Path: "h2.txt", ExpectedSize: UnknownSize}, strings.NewReader(content))
	must(t, err)
	if res.SHA256 != nil || res.Info.Size != 6 {
		t.Fatalf("no digest asked for: %+v", res)
	}

	// Mode 0 keeps the old mode; an explicit mode is exact (no umask).
	e.put(t, "m.txt", "x", 0o600)
	must(t, writeString(ctx, e.w, nil, "m.txt", "y"))
	if fi, _ := os.Stat(e.path("m.txt")); fi.Mode() != 0o600 {
		t.Fatalf("mode after overwrite %v", fi.Mode())
	}
	_, err = e.w.WriteFile(ctx, nil, WriteOptions{Path: "m.txt", Mode: 0o777, ExpectedSize: -1}, strings.NewReader("z"))
	must(t, err)
	if fi, _ := os.Stat(e.path("m.txt")); fi.Mode() != 0o777 {
		t.Fatalf("explicit mode %v", fi.Mode())
	}

	// Policies.
	_, err = e.w.WriteFile(ctx, nil, WriteOptions{Path: "absent.txt", Overwrite: OverwriteOnlyIfExists, ExpectedSize: -1}, strings.NewReader("x"))
	checkErr(t, e, err, errkind.ErrNotFound)
	_, err = e.w.WriteFile(ctx, nil, WriteOptions{Path: "m.txt", Overwrite: OverwriteOnlyIfExists, ExpectedSize: -1}, strings.NewReader("only"))
	must(t, err)
	_, err = e.w.WriteFile(ctx, nil, WriteOptions{Path: "fresh.txt", Overwrite: OverwriteNever, ExpectedSize: -1}, strings.NewReader("x"))
	must(t, err)

	// Over a directory.
	must(t, os.Mkdir(e.path("adir"), 0o755))
	checkErr(t, e, writeString(ctx, e.w, nil, "adir", "x"), errkind.ErrIsDirectory)
	// Through an inner symlink: the target changes, the link stays.
	must(t, os.Symlink("new/dir/f.txt", e.path("link")))
	must(t, writeString(ctx, e.w, nil, "link", "via link"))
	b, _ := os.ReadFile(e.path("new/dir/f.txt"))
	bytesEqual(t, b, []byte("via link"))
	// Absolute symlink targets inside the workspace work too.
	must(t, os.Symlink(e.path("fresh.txt"), e.path("abslink")))
	b, err = readAll(ctx, e.w, nil, "abslink")
	must(t, err)
	bytesEqual(t, b, []byte("x"))
	// A write into a writable grant.
	must(t, writeString(ctx, e.w, nil, e.grantRW+"/data.txt", "changed"))
	b, _ = os.ReadFile(e.grantRW + "/data.txt")
	bytesEqual(t, b, []byte("changed"))
}

// TestReadRanges covers offsets, limits, the read cap and metadata.
func TestReadRanges(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.put(t, "f", "0123456789", 0o640)
	e.w.maxRead = 4
	for _, c := range []struct {
		off, limit int64
		want       string
		trunc      bool
	}{
		{0, 0, "0123", true},
		{2, 3, "234", false},
		{8, 0, "89", false},
		{20, 0, "", false},
		{0, 4, "0123", false},
		{1, 9, "1234", true},
	} {
		r, err := e.w.ReadFile(ctx, nil, "f", c.off, c.limit)
		must(t, err)
		b, err := io.ReadAll(r)
		must(t, err)
		must(t, r.Close())
		if string(b) != c.want || r.Truncated != c.trunc || r.Info.Size != 10 || r.Info.Mode != 0o640 {
			t.Errorf("read(%d,%d) = %q trunc=%v info=%+v", c.off, c.limit, b, r.Truncated, r.Info)
		}
	}
	_, err := e.w.ReadFile(ctx, nil, "f", -1, 0)
	checkErr(t, e, err, errkind.ErrInvalidArgument)
	_, err = e.w.ReadFile(ctx, nil, "nope", 0, 0)
	checkErr(t, e, err, errkind.ErrNotFound)
	_, err = e.w.ReadFile(ctx, nil, "f/x", 0, 0)
	checkErr(t, e, err, errkind.ErrNotDirectory)
}

// TestCleanupTemp removes leftovers of interrupted writes only.
func TestCleanupTemp(t *testing.T) {
	e := newEnv(t)
	e.put(t, "keep.txt", "k", 0o644)
	e.put(t, "d/"+TempPrefix+"abc", "partial", 0o600)
	e.put(t, TempPrefix+"def", "partial", 0o600)
	must(t, os.WriteFile(e.grantRW+"/"+TempPrefix+"g", nil, 0o600))
	must(t, os.WriteFile(e.grantRO+"/"+TempPrefix+"g", nil, 0o600))
	n, err := e.w.CleanupTemp(context.Background())
	must(t, err)
	if n != 3 {
		t.Fatalf("removed %d", n)
	}
	if left := tempFiles(t, e.root); len(left) != 0 {
		t.Fatalf("left %v", left)
	}
	if _, err := os.Stat(e.grantRO + "/" + TempPrefix + "g"); err != nil {
		t.Fatal("touched the read-only grant")
	}
	if _, err := os.Stat(e.path("keep.txt")); err != nil {
		t.Fatal(err)
	}
}

// TestStatListMkdirRemoveRename covers the remaining FileService backing.
func TestStatListMkdirRemoveRename(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	for _, n := range []string{"c", "a", "b", "e", "d"} {
		e.put(t, "dir/"+n, n, 0o644)
	}
	must(t, os.Symlink("a", e.path("dir/link")))
	var names []string
	token := ""
	for {
		res, err := e.w.ListDir(ctx, nil, "dir/", ListOptions{PageToken: token, PageSize: 2})
		must(t, err)
		if res.Total != 6 {
			t.Fatalf("total %d", res.Total)
		}
		for _, fi := range res.Entries {
			names = append(names, fi.Name)
			if fi.Name == "link" && (fi.Type != TypeSymlink || fi.LinkTarget != "a") {
				t.Fatalf("link entry %+v", fi)
			}
			if fi.Path != "dir/"+fi.Name {
				t.Fatalf("path %q", fi.Path)
			}
		}
		if token = res.NextPageToken; token == "" {
			break
		}
	}
	if strings.Join(names, ",") != "a,b,c,d,e,link" {
		t.Fatalf("names %v", names)
	}
	_, err := e.w.ListDir(ctx, nil, "dir", ListOptions{PageToken: "!!"})
	checkErr(t, e, err, errkind.ErrInvalidArgument)
	_, err = e.w.ListDir(ctx, nil, "dir/a", ListOptions{})
	checkErr(t, e, err, errkind.ErrNotDirectory)

	fi, err := e.w.Stat(ctx, nil, "dir/a")
	must(t, err)
	if fi.Type != TypeRegular || fi.Size != 1 || fi.Owner != "root" || time.Since(fi.ModTime) > time.Minute {
		t.Fatalf("stat %+v", fi)
	}
	fi, err = e.w.Stat(ctx, nil, ".")
	must(t, err)
	if !fi.IsDir() {
		t.Fatalf("root stat %+v", fi)
	}

	must(t, e.w.MakeDir(ctx, nil, "m", 0o700, false))
	checkErr(t, e, e.w.MakeDir(ctx, nil, "m", 0o700, false), errkind.ErrAlreadyExists)
	must(t, e.w.MakeDir(ctx, nil, "m", 0o700, true))
	checkErr(t, e, e.w.MakeDir(ctx, nil, "dir/a", 0, true), errkind.ErrAlreadyExists)
	checkErr(t, e, e.w.MakeDir(ctx, nil, "x/y", 0, false), errkind.ErrNotFound)
	if st, _ := os.Stat(e.path("m")); st.Mode().Perm() != 0o700 {
		t.Fatalf("mkdir mode %v", st.Mode())
	}

	checkErr(t, e, e.w.Remove(ctx, nil, "dir", false), errkind.ErrNotEmpty)
	checkErr(t, e, e.w.Remove(ctx, nil, "nope", true), errkind.ErrNotFound)
	must(t, e.w.Remove(ctx, nil, "m", false))
	must(t, e.w.Remove(ctx, nil, "dir/link", false))
	if _, err := os.Stat(e.path("dir/a")); err != nil {
		t.Fatal("removing a link removed its target")
	}

	must(t, e.w.Rename(ctx, nil, "dir/a", "dir/z", false))
	checkErr(t, e, e.w.Rename(ctx, nil, "dir/b", "dir/z", false), errkind.ErrAlreadyExists)
	must(t, e.w.Rename(ctx, nil, "dir/b", "dir/z", true))
	checkErr(t, e, e.w.Rename(ctx, nil, "dir/nope", "dir/y", true), errkind.ErrNotFound)
	checkErr(t, e, e.w.Rename(ctx, nil, "dir/c", e.grantRW+"/c", true), errkind.ErrInvalidArgument)
	must(t, os.Mkdir(e.path("full"), 0o755))
	e.put(t, "full/x", "x", 0o644)
	must(t, os.Mkdir(e.path("empty"), 0o755))
	checkErr(t, e, e.w.Rename(ctx, nil, "empty", "full", true), errkind.ErrNotEmpty)
	checkErr(t, e, e.w.Rename(ctx, nil, "dir/c", "full", true), errkind.ErrIsDirectory)
	checkErr(t, e, e.w.Rename(ctx, nil, "full", "full/x/in", true), errkind.ErrNotDirectory)
	must(t, e.w.Remove(ctx, nil, "dir", true))
	if _, err := os.Stat(e.path("dir")); !os.IsNotExist(err) {
		t.Fatal("recursive remove left the directory")
	}

	cwd, err := e.w.ResolveDir(ctx, nil, "")
	must(t, err)
	if cwd != e.root {
		t.Fatalf("cwd %q", cwd)
	}
	must(t, os.Symlink("full", e.path("fl")))
	cwd, err = e.w.ResolveDir(ctx, nil, "fl")
	must(t, err)
	if cwd != e.path("full") {
		t.Fatalf("cwd %q", cwd)
	}
	loc, err := e.w.Resolve(ctx, nil, e.grantRO+"/data.txt", true)
	must(t, err)
	if !loc.ReadOnly || !loc.Grant || loc.Rel != "data.txt" || loc.RootPath != e.grantRO {
		t.Fatalf("location %+v", loc)
	}
}
