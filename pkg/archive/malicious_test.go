package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// victim is a workspace with some content, next to a directory outside it
// that no restore may touch.
type victim struct {
	root, outside string
	before, out   map[string]string
}

func newVictim(t testing.TB) *victim {
	t.Helper()
	base := t.TempDir()
	v := &victim{root: filepath.Join(base, "ws"), outside: filepath.Join(base, "outside")}
	writeFile(t, filepath.Join(v.root, "keep.txt"), "workspace content\n", 0o644)
	writeFile(t, filepath.Join(v.root, "d/inner"), "inner\n", 0o600)
	writeFile(t, filepath.Join(v.root, "m/keep/data"), "preserved\n", 0o600)
	if err := os.Symlink("d/inner", filepath.Join(v.root, "ln")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v.outside, "secret"), "outside\n", 0o600)
	v.before = describe(t, v.root)
	v.out = describe(t, base)
	return v
}

// check verifies that nothing changed, inside or outside the workspace.
func (v *victim) check(t testing.TB) {
	t.Helper()
	requireSame(t, "workspace", v.before, describe(t, v.root))
	requireSame(t, "everything around the workspace", v.out, describe(t, filepath.Dir(v.root)))
	requireNoStaging(t, v.root)
}

func TestMaliciousArchives(t *testing.T) {
	long := strings.Repeat("n", 250) + "/"
	name5000 := strings.Repeat(long, 20)[:5000]
	cases := []struct {
		name     string
		data     func(t testing.TB) io.Reader
		opts     RestoreOptions
		sentinel error
		member   string
	}{
		{"absolute name", members(tm{name: "/etc/evil", body: "x"}), RestoreOptions{}, errkind.ErrPathEscape, "/etc/evil"},
		{"dot-dot", members(tm{name: "../x", body: "x"}), RestoreOptions{}, errkind.ErrPathEscape, "../x"},
		{"inner dot-dot", members(tm{name: "a/../../x", body: "x"}), RestoreOptions{}, errkind.ErrPathEscape, "a/../../x"},
		{"symlink to /etc then a file through it", members(
			tm{name: "etc", typ: tar.TypeSymlink, link: "/etc"},
			tm{name: "etc/evil", body: "x"}), RestoreOptions{}, errkind.ErrPathEscape, "etc"},
		{"symlink to /etc then a file through it, external links allowed", members(
			tm{name: "etc", typ: tar.TypeSymlink, link: "/etc"},
			tm{name: "etc/evil", body: "x"}), RestoreOptions{AllowExternalSymlinks: true}, errkind.ErrPathEscape, "etc/evil"},
		{"symlink to ../.. then a file", members(
			tm{name: "up", typ: tar.TypeSymlink, link: "../.."},
			tm{name: "up/outside/secret", body: "x"}), RestoreOptions{}, errkind.ErrPathEscape, "up"},
		{"symlink to ../.. then a file, external links allowed", members(
			tm{name: "up", typ: tar.TypeSymlink, link: "../.."},
			tm{name: "up/outside/secret", body: "x"}), RestoreOptions{AllowExternalSymlinks: true}, errkind.ErrPathEscape, "up/outside/secret"},
		{"symlink to an inner dir then a file", members(
			tm{name: "d", typ: tar.TypeDir},
			tm{name: "l", typ: tar.TypeSymlink, link: "d"},
			tm{name: "l/f", body: "x"}), RestoreOptions{}, errkind.ErrPathEscape, "l/f"},
		{"chain of harmless-looking links", members(
			tm{name: "esc", typ: tar.TypeSymlink, link: "x/up/.."},
			tm{name: "x", typ: tar.TypeDir},
			tm{name: "x/up", typ: tar.TypeSymlink, link: ".."}), RestoreOptions{}, errkind.ErrPathEscape, "esc"},
		{"link climbing out of a subdirectory", members(
			tm{name: "a/b/l", typ: tar.TypeSymlink, link: "../../../outside"}), RestoreOptions{}, errkind.ErrPathEscape, "a/b/l"},
		{"hard link to /etc/passwd", members(tm{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}),
			RestoreOptions{}, errkind.ErrPathEscape, "h"},
		{"hard link out with dot-dot", members(tm{name: "h", typ: tar.TypeLink, link: "../outside/secret"}),
			RestoreOptions{}, errkind.ErrPathEscape, "h"},
		{"hard link to a later member", members(
			tm{name: "h", typ: tar.TypeLink, link: "later"},
			tm{name: "later", body: "x"}), RestoreOptions{}, errkind.ErrInvalidArgument, "h"},
		{"hard link to a directory", members(
			tm{name: "d", typ: tar.TypeDir},
			tm{name: "h", typ: tar.TypeLink, link: "d"}), RestoreOptions{}, errkind.ErrInvalidArgument, "h"},
		{"hard link to a workspace file", members(tm{name: "h", typ: tar.TypeLink, link: "keep.txt"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "h"},
		{"duplicate files", members(tm{name: "f", body: "1"}, tm{name: "f", body: "2"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "f"},
		{"duplicate directories", members(tm{name: "d/", typ: tar.TypeDir}, tm{name: "./d", typ: tar.TypeDir}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "./d"},
		{"file over an implied directory", members(tm{name: "d/f", body: "1"}, tm{name: "d", body: "2"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "d"},
		{"member below a file", members(tm{name: "f", body: "1"}, tm{name: "f/g", body: "2"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "f/g"},
		{"char device", members(tm{name: "null", typ: tar.TypeChar}), RestoreOptions{}, errkind.ErrInvalidArgument, "null"},
		{"block device", members(tm{name: "sda", typ: tar.TypeBlock}), RestoreOptions{}, errkind.ErrInvalidArgument, "sda"},
		{"fifo", members(tm{name: "pipe", typ: tar.TypeFifo}), RestoreOptions{}, errkind.ErrInvalidArgument, "pipe"},
		{"name of 5000 bytes", members(tm{name: name5000, body: "x"}), RestoreOptions{}, errkind.ErrInvalidArgument, name5000[:100]},
		{"component of 256 bytes", members(tm{name: strings.Repeat("c", 256), body: "x"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "ccc"},
		{"too deep", members(tm{name: strings.Repeat("d/", 20) + "f", body: "x"}),
			RestoreOptions{Limits: Limits{MaxDepth: 10}}, errkind.ErrInvalidArgument, "d/d/d"},
		{"name not UTF-8", members(tm{name: "bad\xff\xfe", body: "x"}), RestoreOptions{}, errkind.ErrInvalidArgument, `bad\xff`},
		{"symlink target not UTF-8", members(tm{name: "l", typ: tar.TypeSymlink, link: "t\xff"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "l"},
		{"empty symlink target", members(tm{name: "l", typ: tar.TypeSymlink}), RestoreOptions{}, errkind.ErrInvalidArgument, "l"},
		{"reserved staging name", members(tm{name: ReservedPrefix + "x/f", body: "x"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, ReservedPrefix},
		{"temporary file name", members(tm{name: "a/.bulkhead-tmp-1", body: "x"}),
			RestoreOptions{}, errkind.ErrInvalidArgument, "a/.bulkhead-tmp-1"},
		{"root that is not a directory", members(tm{name: ".", body: "x"}), RestoreOptions{}, errkind.ErrInvalidArgument, "."},
		{"file over a preserved path's directory", members(tm{name: "m", body: "x"}),
			RestoreOptions{Exclude: []string{"m/keep"}}, errkind.ErrInvalidArgument, "m"},
		{"many members", raw(func(t testing.TB) []byte {
			// A flat directory of 10,000 files is slow on some filesystems.
			var ms []tm
			for i := range 20000 {
				ms = append(ms, tm{name: fmt.Sprintf("d%03d/f%03d", i/100, i%100), typ: tar.TypeReg})
			}
			return craft(t, true, ms...)
		}), RestoreOptions{Limits: Limits{MaxMembers: 10000}}, errkind.ErrResourceExhausted, "d100/f000"},
		{"zstd bomb", bomb("bomb", 10<<30), RestoreOptions{Limits: Limits{RatioMinBytes: 8 << 20}},
			errkind.ErrResourceExhausted, "bomb"},
		{"zstd bomb in an excluded member", bomb("skipped/bomb", 10<<30),
			RestoreOptions{Exclude: []string{"skipped"}, Limits: Limits{RatioMinBytes: 8 << 20}},
			errkind.ErrResourceExhausted, "skipped/bomb"},
		{"input too large", raw(func(t testing.TB) []byte {
			return craft(t, false, tm{name: "f", size: 1 << 20})
		}), RestoreOptions{Limits: Limits{MaxInputBytes: 64 << 10}}, errkind.ErrResourceExhausted, "f"},
		{"declared size over the byte limit", raw(func(t testing.TB) []byte {
			return craft(t, true, tm{name: "a", size: 600 << 10}, tm{name: "b", size: 600 << 10})
		}), RestoreOptions{Limits: Limits{MaxBytes: 1 << 20}}, errkind.ErrResourceExhausted, "b"},
		{"written bytes over the byte limit", raw(func(t testing.TB) []byte {
			return craft(t, true, tm{name: "a", size: 600 << 10}, tm{name: "b", size: 600 << 10})
		}), RestoreOptions{Limits: Limits{MaxBytes: 1 << 20}, hooks: testHooks{ignoreDeclaredSize: true}},
			errkind.ErrResourceExhausted, "b"},
		{"truncated zstd archive", raw(func(t testing.TB) []byte {
			b := craft(t, true, tm{name: "a", body: strings.Repeat("text ", 100000)}, tm{name: "b", body: "x"})
			return b[:len(b)/2]
		}), RestoreOptions{}, errkind.ErrInvalidArgument, "a"},
		{"truncated in a member", raw(func(t testing.TB) []byte {
			b := craft(t, false, tm{name: "a", body: strings.Repeat("x", 4096)})
			return b[:1024]
		}), RestoreOptions{}, errkind.ErrInvalidArgument, "a"},
		{"truncated between members", raw(func(t testing.TB) []byte {
			b := craft(t, false, tm{name: "a", body: "x"}, tm{name: "b", body: "y"})
			return b[:1024]
		}), RestoreOptions{}, errkind.ErrInvalidArgument, streamName},
		{"empty input", raw(func(testing.TB) []byte { return nil }), RestoreOptions{}, errkind.ErrInvalidArgument, streamName},
		{"garbage", raw(func(testing.TB) []byte {
			b := make([]byte, 64<<10)
			_, _ = rand.NewChaCha8([32]byte{7}).Read(b)
			return b
		}), RestoreOptions{}, errkind.ErrInvalidArgument, streamName},
		{"garbage after a zstd magic", raw(func(testing.TB) []byte {
			b := make([]byte, 4096)
			_, _ = rand.NewChaCha8([32]byte{8}).Read(b)
			return append([]byte{0x28, 0xb5, 0x2f, 0xfd}, b...)
		}), RestoreOptions{}, errkind.ErrInvalidArgument, streamName},
		{"data after the end marker", raw(func(t testing.TB) []byte {
			return append(craft(t, false, tm{name: "a", body: "x"}), []byte("trailing garbage")...)
		}), RestoreOptions{}, errkind.ErrInvalidArgument, streamName},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := newVictim(t)
			_, err := Restore(context.Background(), v.root, c.data(t), c.opts)
			requirePathError(t, err, c.sentinel, c.member)
			v.check(t)
		})
	}
}

// members returns a builder of a zstd archive of ms.
func members(ms ...tm) func(t testing.TB) io.Reader {
	return func(t testing.TB) io.Reader { return bytes.NewReader(craft(t, true, ms...)) }
}

// raw turns a builder of bytes into a builder of a reader.
func raw(f func(t testing.TB) []byte) func(t testing.TB) io.Reader {
	return func(t testing.TB) io.Reader { return bytes.NewReader(f(t)) }
}

// bomb returns a builder of a lazily generated zstd archive holding a
// member of size zero bytes at name.
func bomb(name string, size int64) func(t testing.TB) io.Reader {
	return func(t testing.TB) io.Reader {
		r, stop := lazyArchive(t, true, func(tw *tar.Writer) error {
			writeMember(t, tw, tm{name: "small", body: "x"})
			if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
				return err
			}
			_, err := io.CopyN(tw, zeroReader{}, size)
			return err
		})
		t.Cleanup(func() { stop() })
		return r
	}
}

// TestHugeZeroMember streams a member declaring 10 GiB of zeros and checks
// that Restore stops at the byte limit, by the declared size and by the
// bytes actually written, without filling the disk.
func TestHugeZeroMember(t *testing.T) {
	const limit = 64 << 20
	for _, counted := range []bool{false, true} {
		t.Run(fmt.Sprintf("counted=%v", counted), func(t *testing.T) {
			v := newVictim(t)
			r, stop := lazyArchive(t, !counted, func(tw *tar.Writer) error {
				if err := tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10 << 30}); err != nil {
					return err
				}
				_, err := io.CopyN(tw, zeroReader{}, 10<<30)
				return err
			})
			opts := RestoreOptions{Limits: Limits{MaxBytes: limit}, hooks: testHooks{ignoreDeclaredSize: counted}}
			st, err := Restore(context.Background(), v.root, r, opts)
			produced := stop()
			requirePathError(t, err, errkind.ErrResourceExhausted, "huge")
			if st.Bytes > limit {
				t.Errorf("wrote %d bytes, limit %d", st.Bytes, limit)
			}
			if produced > 2*limit {
				t.Errorf("read %d bytes of the archive", produced)
			}
			if counted && st.Bytes < limit-copyBufSize {
				t.Errorf("stopped after %d bytes, before the limit", st.Bytes)
			}
			v.check(t)
			if out, err := exec.Command("du", "-sk", v.root).Output(); err == nil {
				kb, _ := strconv.Atoi(strings.Fields(string(out))[0])
				if kb > 1024 {
					t.Errorf("workspace uses %d KiB after a failed restore", kb)
				}
			}
		})
	}
}

func TestCanceledRestore(t *testing.T) {
	v := newVictim(t)
	ctx, cancel := context.WithCancel(context.Background())
	r, stop := lazyArchive(t, true, func(tw *tar.Writer) error {
		for i := 0; ; i++ {
			if i == 100 {
				cancel()
			}
			if err := tw.WriteHeader(&tar.Header{Name: "f" + strconv.Itoa(i), Typeflag: tar.TypeReg, Size: 1000}); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, zeroReader{}, 1000); err != nil {
				return err
			}
		}
	})
	_, err := Restore(ctx, v.root, r, RestoreOptions{})
	stop()
	requirePathError(t, err, errkind.ErrCanceled, "")
	v.check(t)
}

func TestGlobalHeaderAndRootMember(t *testing.T) {
	root := t.TempDir()
	data := craft(t, true,
		tm{name: "pax_global_header", typ: tar.TypeXGlobalHeader, body: "commit 1234"},
		tm{name: "./", typ: tar.TypeDir},
		tm{name: "./a/", typ: tar.TypeDir},
		tm{name: "./a/f", body: "x"})
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "a/f")); err != nil || string(b) != "x" {
		t.Fatalf("a/f = %q, %v", b, err)
	}
}

func TestSetIDBitsDroppedWithoutOwnership(t *testing.T) {
	root := t.TempDir()
	data := craft(t, true, tm{name: "suid", body: "x", mode: 0o4755, uid: 0}, tm{name: "sgid", typ: tar.TypeDir, mode: 0o2775})
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"suid": 0o755, "sgid": os.ModeDir | 0o775} {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
}

func TestExternalSymlinksAllowed(t *testing.T) {
	root := t.TempDir()
	data := craft(t, true, tm{name: "venv/bin/python", typ: tar.TypeSymlink, link: "/usr/bin/python3"},
		tm{name: "up", typ: tar.TypeSymlink, link: "../elsewhere"})
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), RestoreOptions{AllowExternalSymlinks: true}); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(root, "venv/bin/python")); err != nil || target != "/usr/bin/python3" {
		t.Fatalf("link = %q, %v", target, err)
	}
}

func TestBadOptions(t *testing.T) {
	root := t.TempDir()
	data := craft(t, true, tm{name: "f", body: "x"})
	for _, opts := range []RestoreOptions{
		{Exclude: []string{"/abs"}},
		{Exclude: []string{"."}},
		{Exclude: []string{""}},
		{Limits: Limits{MaxBytes: -1}},
		{Limits: Limits{MaxExpansionRatio: 0.5}},
	} {
		if _, err := Restore(context.Background(), root, bytes.NewReader(data), opts); err == nil {
			t.Errorf("Restore with %+v succeeded", opts)
		}
	}
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), RestoreOptions{Exclude: []string{"../x"}}); !isPathEscape(err) {
		t.Errorf("exclude ../x: %v", err)
	}
	if _, err := Write(context.Background(), root, io.Discard, WriteOptions{Level: 23}); err == nil {
		t.Error("Write with level 23 succeeded")
	}
	if _, err := Restore(context.Background(), filepath.Join(root, "missing"), bytes.NewReader(data), RestoreOptions{}); err == nil {
		t.Error("Restore into a missing root succeeded")
	}
	requireNoStaging(t, root)
	if _, err := os.Lstat(filepath.Join(root, "f")); !os.IsNotExist(err) {
		t.Errorf("f exists: %v", err)
	}
}

func isPathEscape(err error) bool {
	var pe *errkind.PathError
	return errors.As(err, &pe) && errors.Is(err, errkind.ErrPathEscape)
}
