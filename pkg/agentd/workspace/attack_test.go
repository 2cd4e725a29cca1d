package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestAttacks runs hostile paths against every operation and checks, for
// each, the exact error and that nothing outside the workspace was read or
// changed (content, mode, mtime, owner, inode of every sentinel entry).
func TestAttacks(t *testing.T) {
	ctx := context.Background()
	type tc struct {
		name  string
		setup func(t *testing.T, e *env)
		run   func(t *testing.T, e *env) error
		want  error // nil: the operation is allowed
		check func(t *testing.T, e *env)
	}
	// common fixtures, made per case
	links := func(t *testing.T, e *env) {
		must(t, os.Symlink(filepath.Join(e.outside, "secret.txt"), e.path("abslink")))
		must(t, os.Symlink("../outside/secret.txt", e.path("rellink")))
		must(t, os.Symlink(e.outside, e.path("dirlink")))
		must(t, os.Symlink("../outside", e.path("reldirlink")))
		e.put(t, "file.txt", "inside\n", 0o644)
		must(t, os.Mkdir(e.path("a"), 0o755))
	}
	read := func(p string) func(t *testing.T, e *env) error {
		return func(t *testing.T, e *env) error {
			b, err := readAll(ctx, e.w, nil, p)
			if err == nil && bytes.Contains(b, []byte("secret")) {
				t.Fatalf("read %q returned the outside secret", p)
			}
			return err
		}
	}
	write := func(p string) func(t *testing.T, e *env) error {
		return func(t *testing.T, e *env) error { return writeString(ctx, e.w, nil, p, "pwned\n") }
	}
	cases := []tc{
		{name: "read dotdot", run: read("../outside/secret.txt"), want: errkind.ErrPathEscape},
		{name: "read nested dotdot", setup: links, run: read("a/../../outside/secret.txt"), want: errkind.ErrPathEscape},
		{name: "read deep dotdot", run: read("x/y/../../../../../../etc/passwd"), want: errkind.ErrPathEscape},
		{name: "write dotdot", run: write("../outside/new.txt"), want: errkind.ErrPathEscape},
		{name: "mkdir dotdot", run: func(t *testing.T, e *env) error {
			return e.w.MakeDir(ctx, nil, "../outside/newdir", 0, true)
		}, want: errkind.ErrPathEscape},
		{name: "read absolute outside", run: func(t *testing.T, e *env) error {
			return read(filepath.Join(e.outside, "secret.txt"))(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "write absolute outside", run: func(t *testing.T, e *env) error {
			return write(filepath.Join(e.outside, "secret.txt"))(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "absolute dotdot out of root", run: func(t *testing.T, e *env) error {
			return read(e.root+"/../outside/secret.txt")(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "absolute inside allowed", setup: links, run: func(t *testing.T, e *env) error {
			if err := write(e.root+"/a/../new.txt")(t, e); err != nil {
				return err
			}
			b, err := os.ReadFile(e.path("new.txt"))
			must(t, err)
			bytesEqual(t, b, []byte("pwned\n"))
			return nil
		}},
		{name: "relative dotdot staying inside allowed", setup: links, run: func(t *testing.T, e *env) error {
			b, err := readAll(ctx, e.w, nil, "a/../file.txt")
			bytesEqual(t, b, []byte("inside\n"))
			return err
		}},
		{name: "read absolute symlink to outside", setup: links, run: read("abslink"), want: errkind.ErrPathEscape},
		{name: "read relative symlink to outside", setup: links, run: read("rellink"), want: errkind.ErrPathEscape},
		{name: "write through symlink to outside", setup: links, run: write("abslink"), want: errkind.ErrPathEscape},
		{name: "write through relative symlink", setup: links, run: write("rellink"), want: errkind.ErrPathEscape},
		{name: "write via symlinked parent", setup: links, run: write("dirlink/secret.txt"), want: errkind.ErrPathEscape},
		{name: "write new file via relative symlinked parent", setup: links, run: write("reldirlink/new.txt"), want: errkind.ErrPathEscape},
		{name: "stat via symlinked parent", setup: links, run: func(t *testing.T, e *env) error {
			_, err := e.w.Stat(ctx, nil, "dirlink/secret.txt")
			return err
		}, want: errkind.ErrPathEscape},
		{name: "stat of the link itself allowed", setup: links, run: func(t *testing.T, e *env) error {
			fi, err := e.w.Stat(ctx, nil, "rellink")
			if err == nil && (fi.Type != TypeSymlink || fi.LinkTarget != "../outside/secret.txt") {
				t.Fatalf("stat = %+v", fi)
			}
			return err
		}},
		{name: "list via symlink", setup: links, run: func(t *testing.T, e *env) error {
			_, err := e.w.ListDir(ctx, nil, "dirlink", ListOptions{})
			return err
		}, want: errkind.ErrPathEscape},
		{name: "mkdir through symlink", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.MakeDir(ctx, nil, "dirlink/newdir", 0o755, false)
		}, want: errkind.ErrPathEscape},
		{name: "mkdir parents through symlink", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.MakeDir(ctx, nil, "reldirlink/x/y", 0o755, true)
		}, want: errkind.ErrPathEscape},
		{name: "remove through symlinked dir", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Remove(ctx, nil, "dirlink/secret.txt", false)
		}, want: errkind.ErrPathEscape},
		{name: "remove recursive through symlinked dir", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Remove(ctx, nil, "dirlink/sub", true)
		}, want: errkind.ErrPathEscape},
		{name: "remove the symlink itself allowed", setup: links, run: func(t *testing.T, e *env) error {
			if err := e.w.Remove(ctx, nil, "dirlink", true); err != nil {
				return err
			}
			if _, err := os.Lstat(e.path("dirlink")); !os.IsNotExist(err) {
				t.Fatalf("link still there: %v", err)
			}
			return nil
		}},
		{name: "rename onto symlink replaces the link", setup: links, run: func(t *testing.T, e *env) error {
			if err := e.w.Rename(ctx, nil, "file.txt", "abslink", true); err != nil {
				return err
			}
			b, err := os.ReadFile(e.path("abslink"))
			must(t, err)
			bytesEqual(t, b, []byte("inside\n"))
			return nil
		}},
		{name: "rename onto symlink without overwrite", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Rename(ctx, nil, "file.txt", "abslink", false)
		}, want: errkind.ErrAlreadyExists},
		{name: "rename into symlinked dir", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Rename(ctx, nil, "file.txt", "dirlink/file.txt", true)
		}, want: errkind.ErrPathEscape},
		{name: "rename out of symlinked dir", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Rename(ctx, nil, "dirlink/secret.txt", "stolen.txt", false)
		}, want: errkind.ErrPathEscape},
		{name: "symlink loop", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink("loop2", e.path("loop1")))
			must(t, os.Symlink("loop1", e.path("loop2")))
		}, run: read("loop1"), want: errkind.ErrPathEscape},
		{name: "write to symlink loop", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink("loop2", e.path("loop1")))
			must(t, os.Symlink("loop1", e.path("loop2")))
		}, run: write("loop1"), want: errkind.ErrPathEscape},
		{name: "dangling symlink to outside", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink(filepath.Join(e.outside, "created.txt"), e.path("dangling")))
		}, run: write("dangling"), want: errkind.ErrPathEscape},
		{name: "dangling relative dir symlink with parents", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink("../outside/newdir", e.path("dangdir")))
		}, run: func(t *testing.T, e *env) error {
			_, err := e.w.WriteFile(ctx, nil, WriteOptions{Path: "dangdir/x", CreateParents: true, ExpectedSize: -1}, strings.NewReader("x"))
			return err
		}, want: errkind.ErrPathEscape},
		{name: "dangling symlink inside creates target", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink("target.txt", e.path("dangling")))
		}, run: func(t *testing.T, e *env) error {
			if err := write("dangling")(t, e); err != nil {
				return err
			}
			b, err := os.ReadFile(e.path("target.txt"))
			must(t, err)
			bytesEqual(t, b, []byte("pwned\n"))
			if fi, _ := os.Lstat(e.path("dangling")); fi.Mode()&os.ModeSymlink == 0 {
				t.Fatal("the link was replaced")
			}
			return nil
		}},
		{name: "hard link to outside file", setup: func(t *testing.T, e *env) {
			must(t, os.Link(filepath.Join(e.outside, "secret.txt"), e.path("hardlink")))
		}, run: func(t *testing.T, e *env) error {
			// A hard link inside the root is inside: reading it is allowed.
			b, err := readAll(ctx, e.w, nil, "hardlink")
			must(t, err)
			bytesEqual(t, b, []byte("top secret\n"))
			// Writing replaces the name with a new inode; the outside
			// inode (checked by the snapshot) keeps its content.
			if err := write("hardlink")(t, e); err != nil {
				return err
			}
			b, _ = os.ReadFile(e.path("hardlink"))
			bytesEqual(t, b, []byte("pwned\n"))
			return nil
		}},
		{name: "symlink in grant to outside", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink("/etc/passwd", filepath.Join(e.grantRW, "passwd")))
		}, run: func(t *testing.T, e *env) error {
			return read(filepath.Join(e.grantRW, "passwd"))(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "dotdot out of a grant", run: func(t *testing.T, e *env) error {
			return write(e.grantRW+"/../outside/secret.txt")(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "symlink chain to outside", setup: func(t *testing.T, e *env) {
			must(t, os.Mkdir(e.path("a"), 0o755))
			must(t, os.Symlink("../l2", e.path("a/l1")))
			must(t, os.Symlink("a/../l3", e.path("l2")))
			must(t, os.Symlink("../outside/secret.txt", e.path("l3")))
		}, run: write("a/l1"), want: errkind.ErrPathEscape},
		{name: "write into read-only grant", run: func(t *testing.T, e *env) error {
			return write(filepath.Join(e.grantRO, "data.txt"))(t, e)
		}, want: errkind.ErrReadOnly},
		{name: "new file in read-only grant", run: func(t *testing.T, e *env) error {
			return write(filepath.Join(e.grantRO, "new.txt"))(t, e)
		}, want: errkind.ErrReadOnly},
		{name: "mkdir in read-only grant", run: func(t *testing.T, e *env) error {
			return e.w.MakeDir(ctx, nil, filepath.Join(e.grantRO, "d"), 0, false)
		}, want: errkind.ErrReadOnly},
		{name: "remove in read-only grant", run: func(t *testing.T, e *env) error {
			return e.w.Remove(ctx, nil, filepath.Join(e.grantRO, "data.txt"), false)
		}, want: errkind.ErrReadOnly},
		{name: "rename in read-only grant", run: func(t *testing.T, e *env) error {
			return e.w.Rename(ctx, nil, filepath.Join(e.grantRO, "data.txt"), filepath.Join(e.grantRO, "x"), false)
		}, want: errkind.ErrReadOnly},
		{name: "commit into read-only grant", run: func(t *testing.T, e *env) error {
			return e.w.Commit(ctx, nil, []FileChange{{Kind: ChangeWrite, Path: filepath.Join(e.grantRO, "data.txt"), Content: []byte("x")}})
		}, want: errkind.ErrReadOnly},
		{name: "symlink into read-only grant stays read-only", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink(filepath.Join(e.grantRO, "data.txt"), e.path("rolink")))
		}, run: write("rolink"), want: errkind.ErrReadOnly},
		{name: "read through symlink into grant allowed", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink(filepath.Join(e.grantRO, "data.txt"), e.path("rolink")))
		}, run: func(t *testing.T, e *env) error {
			b, err := readAll(ctx, e.w, nil, "rolink")
			bytesEqual(t, b, []byte("read only data\n"))
			return err
		}},
		{name: "char device read", setup: mknodSetup("dev", syscall.S_IFCHR|0o666, 1<<8|3), run: read("dev"), want: errkind.ErrInvalidArgument},
		{name: "char device write", setup: mknodSetup("dev", syscall.S_IFCHR|0o666, 1<<8|3), run: write("dev"), want: errkind.ErrInvalidArgument},
		{name: "block device read", setup: mknodSetup("blk", syscall.S_IFBLK|0o666, 7<<8), run: read("blk"), want: errkind.ErrInvalidArgument},
		{name: "socket read", setup: func(t *testing.T, e *env) {
			l, err := net.Listen("unix", e.path("sock"))
			if err != nil {
				testenv.Skip(t, fmt.Sprintf("cannot listen on a unix socket in the workspace: %v", err))
			}
			t.Cleanup(func() { l.Close() })
		}, run: read("sock"), want: errkind.ErrInvalidArgument},
		{name: "fifo read does not hang", setup: mknodSetup("fifo", syscall.S_IFIFO|0o666, 0), run: read("fifo"), want: errkind.ErrInvalidArgument},
		{name: "fifo write does not hang", setup: mknodSetup("fifo", syscall.S_IFIFO|0o666, 0), run: write("fifo"), want: errkind.ErrInvalidArgument},
		{name: "fifo in commit", setup: mknodSetup("fifo", syscall.S_IFIFO|0o666, 0), run: func(t *testing.T, e *env) error {
			return e.w.Commit(ctx, nil, []FileChange{{Kind: ChangeWrite, Path: "fifo", Content: []byte("x")}})
		}, want: errkind.ErrInvalidArgument},
		{name: "name longer than 255 bytes", run: write(strings.Repeat("n", 300)), want: errkind.ErrInvalidArgument},
		{name: "path longer than 4096 bytes", run: write(strings.Repeat("d/", 2100) + "f"), want: errkind.ErrInvalidArgument},
		{name: "non-UTF-8 name round-trips", run: func(t *testing.T, e *env) error {
			name := "bad\xff\xfename"
			if err := write(name)(t, e); err != nil {
				return err
			}
			res, err := e.w.ListDir(ctx, nil, ".", ListOptions{})
			must(t, err)
			if len(res.Entries) != 1 || res.Entries[0].Name != name {
				t.Fatalf("list = %+v", res.Entries)
			}
			b, err := readAll(ctx, e.w, nil, name)
			bytesEqual(t, b, []byte("pwned\n"))
			return err
		}},
		{name: "name with newline", run: func(t *testing.T, e *env) error {
			name := "line1\nline2"
			if err := write(name)(t, e); err != nil {
				return err
			}
			fi, err := e.w.Stat(ctx, nil, name)
			if err == nil && fi.Name != name {
				t.Fatalf("name = %q", fi.Name)
			}
			return err
		}},
		{name: "proc self root absolute", run: func(t *testing.T, e *env) error {
			return read("/proc/self/root"+filepath.Join(e.outside, "secret.txt"))(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "symlink to proc self root", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink("/proc/self/root", e.path("procroot")))
		}, run: func(t *testing.T, e *env) error {
			return read("procroot"+filepath.Join(e.outside, "secret.txt"))(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "relative symlink to proc self root", setup: func(t *testing.T, e *env) {
			must(t, os.Symlink(strings.Repeat("../", 20)+"proc/self/root", e.path("procroot")))
		}, run: func(t *testing.T, e *env) error {
			return write("procroot"+filepath.Join(e.outside, "secret.txt"))(t, e)
		}, want: errkind.ErrPathEscape},
		{name: "NUL byte", run: read("file\x00.txt"), want: errkind.ErrInvalidArgument},
		{name: "NUL byte write", run: write("../outside/secret.txt\x00"), want: errkind.ErrInvalidArgument},
		{name: "empty path", run: read(""), want: errkind.ErrInvalidArgument},
		{name: "empty path write", run: write(""), want: errkind.ErrInvalidArgument},
		{name: "dot read", run: read("."), want: errkind.ErrIsDirectory},
		{name: "dot write", run: write("."), want: errkind.ErrIsDirectory},
		{name: "remove root", run: func(t *testing.T, e *env) error {
			return e.w.Remove(ctx, nil, ".", true)
		}, want: errkind.ErrPermissionDenied},
		{name: "remove root by absolute path", run: func(t *testing.T, e *env) error {
			return e.w.Remove(ctx, nil, e.root+"/", true)
		}, want: errkind.ErrPermissionDenied},
		{name: "remove grant root", run: func(t *testing.T, e *env) error {
			return e.w.Remove(ctx, nil, e.grantRW, true)
		}, want: errkind.ErrPermissionDenied},
		{name: "rename root", run: func(t *testing.T, e *env) error {
			return e.w.Rename(ctx, nil, ".", "x", false)
		}, want: errkind.ErrPermissionDenied},
		{name: "cwd outside", run: func(t *testing.T, e *env) error {
			_, err := e.w.ResolveDir(ctx, nil, "../outside")
			return err
		}, want: errkind.ErrPathEscape},
		{name: "cwd via symlink to outside", setup: links, run: func(t *testing.T, e *env) error {
			_, err := e.w.ResolveDir(ctx, nil, "reldirlink")
			return err
		}, want: errkind.ErrPathEscape},
		{name: "cwd on a file", setup: links, run: func(t *testing.T, e *env) error {
			_, err := e.w.ResolveDir(ctx, nil, "file.txt")
			return err
		}, want: errkind.ErrNotDirectory},
		{name: "commit through symlink changes nothing", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Commit(ctx, nil, []FileChange{
				{Kind: ChangeWrite, Path: "file.txt", Content: []byte("changed")},
				{Kind: ChangeWrite, Path: "dirlink/secret.txt", Content: []byte("pwned")},
			})
		}, want: errkind.ErrPathEscape, check: func(t *testing.T, e *env) {
			b, _ := os.ReadFile(e.path("file.txt"))
			bytesEqual(t, b, []byte("inside\n"))
		}},
		{name: "commit delete through symlink", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Commit(ctx, nil, []FileChange{{Kind: ChangeDelete, Path: "dirlink/secret.txt"}})
		}, want: errkind.ErrPathEscape},
		{name: "commit move out of the root", setup: links, run: func(t *testing.T, e *env) error {
			return e.w.Commit(ctx, nil, []FileChange{{Kind: ChangeMove, Path: "file.txt", NewPath: "../outside/file.txt"}})
		}, want: errkind.ErrPathEscape},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d attack cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			if c.setup != nil {
				c.setup(t, e)
			}
			before := snapshot(t, e.outside)
			beforeRO := snapshot(t, e.grantRO)
			done := make(chan error, 1)
			go func() { done <- c.run(t, e) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("operation hung")
			}
			checkErr(t, e, err, c.want)
			if d := diffSnapshots(before, snapshot(t, e.outside)); d != "" {
				t.Fatalf("outside tree changed:\n%s", d)
			}
			if d := diffSnapshots(beforeRO, snapshot(t, e.grantRO)); d != "" {
				t.Fatalf("read-only grant changed:\n%s", d)
			}
			if c.check != nil {
				c.check(t, e)
			}
			if left := tempFiles(t, e.base); len(left) > 0 {
				t.Fatalf("temporary files left: %v", left)
			}
		})
	}
}

func mknodSetup(name string, mode uint32, dev int) func(t *testing.T, e *env) {
	return func(t *testing.T, e *env) {
		if err := syscall.Mknod(e.path(name), mode, dev); err != nil {
			testenv.Skip(t, fmt.Sprintf("mknod (root with CAP_MKNOD): %v", err))
		}
	}
}

// TestAttackParentSwap swaps a directory for a symlink to the outside tree
// concurrently with writes, reads, mkdirs and removals through it, and
// checks nothing ever lands outside.
func TestAttackParentSwap(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	must(t, os.Mkdir(e.path("realdir"), 0o755))
	must(t, os.Symlink(e.outside, e.path("abslink")))
	must(t, os.Symlink("../outside", e.path("rellink")))
	before := snapshot(t, e.outside)

	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		n := 0
		defer func() { swapped <- n }()
		p := e.path("p")
		for {
			for _, src := range []string{"realdir", "abslink", "rellink"} {
				select {
				case <-stop:
					return
				default:
				}
				// The workspace makes a real "p" while it is missing
				// (MakeDir and Commit create parents): clear it and retry.
				var err error
				for range 1000 {
					if err = os.Rename(e.path(src), p); err == nil {
						break
					}
					_ = os.RemoveAll(p)
				}
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				if err := os.Rename(p, e.path(src)); err != nil {
					t.Error(err)
					return
				}
				n++
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	ok := 0
	tally := map[string]int{}
	note := func(err error) {
		if err == nil {
			tally["ok"]++
			return
		}
		if errors.Is(err, errkind.ErrInternal) {
			t.Errorf("internal error under the race: %v", err)
		}
		var pe *errkind.PathError
		if !errors.As(err, &pe) {
			t.Errorf("not a PathError: %v", err)
			return
		}
		tally[sentinelOf(err)]++
		if errors.Is(err, errkind.ErrInvalidArgument) && tally[sentinelOf(err)] < 4 {
			t.Logf("invalid: %v", err)
		}
	}
	for time.Now().Before(deadline) {
		err := writeString(ctx, e.w, nil, "p/secret.txt", "pwned")
		if err == nil {
			ok++
		}
		note(err)
		note(writeString(ctx, e.w, nil, "p/sub/new.txt", "pwned"))
		b, err := readAll(ctx, e.w, nil, "p/secret.txt")
		if err == nil && string(b) != "pwned" {
			t.Fatalf("read returned %q", b)
		}
		note(err)
		note(e.w.MakeDir(ctx, nil, "p/sub/made", 0o755, true))
		note(e.w.Remove(ctx, nil, "p/sub/inner.txt", false))
		note(e.w.Remove(ctx, nil, "p/secret.txt", false))
		note(e.w.Rename(ctx, nil, "p/sub", "stolen", false))
		note(e.w.Commit(ctx, nil, []FileChange{{Kind: ChangeWrite, Path: "p/c.txt", Content: []byte("pwned")}}))
	}
	close(stop)
	n := <-swapped
	t.Logf("%d swaps, %d successful writes into the real directory, outcomes %v", n, ok, tally)
	if d := diffSnapshots(before, snapshot(t, e.outside)); d != "" {
		t.Fatalf("outside tree changed:\n%s", d)
	}
}

// TestAttackGrantRules checks that grants are validated.
func TestAttackGrantRules(t *testing.T) {
	e := newEnv(t)
	must(t, os.Mkdir(e.path("inner"), 0o755))
	for _, gs := range [][]Grant{
		{{Path: "/"}},
		{{Path: "relative"}},
		{{Path: e.root}},
		{{Path: e.path("inner"), ReadOnly: true}},                             // read-only inside the workspace
		{{Path: e.grantRW}, {Path: e.grantRW}},                                // twice
		{{Path: e.base}, {Path: filepath.Join(e.base, "ro"), ReadOnly: true}}, // read-only inside writable
		{{Path: filepath.Join(e.base, "missing")}},
	} {
		if err := e.w.SetGrants(gs); err == nil {
			t.Errorf("SetGrants(%+v) accepted", gs)
		}
	}
	// The previous grants still apply.
	if _, err := e.w.Stat(context.Background(), nil, filepath.Join(e.grantRW, "data.txt")); err != nil {
		t.Fatal(err)
	}
	must(t, e.w.SetGrants(nil))
	_, err := e.w.Stat(context.Background(), nil, filepath.Join(e.grantRW, "data.txt"))
	checkErr(t, e, err, errkind.ErrPathEscape)
}

// sentinelOf names the compute sentinel err wraps.
func sentinelOf(err error) string {
	for _, s := range []error{
		errkind.ErrNotFound, errkind.ErrAlreadyExists, errkind.ErrInvalidArgument,
		errkind.ErrPermissionDenied, errkind.ErrPathEscape, errkind.ErrReadOnly,
		errkind.ErrNotDirectory, errkind.ErrIsDirectory, errkind.ErrNotEmpty,
		errkind.ErrNoSpace, errkind.ErrResourceExhausted, errkind.ErrFailedPrecondition,
		errkind.ErrConflict, errkind.ErrInternal,
	} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "other: " + err.Error()
}
