package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// buildTree makes a tree with every kind of entry Write archives, plus a
// FIFO (skipped) and two excluded paths, and returns the excludes.
func buildTree(t testing.TB, root string) []string {
	t.Helper()
	writeFile(t, filepath.Join(root, "a/f600"), "private\n", 0o600)
	writeFile(t, filepath.Join(root, "a/run.sh"), "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, filepath.Join(root, "a/b/c/f644"), "deep\n", 0o644)
	writeFile(t, filepath.Join(root, "ünïcödé-名前.txt"), "utf-8 name\n", 0o644)
	writeFile(t, filepath.Join(root, "a/b/h1"), "linked\n", 0o640)
	if err := os.Link(filepath.Join(root, "a/b/h1"), filepath.Join(root, "z-h2")); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 5<<20)
	r := rand.NewChaCha8([32]byte{1})
	_, _ = r.Read(big[:len(big)/2]) // half random, half zeros
	if err := os.WriteFile(filepath.Join(root, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"empty", "ro"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(root, "ro/inside"), "in a read-only dir\n", 0o444)
	if err := os.Symlink("b/c/f644", filepath.Join(root, "a/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(root, "top-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("missing/target", filepath.Join(root, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "a/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "skipped/x"), "excluded\n", 0o644)
	writeFile(t, filepath.Join(root, "a/b/mnt/data"), "excluded too\n", 0o644)
	writeFile(t, filepath.Join(root, "a/.bulkhead-tmp-123"), "temp\n", 0o600)
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(root, "a/f600"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, "a/run.sh"), 0o4755); err != nil {
			t.Fatal(err)
		}
	}
	// Times with nanoseconds, set last (children change their parent's).
	ts := time.Date(2021, 3, 4, 5, 6, 7, 123456789, time.UTC)
	_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&os.ModeSymlink == 0 && p != root {
			ts = ts.Add(time.Second + 1)
			_ = os.Chtimes(p, ts, ts)
		}
		return nil
	})
	if err := os.Chmod(filepath.Join(root, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	return []string{"skipped", "a/b/mnt"}
}

// withoutExcluded drops the excluded paths, the FIFO and the temporary
// file from a description.
func withoutExcluded(d map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range d {
		switch {
		case k == "skipped", k == "a/b/mnt", filepath.Dir(k) == "skipped", filepath.Dir(k) == "a/b/mnt",
			k == "a/fifo", k == "a/.bulkhead-tmp-123", k == ".":
			continue
		}
		out[k] = v
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	for _, c := range []Compression{CompressionZstd, CompressionNone} {
		t.Run(c.String(), func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			excl := buildTree(t, src)
			data := archiveOf(t, src, WriteOptions{Compression: c, Exclude: excl})

			// The destination has its own excluded entries, which survive.
			writeFile(t, filepath.Join(dst, "skipped/mine"), "kept\n", 0o600)
			writeFile(t, filepath.Join(dst, "a/b/mnt/mounted"), "kept too\n", 0o600)
			writeFile(t, filepath.Join(dst, "old"), "replaced\n", 0o600)
			keptBefore := describe(t, filepath.Join(dst, "skipped"))
			mntBefore := describe(t, filepath.Join(dst, "a/b/mnt"))

			st, err := Restore(context.Background(), dst, bytes.NewReader(data),
				RestoreOptions{Exclude: excl, PreserveOwnership: true})
			if err != nil {
				t.Fatalf("Restore: %v", err)
			}
			want := Stats{Members: 16, Files: 7, Dirs: 5, Symlinks: 3, HardLinks: 1, Bytes: 5<<20 + 68}
			if st != want {
				t.Errorf("stats = %+v, want %+v", st, want)
			}
			requireSame(t, "restored tree", withoutExcluded(describe(t, src)), withoutExcluded(describe(t, dst)))
			requireSame(t, "preserved dir", keptBefore, describe(t, filepath.Join(dst, "skipped")))
			requireSame(t, "preserved mount", mntBefore, describe(t, filepath.Join(dst, "a/b/mnt")))
			if _, err := os.Lstat(filepath.Join(dst, "old")); !os.IsNotExist(err) {
				t.Errorf("old entry survived the restore: %v", err)
			}
			requireNoStaging(t, dst)

			var s1, s2 syscall.Stat_t
			_ = syscall.Lstat(filepath.Join(dst, "a/b/h1"), &s1)
			_ = syscall.Lstat(filepath.Join(dst, "z-h2"), &s2)
			if s1.Ino != s2.Ino || s1.Nlink != 2 {
				t.Errorf("hard links not preserved: inodes %d %d, nlink %d", s1.Ino, s2.Ino, s1.Nlink)
			}
			fo := FingerprintOptions{Exclude: excl, Extra: []byte("manifest")}
			if a, b := fingerprint(t, src, fo), fingerprint(t, dst, fo); a != b {
				t.Errorf("fingerprints differ: %s vs %s", a, b)
			}
		})
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	src := t.TempDir()
	excl := buildTree(t, src)
	a := archiveOf(t, src, WriteOptions{Exclude: excl})
	b := archiveOf(t, src, WriteOptions{Exclude: excl})
	if !bytes.Equal(a, b) {
		t.Fatal("two archives of the same tree differ")
	}
}

func TestWriteOrderAndHeaders(t *testing.T) {
	src := t.TempDir()
	excl := buildTree(t, src)
	data := archiveOf(t, src, WriteOptions{Compression: CompressionNone, Exclude: excl,
		UserName: func(uid uint32) string {
			if uid == 0 {
				return "root"
			}
			return ""
		},
		GroupName: func(uint32) string { return "grp" }})
	tr := tar.NewReader(bytes.NewReader(data))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if !hdr.AccessTime.IsZero() || !hdr.ChangeTime.IsZero() {
			t.Errorf("%s: access or change time recorded", hdr.Name)
		}
		if hdr.Gname != "grp" {
			t.Errorf("%s: gname %q", hdr.Name, hdr.Gname)
		}
		if hdr.Name == "a/b/c/f644" && hdr.ModTime.Nanosecond() == 0 {
			t.Errorf("%s: mtime lost its nanoseconds", hdr.Name)
		}
		if hdr.Name == "z-h2" && (hdr.Typeflag != tar.TypeLink || hdr.Linkname != "a/b/h1") {
			t.Errorf("z-h2 = type %q link %q, want a hard link to a/b/h1", hdr.Typeflag, hdr.Linkname)
		}
	}
	want := []string{"a/", "a/b/", "a/b/c/", "a/b/c/f644", "a/b/h1", "a/f600", "a/link", "a/run.sh",
		"big.bin", "dangling", "empty/", "ro/", "ro/inside", "top-link", "z-h2", "ünïcödé-名前.txt"}
	if len(names) != len(want) {
		t.Fatalf("members %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("members %q, want %q", names, want)
		}
	}
}

func TestWriteStats(t *testing.T) {
	src := t.TempDir()
	excl := buildTree(t, src)
	st, err := Write(context.Background(), src, io.Discard, WriteOptions{Exclude: excl})
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{Members: 16, Files: 7, Dirs: 5, Symlinks: 3, HardLinks: 1, Bytes: 5<<20 + 68, Skipped: 1}
	if st != want {
		t.Errorf("stats = %+v, want %+v", st, want)
	}
}

func TestWriteCanceled(t *testing.T) {
	src := t.TempDir()
	buildTree(t, src)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Write(ctx, src, io.Discard, WriteOptions{})
	if err == nil {
		t.Fatal("Write with a canceled context succeeded")
	}
}

// TestGNUTarInterop extracts our archive with GNU tar and restores GNU
// tar's archive of the same tree with Restore.
func TestGNUTarInterop(t *testing.T) {
	testenv.Require(t, testenv.Tool("tar"), testenv.Tool("zstd"))
	src := t.TempDir()
	excl := buildTree(t, src)
	for _, e := range append(excl, "a/fifo", "a/.bulkhead-tmp-123") {
		if err := os.RemoveAll(filepath.Join(src, e)); err != nil {
			t.Fatal(err)
		}
	}
	want := withoutExcluded(describe(t, src))

	ours := filepath.Join(t.TempDir(), "ours.tar.zst")
	if err := os.WriteFile(ours, archiveOf(t, src, WriteOptions{}), 0o644); err != nil {
		t.Fatal(err)
	}
	byTar := t.TempDir()
	if out, err := exec.Command("tar", "--zstd", "-xpf", ours, "-C", byTar).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	requireSame(t, "tree extracted by GNU tar", want, withoutExcluded(describe(t, byTar)))

	theirs := filepath.Join(t.TempDir(), "theirs.tar.zst")
	if out, err := exec.Command("tar", "--zstd", "--format=pax", "-cf", theirs, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar -c: %v\n%s", err, out)
	}
	f, err := os.Open(theirs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	byUs := t.TempDir()
	if _, err := Restore(context.Background(), byUs, f, RestoreOptions{PreserveOwnership: true}); err != nil {
		t.Fatalf("Restore of GNU tar's archive: %v", err)
	}
	requireSame(t, "tree restored from GNU tar's archive", want, withoutExcluded(describe(t, byUs)))
}

// TestEncoderOutputIndependentOfConcurrency checks the premise that lets
// Write compress in parallel and still be deterministic.
func TestEncoderOutputIndependentOfConcurrency(t *testing.T) {
	src := t.TempDir()
	buildTree(t, src)
	raw := archiveOf(t, src, WriteOptions{Compression: CompressionNone})
	raw = bytes.Repeat(raw, 6) // several sections of 8 MiB
	var outs [][]byte
	for _, n := range []int{2, 3, 4} {
		for _, level := range []int{3, 7} {
			opts := encoderOptions(level, n)
			var buf bytes.Buffer
			enc, err := zstd.NewWriter(&buf, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for b := raw; len(b) > 0; b = b[min(len(b), 100_000):] {
				if _, err := enc.Write(b[:min(len(b), 100_000)]); err != nil {
					t.Fatal(err)
				}
			}
			if err := enc.Close(); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, buf.Bytes())
		}
	}
	for i := 2; i < len(outs); i++ {
		if !bytes.Equal(outs[i], outs[i%2]) {
			t.Fatalf("output %d differs from output %d", i, i%2)
		}
	}
}

// failingWriter fails once it has taken n bytes.
type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		return 0, errors.New("disk on fire")
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriteFailures(t *testing.T) {
	src := t.TempDir()
	buildTree(t, src)
	for _, c := range []int{0, 3} {
		for _, comp := range []Compression{CompressionZstd, CompressionNone} {
			_, err := Write(context.Background(), src, &failingWriter{n: 100 << 10}, WriteOptions{Compression: comp, Concurrency: c})
			if err == nil || !strings.Contains(err.Error(), "disk on fire") {
				t.Errorf("concurrency %d, %v: error %v", c, comp, err)
			}
		}
	}
	_, err := Write(context.Background(), filepath.Join(src, "missing"), io.Discard, WriteOptions{})
	requirePathError(t, err, errkind.ErrNotFound, ".")
}
