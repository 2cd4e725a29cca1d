package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// ---- helpers shared by the file and patch tests ----

// pseudoRandomBytes returns n deterministic pseudo-random bytes.
func pseudoRandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			out[i+j] = byte(v >> (8 * j))
		}
	}
	return out
}

func writeBytes(ctx context.Context, c *agentclient.Client, path string, opts agentclient.WriteFileOptions, data []byte) (*agentclient.WriteFileResult, error) {
	return c.WriteFile(ctx, path, opts, bytes.NewReader(data))
}

func readBytes(ctx context.Context, c *agentclient.Client, path string, opts agentclient.ReadFileOptions) ([]byte, *agentclient.FileInfo, error) {
	var buf bytes.Buffer
	info, err := c.ReadFile(ctx, path, opts, &buf)
	return buf.Bytes(), info, err
}

func mustWrite(t *testing.T, p string, data string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // no umask
		t.Fatal(err)
	}
}

func diskContent(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b)
}

func assertMissing(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s exists (or cannot be checked: %v); it must not", p, err)
	}
}

// tempLeftovers returns the workspace temporary files in dir.
func tempLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), workspace.TempPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	if left := tempLeftovers(t, dir); len(left) > 0 {
		t.Fatalf("temporary files left in %s: %v", dir, left)
	}
}

// treeEntry is what a test compares of one filesystem object.
type treeEntry struct {
	Mode    fs.FileMode // type and permission bits
	Content string
	Link    string
	UID     uint32
	GID     uint32
}

// snapshotTree records every object below root (names, types, modes,
// owners, contents, link targets).
func snapshotTree(t *testing.T, root string) map[string]treeEntry {
	t.Helper()
	out := map[string]treeEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := treeEntry{Mode: fi.Mode(), UID: st.Uid, GID: st.Gid}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.Content = string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.Link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func assertSameTree(t *testing.T, what string, before, after map[string]treeEntry) {
	t.Helper()
	if maps.Equal(before, after) {
		return
	}
	keys := slices.Sorted(maps.Keys(before))
	for k := range after {
		if _, ok := before[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		b, inB := before[k]
		a, inA := after[k]
		if inB != inA || a != b {
			t.Errorf("%s: %s changed:\n  before %v %+v\n  after  %v %+v", what, k, inB, b, inA, a)
		}
	}
	t.FailNow()
}

// assertPathErr checks err matches sentinel, is a *errkind.PathError for
// exactly the caller's path, and mentions none of the host paths.
func assertPathErr(t *testing.T, err error, sentinel error, path string, hostPaths ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("%q: want %v, got %v", path, sentinel, err)
	}
	var pe *errkind.PathError
	switch {
	case errors.As(err, &pe):
		if pe.Path != path {
			t.Fatalf("error path %q, want the caller's %q (%v)", pe.Path, path, err)
		}
	case path != "":
		// (An empty path cannot travel in ErrorDetail.path.)
		t.Fatalf("%q: error is not a *errkind.PathError: %#v", path, err)
	}
	for _, h := range hostPaths {
		if h != "" && strings.Contains(err.Error(), h) {
			t.Fatalf("error for %q reveals host path %q: %v", path, h, err)
		}
	}
}

// fakeEtc writes an etc/passwd and etc/group with root and the user
// "analyst" (65534:65534) and returns their root.
func fakeEtc(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nanalyst:x:65534:65534:Analyst:/home/analyst:/bin/sh\n", 0o644)
	mustWrite(t, filepath.Join(root, "etc/group"), "root:x:0:\nanalyst:x:65534:\n", 0o644)
	return root
}

func skipUnlessRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.Root)
}

func diskOwner(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// ---- tests ----

func TestWriteReadRoundTripLarge(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	data := pseudoRandomBytes(3<<20+12345, 1) // several chunks both ways, not a multiple of either chunk size
	sum := sha256.Sum256(data)
	size := int64(len(data))

	resp, err := writeBytes(ctx, td.client, "deep/dir/blob.bin", agentclient.WriteFileOptions{
		CreateParents:  true,
		ExpectedSize:   &size,
		ExpectedSHA256: sum[:],
	}, data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.SHA256, sum[:]) || resp.Info.Size != size || resp.Info.Path != "deep/dir/blob.bin" {
		t.Fatalf("write response: size %d path %q sha %x", resp.Info.Size, resp.Info.Path, resp.SHA256)
	}
	if got := sha256.Sum256([]byte(diskContent(t, filepath.Join(td.workspace, "deep/dir/blob.bin")))); got != sum {
		t.Fatal("the file on disk differs from what was sent")
	}
	if resp.Info.Mode != 0o644 || resp.Info.Type != agentclient.FileRegular {
		t.Fatalf("new file info %v", resp.Info)
	}

	got, info, err := readBytes(ctx, td.client, "deep/dir/blob.bin", agentclient.ReadFileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sum || info.Size != size {
		t.Fatalf("read back %d bytes (info size %d), sha mismatch or wrong size", len(got), info.Size)
	}

	// On the wire the read is a stream of bounded chunks, info first.
	stream, err := agentdv1.NewFileServiceClient(authConn(t, td.socket)).ReadFile(ctx, &agentdv1.ReadFileRequest{Path: "deep/dir/blob.bin"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs int
	h := sha256.New()
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if (msgs == 0) != (msg.Info != nil) {
			t.Fatalf("message %d: info present = %v; only the first carries it", msgs, msg.Info != nil)
		}
		if len(msg.Data) > readChunkBytes {
			t.Fatalf("message %d carries %d bytes, more than a chunk", msgs, len(msg.Data))
		}
		h.Write(msg.Data)
		msgs++
	}
	if want := (len(data) + readChunkBytes - 1) / readChunkBytes; msgs != want {
		t.Fatalf("%d messages, want %d", msgs, want)
	}
	if !bytes.Equal(h.Sum(nil), sum[:]) {
		t.Fatal("raw stream content differs")
	}

	// Offset and limit.
	for _, c := range []struct {
		offset, limit int64
		want          []byte
	}{
		{1000, 5000, data[1000:6000]},
		{0, 1, data[:1]},
		{size - 10, 100, data[size-10:]},
		{readChunkBytes - 3, readChunkBytes + 7, data[readChunkBytes-3 : 2*readChunkBytes+4]},
		{123456, 0, data[123456:]},
		{size, 0, nil},
		{size + 100, 10, nil},
	} {
		got, _, err := readBytes(ctx, td.client, "deep/dir/blob.bin", agentclient.ReadFileOptions{Offset: c.offset, Limit: c.limit})
		if err != nil {
			t.Fatalf("offset %d limit %d: %v", c.offset, c.limit, err)
		}
		if !bytes.Equal(got, c.want) {
			t.Fatalf("offset %d limit %d: got %d bytes, want %d", c.offset, c.limit, len(got), len(c.want))
		}
	}
	_, _, err = readBytes(ctx, td.client, "deep/dir/blob.bin", agentclient.ReadFileOptions{Offset: -1})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "deep/dir/blob.bin")
	_, _, err = readBytes(ctx, td.client, "deep/dir/blob.bin", agentclient.ReadFileOptions{Limit: -5})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "deep/dir/blob.bin")

	// An empty file still answers with its info.
	if _, err := writeBytes(ctx, td.client, "empty", agentclient.WriteFileOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	got, info, err = readBytes(ctx, td.client, "empty", agentclient.ReadFileOptions{})
	if err != nil || len(got) != 0 || info == nil || info.Name != "empty" {
		t.Fatalf("empty file: %q %v %v", got, info, err)
	}
	assertNoTemp(t, filepath.Join(td.workspace, "deep/dir"))
}

// TestWriteFileHashOnlyWhenAsked: the SHA-256 comes back when asked for
// (compute_sha256) or checked (expected_sha256), and is not computed
// otherwise; the content lands whole either way, and the size limit of
// expected_size holds on the unhashed path too.
func TestWriteFileHashOnlyWhenAsked(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	data := pseudoRandomBytes(2<<20+333, 3)
	sum := sha256.Sum256(data)
	for _, c := range []struct {
		name string
		path string
		opts agentclient.WriteFileOptions
		want []byte
	}{
		{"default", "a.bin", agentclient.WriteFileOptions{}, nil},
		{"compute_sha256", "b.bin", agentclient.WriteFileOptions{ComputeSHA256: true}, sum[:]},
		{"expected_sha256", "c.bin", agentclient.WriteFileOptions{ExpectedSHA256: sum[:]}, sum[:]},
	} {
		resp, err := writeBytes(ctx, td.client, c.path, c.opts, data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(resp.SHA256, c.want) {
			t.Errorf("%s: sha256 %x, want %x", c.name, resp.SHA256, c.want)
		}
		if got := sha256.Sum256([]byte(diskContent(t, filepath.Join(td.workspace, c.path)))); got != sum {
			t.Errorf("%s: the file on disk differs from what was sent", c.name)
		}
	}
	short := int64(len(data) - 1)
	_, err := writeBytes(ctx, td.client, "d.bin", agentclient.WriteFileOptions{ExpectedSize: &short}, data)
	assertPathErr(t, err, errkind.ErrConflict, "d.bin")
	if _, err := os.Lstat(filepath.Join(td.workspace, "d.bin")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused write left d.bin behind: %v", err)
	}
	assertNoTemp(t, td.workspace)
}

func TestWriteFileMismatchKeepsOldFile(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	target := filepath.Join(td.workspace, "keep.txt")
	mustWrite(t, target, "the old content\n", 0o640)

	big := pseudoRandomBytes(1<<20+7, 2)
	bigSum := sha256.Sum256(big)
	wrongSum := sha256.Sum256([]byte("something else"))
	i64 := func(v int64) *int64 { return &v }
	cases := []struct {
		name string
		opts agentclient.WriteFileOptions
		data []byte
	}{
		{"fewer bytes than announced", agentclient.WriteFileOptions{ExpectedSize: i64(10)}, []byte("short")},
		{"more bytes than announced", agentclient.WriteFileOptions{ExpectedSize: i64(3)}, []byte("too long")},
		{"announced empty", agentclient.WriteFileOptions{ExpectedSize: i64(0)}, []byte("x")},
		{"wrong sha256", agentclient.WriteFileOptions{ExpectedSHA256: wrongSum[:]}, []byte("new")},
		{"large, wrong sha256", agentclient.WriteFileOptions{ExpectedSHA256: wrongSum[:]}, big},
		{"large, size one short", agentclient.WriteFileOptions{ExpectedSize: i64(int64(len(big)) + 1), ExpectedSHA256: bigSum[:]}, big},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := writeBytes(ctx, td.client, "keep.txt", c.opts, c.data)
			assertPathErr(t, err, errkind.ErrConflict, "keep.txt", td.workspace)
			if errkind.Retryable(err) {
				t.Fatal("a self-contradicting write must not be retryable")
			}
			if got := diskContent(t, target); got != "the old content\n" {
				t.Fatalf("old file changed to %q", got)
			}
			if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o640 {
				t.Fatalf("old file mode changed to %v", fi.Mode())
			}
			assertNoTemp(t, td.workspace)
		})
	}
	// Also for a new file: nothing is created.
	_, err := writeBytes(ctx, td.client, "new.bin", agentclient.WriteFileOptions{ExpectedSHA256: wrongSum[:]}, big)
	assertPathErr(t, err, errkind.ErrConflict, "new.bin")
	assertMissing(t, filepath.Join(td.workspace, "new.bin"))
	assertNoTemp(t, td.workspace)
	// A malformed checksum is a bad request, not a conflict.
	_, err = writeBytes(ctx, td.client, "keep.txt", agentclient.WriteFileOptions{ExpectedSHA256: []byte{1, 2, 3}}, []byte("x"))
	assertPathErr(t, err, errkind.ErrInvalidArgument, "keep.txt")
	// The right announcement succeeds.
	if _, err := writeBytes(ctx, td.client, "keep.txt", agentclient.WriteFileOptions{ExpectedSize: i64(int64(len(big))), ExpectedSHA256: bigSum[:]}, big); err != nil {
		t.Fatal(err)
	}
	if diskContent(t, target) != string(big) {
		t.Fatal("matching write did not land")
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o640 {
		t.Fatalf("a replaced file keeps its mode; got %v", fi.Mode())
	}
}

func TestWriteFilePolicies(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	mustWrite(t, filepath.Join(ws, "exists.txt"), "original", 0o644)
	if err := os.Mkdir(filepath.Join(ws, "adir"), 0o755); err != nil {
		t.Fatal(err)
	}

	_, err := writeBytes(ctx, td.client, "exists.txt", agentclient.WriteFileOptions{Overwrite: agentclient.OverwriteNever}, []byte("clobbered"))
	assertPathErr(t, err, errkind.ErrAlreadyExists, "exists.txt", ws)
	if diskContent(t, filepath.Join(ws, "exists.txt")) != "original" {
		t.Fatal("NEVER replaced an existing file")
	}
	if _, err := writeBytes(ctx, td.client, "fresh.txt", agentclient.WriteFileOptions{Overwrite: agentclient.OverwriteNever}, []byte("fresh")); err != nil {
		t.Fatalf("NEVER on a new file: %v", err)
	}

	_, err = writeBytes(ctx, td.client, "missing.txt", agentclient.WriteFileOptions{Overwrite: agentclient.OverwriteOnlyIfExists}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotFound, "missing.txt", ws)
	assertMissing(t, filepath.Join(ws, "missing.txt"))
	if _, err := writeBytes(ctx, td.client, "exists.txt", agentclient.WriteFileOptions{Overwrite: agentclient.OverwriteOnlyIfExists}, []byte("replaced")); err != nil {
		t.Fatalf("ONLY_IF_EXISTS on an existing file: %v", err)
	}
	if diskContent(t, filepath.Join(ws, "exists.txt")) != "replaced" {
		t.Fatal("ONLY_IF_EXISTS did not replace")
	}

	_, err = writeBytes(ctx, td.client, "no/such/parent.txt", agentclient.WriteFileOptions{}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotFound, "no/such/parent.txt", ws)
	assertMissing(t, filepath.Join(ws, "no"))
	if _, err := writeBytes(ctx, td.client, "no/such/parent.txt", agentclient.WriteFileOptions{CreateParents: true}, []byte("x")); err != nil {
		t.Fatalf("create_parents: %v", err)
	}

	_, err = writeBytes(ctx, td.client, "adir", agentclient.WriteFileOptions{}, []byte("x"))
	assertPathErr(t, err, errkind.ErrIsDirectory, "adir", ws)
	if fi, err := os.Stat(filepath.Join(ws, "adir")); err != nil || !fi.IsDir() {
		t.Fatal("the directory was replaced")
	}
	_, err = writeBytes(ctx, td.client, "exists.txt/child", agentclient.WriteFileOptions{}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotDirectory, "exists.txt/child", ws)

	// The header must come first.
	ws2, err := agentdv1.NewFileServiceClient(authConn(t, td.socket)).WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = ws2.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: []byte("headless")}})
	if _, err := ws2.CloseAndRecv(); !errors.Is(errmap.FromStatus(err), errkind.ErrInvalidArgument) {
		t.Fatalf("data before header: want InvalidArgument, got %v", err)
	}
	// A second header in the middle aborts the write and changes nothing.
	ws3, err := agentdv1.NewFileServiceClient(authConn(t, td.socket)).WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = ws3.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Header{Header: &agentdv1.WriteFileHeader{Path: "exists.txt"}}})
	_ = ws3.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: []byte("part")}})
	_ = ws3.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Header{Header: &agentdv1.WriteFileHeader{Path: "other"}}})
	if _, err := ws3.CloseAndRecv(); !errors.Is(errmap.FromStatus(err), errkind.ErrInvalidArgument) {
		t.Fatalf("second header: want InvalidArgument, got %v", err)
	}
	if diskContent(t, filepath.Join(ws, "exists.txt")) != "replaced" {
		t.Fatal("an aborted write changed the file")
	}
	assertMissing(t, filepath.Join(ws, "other"))
	assertNoTemp(t, ws)
}

func TestWriteFileModes(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	for _, mode := range []uint32{0o600, 0o755, 0o640, 0o777} {
		name := "m" + strings.TrimLeft(fs.FileMode(mode).String(), "-")
		resp, err := writeBytes(ctx, td.client, name, agentclient.WriteFileOptions{Mode: mode}, []byte("x"))
		if err != nil {
			t.Fatalf("mode %#o: %v", mode, err)
		}
		fi, err := os.Stat(filepath.Join(ws, name))
		if err != nil {
			t.Fatal(err)
		}
		if uint32(fi.Mode().Perm()) != mode || resp.Info.Mode != mode {
			t.Fatalf("mode %#o: disk %v, reported %#o", mode, fi.Mode(), resp.Info.Mode)
		}
	}
	// Without a mode, a replaced file keeps its bits.
	if _, err := writeBytes(ctx, td.client, "script", agentclient.WriteFileOptions{Mode: 0o755}, []byte("#!/bin/sh\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := writeBytes(ctx, td.client, "script", agentclient.WriteFileOptions{}, []byte("#!/bin/sh\necho\n")); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(ws, "script")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("overwrite without mode changed it to %v", fi.Mode())
	}
	// Set-id, sticky and out-of-range bits are refused, and nothing is created.
	for _, mode := range []uint32{0o4755, 0o2755, 0o1755, 0o10644} {
		_, err := writeBytes(ctx, td.client, "setid", agentclient.WriteFileOptions{Mode: mode}, []byte("x"))
		assertPathErr(t, err, errkind.ErrInvalidArgument, "setid", ws)
		assertMissing(t, filepath.Join(ws, "setid"))
	}
	// Nor may an existing file be turned set-id.
	_, err := writeBytes(ctx, td.client, "script", agentclient.WriteFileOptions{Mode: 0o4755}, []byte("evil"))
	assertPathErr(t, err, errkind.ErrInvalidArgument, "script", ws)
	if fi, _ := os.Stat(filepath.Join(ws, "script")); fi.Mode() != 0o755 {
		t.Fatalf("mode became %v", fi.Mode())
	}
	assertNoTemp(t, ws)
}

func TestStat(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	mustWrite(t, filepath.Join(ws, "dir/file.txt"), "twelve bytes", 0o640)
	if err := os.Symlink("file.txt", filepath.Join(ws, "dir/link")); err != nil {
		t.Fatal(err)
	}

	fi, err := td.client.Stat(ctx, "dir/file.txt", agentclient.StatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Type != agentclient.FileRegular || fi.Size != 12 || fi.Mode != 0o640 ||
		fi.Name != "file.txt" || fi.Path != "dir/file.txt" || fi.Owner != "root" || fi.UID != 0 ||
		fi.ModifiedAt.IsZero() || fi.RawName != nil {
		t.Fatalf("file: %v", fi)
	}
	fi, err = td.client.Stat(ctx, "dir", agentclient.StatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Type != agentclient.FileDirectory || fi.Name != "dir" || fi.Owner != "root" {
		t.Fatalf("dir: %v", fi)
	}
	fi, err = td.client.Stat(ctx, "dir/link", agentclient.StatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Type != agentclient.FileSymlink || fi.SymlinkTarget != "file.txt" || fi.Name != "link" {
		t.Fatalf("symlink (described, not followed): %v", fi)
	}
	// Absolute paths inside the workspace work and are echoed as given.
	abs := filepath.Join(ws, "dir/file.txt")
	if fi, err = td.client.Stat(ctx, abs, agentclient.StatOptions{}); err != nil || fi.Path != abs || fi.Size != 12 {
		t.Fatalf("absolute: %v %v", fi, err)
	}
	// The workspace root itself.
	if fi, err = td.client.Stat(ctx, ".", agentclient.StatOptions{}); err != nil || fi.Type != agentclient.FileDirectory {
		t.Fatalf("root: %v %v", fi, err)
	}
	_, err = td.client.Stat(ctx, "dir/nope", agentclient.StatOptions{})
	assertPathErr(t, err, errkind.ErrNotFound, "dir/nope", ws)
	_, err = td.client.Stat(ctx, "dir/file.txt/below", agentclient.StatOptions{})
	assertPathErr(t, err, errkind.ErrNotDirectory, "dir/file.txt/below", ws)
	_, err = td.client.Stat(ctx, "", agentclient.StatOptions{})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "", ws)
}

func listAll(t *testing.T, ctx context.Context, c *agentclient.Client, dir string, pageSize int) (names []string, pages int) {
	t.Helper()
	token := ""
	for {
		resp, err := c.ListDir(ctx, dir, agentclient.ListDirOptions{PageSize: pageSize, PageToken: token})
		if err != nil {
			t.Fatalf("ListDir %q page %d: %v", dir, pages, err)
		}
		pages++
		if pageSize > 0 && len(resp.Entries) > pageSize {
			t.Fatalf("page %d holds %d entries, more than %d", pages, len(resp.Entries), pageSize)
		}
		for _, e := range resp.Entries {
			name := e.Name
			if e.RawName != nil {
				name = string(e.RawName)
			}
			names = append(names, name)
		}
		token = resp.NextPageToken
		if token == "" {
			return names, pages
		}
		if pages > 100 {
			t.Fatal("the listing does not end")
		}
	}
}

func TestListDirPaging(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	for _, n := range []string{"e.txt", "c.txt", "a.txt"} {
		mustWrite(t, filepath.Join(ws, "list", n), n, 0o644)
	}
	for _, n := range []string{"d", "b"} {
		if err := os.Mkdir(filepath.Join(ws, "list", n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The workspace's own temporary files are not listed.
	mustWrite(t, filepath.Join(ws, "list", workspace.TempPrefix+"leftover"), "", 0o600)

	want := []string{"a.txt", "b", "c.txt", "d", "e.txt"}
	names, pages := listAll(t, ctx, td.client, "list", 2)
	if !slices.Equal(names, want) || pages != 3 {
		t.Fatalf("page size 2: %v in %d pages, want %v in 3", names, pages, want)
	}
	names, pages = listAll(t, ctx, td.client, "list", 0)
	if !slices.Equal(names, want) || pages != 1 {
		t.Fatalf("default page size: %v in %d pages", names, pages)
	}
	names, _ = listAll(t, ctx, td.client, "list", 1)
	if !slices.Equal(names, want) {
		t.Fatalf("page size 1: %v", names)
	}
	// Entry details.
	resp, err := td.client.ListDir(ctx, "list", agentclient.ListDirOptions{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	e0, e1 := resp.Entries[0], resp.Entries[1]
	if e0.Path != "list/a.txt" || e0.Type != agentclient.FileRegular || e0.Size != 5 ||
		e1.Path != "list/b" || e1.Type != agentclient.FileDirectory {
		t.Fatalf("entries %v %v", e0, e1)
	}
	// An entry added between pages neither repeats nor shifts the listing.
	mustWrite(t, filepath.Join(ws, "list", "aa.txt"), "", 0o644)
	resp2, err := td.client.ListDir(ctx, "list", agentclient.ListDirOptions{PageSize: 2, PageToken: resp.NextPageToken})
	if err != nil {
		t.Fatal(err)
	}
	if n := []string{resp2.Entries[0].Name, resp2.Entries[1].Name}; !slices.Equal(n, []string{"c.txt", "d"}) {
		t.Fatalf("second page after an insert: %v", n)
	}

	_, err = td.client.ListDir(ctx, "list", agentclient.ListDirOptions{PageToken: "!!not a token!!"})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "list", ws)
	_, err = td.client.ListDir(ctx, "list", agentclient.ListDirOptions{PageSize: -1})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "list", ws)
	_, err = td.client.ListDir(ctx, "list/a.txt", agentclient.ListDirOptions{})
	assertPathErr(t, err, errkind.ErrNotDirectory, "list/a.txt", ws)
	_, err = td.client.ListDir(ctx, "nothere", agentclient.ListDirOptions{})
	assertPathErr(t, err, errkind.ErrNotFound, "nothere", ws)
}

func TestListDirNonUTF8Name(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	raw := "bad\xff\xfename"
	for _, n := range []string{"a", raw, "bad\xffz", "z"} {
		mustWrite(t, filepath.Join(td.workspace, "odd", n), "x", 0o644)
	}
	resp, err := td.client.ListDir(ctx, "odd", agentclient.ListDirOptions{})
	if err != nil {
		t.Fatalf("listing a directory with a non-UTF-8 name failed: %v", err)
	}
	var found *agentclient.FileInfo
	for _, e := range resp.Entries {
		if bytes.Equal(e.RawName, []byte(raw)) {
			found = &e
		} else if e.RawName != nil && (e.Name == "a" || e.Name == "z") {
			t.Fatalf("raw_name set on a UTF-8 name: %v", e)
		}
	}
	if found == nil {
		t.Fatalf("no entry carries raw_name %q: %v", raw, resp.Entries)
	}
	if found.Name != "bad\uFFFDname" || found.Path != "odd/bad\uFFFDname" {
		t.Fatalf("lossy name %q", found.Name)
	}
	// Paging across non-UTF-8 names loses and repeats nothing.
	want := []string{"a", raw, "bad\xffz", "z"}
	sort.Strings(want)
	for _, size := range []int{1, 2, 3} {
		names, _ := listAll(t, ctx, td.client, "odd", size)
		if !slices.Equal(names, want) {
			t.Fatalf("page size %d: %q, want %q", size, names, want)
		}
	}
}

func TestMakeDirRemoveRename(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace

	made, err := td.client.MakeDir(ctx, "a/b/c", agentclient.MakeDirOptions{Parents: true, Mode: 0o750})
	if err != nil {
		t.Fatal(err)
	}
	if info := made; info.Type != agentclient.FileDirectory || info.Path != "a/b/c" || info.Mode != 0o750 {
		t.Fatalf("MakeDir info %v", info)
	}
	if fi, err := os.Stat(filepath.Join(ws, "a/b/c")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
		t.Fatalf("a/b/c on disk: %v %v", fi, err)
	}
	if _, err := td.client.MakeDir(ctx, "a/b/c", agentclient.MakeDirOptions{Parents: true}); err != nil {
		t.Fatalf("parents: an existing directory is not an error: %v", err)
	}
	_, err = td.client.MakeDir(ctx, "a/b/c", agentclient.MakeDirOptions{})
	assertPathErr(t, err, errkind.ErrAlreadyExists, "a/b/c", ws)
	_, err = td.client.MakeDir(ctx, "x/y", agentclient.MakeDirOptions{})
	assertPathErr(t, err, errkind.ErrNotFound, "x/y", ws)
	assertMissing(t, filepath.Join(ws, "x"))
	if made, err := td.client.MakeDir(ctx, "plain", agentclient.MakeDirOptions{}); err != nil || made.Mode != 0o755 {
		t.Fatalf("default directory mode: %v %v", made, err)
	}
	mustWrite(t, filepath.Join(ws, "a/b/c/f.txt"), "f", 0o644)

	err = td.client.Remove(ctx, "a", agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrNotEmpty, "a", ws)
	if diskContent(t, filepath.Join(ws, "a/b/c/f.txt")) != "f" {
		t.Fatal("a refused removal removed something")
	}
	if err := td.client.Remove(ctx, "a", agentclient.RemoveOptions{Recursive: true}); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, filepath.Join(ws, "a"))
	if err := td.client.Remove(ctx, "plain", agentclient.RemoveOptions{}); err != nil {
		t.Fatalf("empty directory: %v", err)
	}
	assertMissing(t, filepath.Join(ws, "plain"))
	err = td.client.Remove(ctx, "gone", agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrNotFound, "gone", ws)

	// The workspace root is never removed, however it is named.
	mustWrite(t, filepath.Join(ws, "survivor"), "s", 0o644)
	for _, p := range []string{".", "", "./", ws, "sub/.."} {
		err := td.client.Remove(ctx, p, agentclient.RemoveOptions{Recursive: true})
		if err == nil {
			t.Fatalf("Remove(%q) of the workspace root succeeded", p)
		}
		if !errors.Is(err, errkind.ErrPermissionDenied) && !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Fatalf("Remove(%q): want PermissionDenied or InvalidArgument, got %v", p, err)
		}
		if diskContent(t, filepath.Join(ws, "survivor")) != "s" {
			t.Fatalf("Remove(%q) removed content", p)
		}
	}
	err = td.client.Remove(ctx, ".", agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrPermissionDenied, ".")
	err = td.client.Remove(ctx, "", agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "")

	// Rename.
	mustWrite(t, filepath.Join(ws, "r1"), "one", 0o600)
	mustWrite(t, filepath.Join(ws, "existing"), "old", 0o644)
	if err := td.client.Rename(ctx, "r1", "r2", agentclient.RenameOptions{}); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, filepath.Join(ws, "r1"))
	if fi, _ := os.Stat(filepath.Join(ws, "r2")); diskContent(t, filepath.Join(ws, "r2")) != "one" || fi.Mode().Perm() != 0o600 {
		t.Fatal("rename did not move the file as is")
	}
	err = td.client.Rename(ctx, "r2", "existing", agentclient.RenameOptions{})
	assertPathErr(t, err, errkind.ErrAlreadyExists, "existing", ws) // the path in the way, as given
	if diskContent(t, filepath.Join(ws, "r2")) != "one" || diskContent(t, filepath.Join(ws, "existing")) != "old" {
		t.Fatal("a refused rename changed files")
	}
	if err := td.client.Rename(ctx, "r2", "existing", agentclient.RenameOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, filepath.Join(ws, "r2"))
	if diskContent(t, filepath.Join(ws, "existing")) != "one" {
		t.Fatal("overwrite rename did not replace")
	}
	err = td.client.Rename(ctx, "nope", "other", agentclient.RenameOptions{})
	assertPathErr(t, err, errkind.ErrNotFound, "nope", ws)
	err = td.client.Rename(ctx, ".", "moved-root", agentclient.RenameOptions{})
	assertPathErr(t, err, errkind.ErrPermissionDenied, ".", ws)
	if _, err := os.Stat(ws); err != nil {
		t.Fatal("the workspace root is gone")
	}
}

func TestErrorsCarryCallerPathOnly(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	host := filepath.Dir(td.workspace) // the test's temp dir, parent of the workspace
	mustWrite(t, filepath.Join(td.workspace, "f.txt"), "f", 0o644)
	check := func(err error, sentinel error, path string) {
		t.Helper()
		assertPathErr(t, err, sentinel, path, host)
	}
	_, _, err := readBytes(ctx, td.client, "missing/file.txt", agentclient.ReadFileOptions{})
	check(err, errkind.ErrNotFound, "missing/file.txt")
	_, _, err = readBytes(ctx, td.client, "./f.txt/x", agentclient.ReadFileOptions{})
	check(err, errkind.ErrNotDirectory, "./f.txt/x")
	_, err = td.client.Stat(ctx, "sub/../nope", agentclient.StatOptions{})
	check(err, errkind.ErrNotFound, "sub/../nope")
	_, err = writeBytes(ctx, td.client, "nodir/x", agentclient.WriteFileOptions{}, []byte("x"))
	check(err, errkind.ErrNotFound, "nodir/x")
	_, err = td.client.ListDir(ctx, "nothere", agentclient.ListDirOptions{})
	check(err, errkind.ErrNotFound, "nothere")
	err = td.client.Remove(ctx, "gone/x", agentclient.RemoveOptions{})
	check(err, errkind.ErrNotFound, "gone/x")
	_, err = td.client.MakeDir(ctx, "f.txt", agentclient.MakeDirOptions{})
	check(err, errkind.ErrAlreadyExists, "f.txt")
	err = td.client.Rename(ctx, "ghost", "g2", agentclient.RenameOptions{})
	check(err, errkind.ErrNotFound, "ghost")
	_, _, err = readBytes(ctx, td.client, "sub/..", agentclient.ReadFileOptions{})
	check(err, errkind.ErrIsDirectory, "sub/..")
	_, _, err = readBytes(ctx, td.client, "../escape", agentclient.ReadFileOptions{})
	check(err, errkind.ErrPathEscape, "../escape")
	// The error text the model would see names the path.
	_, _, err = readBytes(ctx, td.client, "missing/file.txt", agentclient.ReadFileOptions{})
	if !strings.Contains(err.Error(), "missing/file.txt") {
		t.Fatalf("error text does not name the path: %v", err)
	}
}

func TestEscapesAreRefused(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	outside := t.TempDir()
	mustWrite(t, filepath.Join(outside, "secret.txt"), "top secret", 0o644)
	mustWrite(t, filepath.Join(filepath.Dir(ws), "sibling.txt"), "sibling secret", 0o644)
	if err := os.Symlink("/etc", filepath.Join(ws, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../sibling.txt", filepath.Join(ws, "rel")); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(ws, "inside.txt"), "inside", 0o644)
	outsideBefore := snapshotTree(t, outside)
	wsBefore := snapshotTree(t, ws)
	etcPasswd := diskContent(t, "/etc/passwd")

	hosts := []string{outside, filepath.Dir(ws)}
	reads := []string{"../sibling.txt", "/etc/passwd", "etc/passwd", "out/secret.txt", "rel", "sub/../../sibling.txt", outside + "/secret.txt", "./etc/../etc/passwd"}
	for _, p := range reads {
		got, _, err := readBytes(ctx, td.client, p, agentclient.ReadFileOptions{})
		if strings.HasPrefix(p, outside) {
			assertPathErr(t, err, errkind.ErrPathEscape, p) // the caller named the host path itself
		} else {
			assertPathErr(t, err, errkind.ErrPathEscape, p, hosts...)
		}
		if len(got) > 0 {
			t.Fatalf("%q: %d bytes were read through an escape", p, len(got))
		}
	}
	_, err := td.client.ListDir(ctx, "etc", agentclient.ListDirOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "etc", hosts...)
	_, err = td.client.ListDir(ctx, "out", agentclient.ListDirOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "out", hosts...)
	_, err = td.client.Stat(ctx, "out/secret.txt", agentclient.StatOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/secret.txt", hosts...)

	writes := []string{"../x", "/etc/bulkhead-pwned", "etc/bulkhead-pwned", "out/pwned", "out/secret.txt", "rel", outside + "/abs-pwned", "a/../../x"}
	for _, p := range writes {
		for _, parents := range []bool{false, true} {
			_, err := writeBytes(ctx, td.client, p, agentclient.WriteFileOptions{CreateParents: parents}, []byte("pwned"))
			if strings.HasPrefix(p, outside) {
				assertPathErr(t, err, errkind.ErrPathEscape, p)
			} else {
				assertPathErr(t, err, errkind.ErrPathEscape, p, hosts...)
			}
		}
	}
	_, err = td.client.MakeDir(ctx, "out/newdir", agentclient.MakeDirOptions{Parents: true})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/newdir", hosts...)
	err = td.client.Remove(ctx, "out/secret.txt", agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/secret.txt", hosts...)
	err = td.client.Remove(ctx, "../sibling.txt", agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "../sibling.txt", hosts...)
	err = td.client.Rename(ctx, "inside.txt", "../moved.txt", agentclient.RenameOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "../moved.txt", hosts...)
	err = td.client.Rename(ctx, "inside.txt", "out/moved.txt", agentclient.RenameOptions{Overwrite: true})
	if !errors.Is(err, errkind.ErrPathEscape) {
		t.Fatalf("rename into a link to outside: %v", err)
	}
	err = td.client.Rename(ctx, "out/secret.txt", "stolen.txt", agentclient.RenameOptions{})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/secret.txt", hosts...)

	assertSameTree(t, "outside", outsideBefore, snapshotTree(t, outside))
	assertSameTree(t, "workspace", wsBefore, snapshotTree(t, ws))
	assertMissing(t, "/etc/bulkhead-pwned")
	assertMissing(t, filepath.Join(filepath.Dir(ws), "x"))
	assertMissing(t, filepath.Join(filepath.Dir(ws), "moved.txt"))
	if diskContent(t, filepath.Join(filepath.Dir(ws), "sibling.txt")) != "sibling secret" || diskContent(t, "/etc/passwd") != etcPasswd {
		t.Fatal("a file outside changed")
	}
	// The symlinks themselves are inside and may be described.
	if fi, err := td.client.Stat(ctx, "etc", agentclient.StatOptions{}); err != nil || fi.SymlinkTarget != "/etc" {
		t.Fatalf("Stat of the link itself: %v %v", fi, err)
	}
}

func TestReadOnlyGrant(t *testing.T) {
	grant := t.TempDir()
	rw := t.TempDir()
	mustWrite(t, filepath.Join(grant, "data.txt"), "reference data", 0o644)
	mustWrite(t, filepath.Join(grant, "sub/more.txt"), "more", 0o644)
	td := newTestDaemon(t, func(c *agentd.Config) {
		c.Grants = []workspace.Grant{{Path: grant, ReadOnly: true}, {Path: rw}}
	})
	ctx := ctxT(t)
	before := snapshotTree(t, grant)

	got, _, err := readBytes(ctx, td.client, grant+"/data.txt", agentclient.ReadFileOptions{})
	if err != nil || string(got) != "reference data" {
		t.Fatalf("read in a read-only grant: %q %v", got, err)
	}
	names, _ := listAll(t, ctx, td.client, grant, 0)
	if !slices.Equal(names, []string{"data.txt", "sub"}) {
		t.Fatalf("list of the grant: %v", names)
	}
	if fi, err := td.client.Stat(ctx, grant+"/sub/more.txt", agentclient.StatOptions{}); err != nil || fi.Size != 4 {
		t.Fatalf("stat in the grant: %v %v", fi, err)
	}
	info, err := td.client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sawRO bool
	for _, g := range info.Grants {
		if g.Path == grant && g.ReadOnly {
			sawRO = true
		}
	}
	if !sawRO {
		t.Fatalf("Info does not report the read-only grant: %v", info.Grants)
	}

	p := grant + "/new.txt"
	_, err = writeBytes(ctx, td.client, p, agentclient.WriteFileOptions{}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, p)
	p = grant + "/data.txt"
	_, err = writeBytes(ctx, td.client, p, agentclient.WriteFileOptions{}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, p)
	_, err = writeBytes(ctx, td.client, grant+"/deep/new.txt", agentclient.WriteFileOptions{CreateParents: true}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, grant+"/deep/new.txt")
	err = td.client.Remove(ctx, p, agentclient.RemoveOptions{})
	assertPathErr(t, err, errkind.ErrReadOnly, p)
	err = td.client.Remove(ctx, grant+"/sub", agentclient.RemoveOptions{Recursive: true})
	assertPathErr(t, err, errkind.ErrReadOnly, grant+"/sub")
	_, err = td.client.MakeDir(ctx, grant+"/newdir", agentclient.MakeDirOptions{})
	assertPathErr(t, err, errkind.ErrReadOnly, grant+"/newdir")
	err = td.client.Rename(ctx, p, grant+"/renamed.txt", agentclient.RenameOptions{})
	if !errors.Is(err, errkind.ErrReadOnly) {
		t.Fatalf("rename in a read-only grant: %v", err)
	}
	// A symlink in the workspace does not turn a read-only grant writable.
	if err := os.Symlink(grant, filepath.Join(td.workspace, "ro")); err != nil {
		t.Fatal(err)
	}
	_, err = writeBytes(ctx, td.client, "ro/data.txt", agentclient.WriteFileOptions{}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, "ro/data.txt")
	assertSameTree(t, "read-only grant", before, snapshotTree(t, grant))

	// A writable grant takes writes.
	if _, err := writeBytes(ctx, td.client, rw+"/out.txt", agentclient.WriteFileOptions{}, []byte("ok")); err != nil {
		t.Fatalf("write in a writable grant: %v", err)
	}
	if diskContent(t, filepath.Join(rw, "out.txt")) != "ok" {
		t.Fatal("write in the writable grant did not land")
	}
}

func TestRunAsUser(t *testing.T) {
	skipUnlessRoot(t)
	etc := fakeEtc(t)
	td := newTestDaemon(t, func(c *agentd.Config) { c.EtcRoot = etc })
	ctx := ctxT(t)
	ws := td.workspace
	if err := os.Chmod(ws, 0o777); err != nil {
		t.Fatal(err)
	}

	resp, err := writeBytes(ctx, td.client, "mine.txt", agentclient.WriteFileOptions{User: "analyst"}, []byte("analyst's"))
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := diskOwner(t, filepath.Join(ws, "mine.txt")); uid != 65534 || gid != 65534 {
		t.Fatalf("file written as analyst is owned by %d:%d", uid, gid)
	}
	if resp.Info.UID != 65534 || resp.Info.Owner != "analyst" {
		t.Fatalf("reported owner %d %q", resp.Info.UID, resp.Info.Owner)
	}
	if _, err := td.client.MakeDir(ctx, "adir/sub", agentclient.MakeDirOptions{Parents: true, User: "analyst"}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"adir", "adir/sub"} {
		if uid, _ := diskOwner(t, filepath.Join(ws, d)); uid != 65534 {
			t.Fatalf("%s made as analyst is owned by %d", d, uid)
		}
	}
	if _, err := writeBytes(ctx, td.client, "adir/sub/deep/f", agentclient.WriteFileOptions{User: "analyst", CreateParents: true}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if uid, _ := diskOwner(t, filepath.Join(ws, "adir/sub/deep")); uid != 65534 {
		t.Fatalf("parent created as analyst is owned by %d", uid)
	}
	// Stat names owners through the sandbox's own /etc/passwd.
	if fi, err := td.client.Stat(ctx, "mine.txt", agentclient.StatOptions{}); err != nil || fi.Owner != "analyst" || fi.Group != "analyst" {
		t.Fatalf("stat owner: %v %v", fi, err)
	}

	// A read-only root file: analyst may read it but not replace it, even
	// though the directory is writable; root may.
	ro := filepath.Join(ws, "ro.txt")
	mustWrite(t, ro, "root's", 0o444)
	if got, _, err := readBytes(ctx, td.client, "ro.txt", agentclient.ReadFileOptions{User: "analyst"}); err != nil || string(got) != "root's" {
		t.Fatalf("analyst reading a 0444 file: %q %v", got, err)
	}
	_, err = writeBytes(ctx, td.client, "ro.txt", agentclient.WriteFileOptions{User: "analyst"}, []byte("analyst was here"))
	assertPathErr(t, err, errkind.ErrPermissionDenied, "ro.txt", ws)
	if diskContent(t, ro) != "root's" {
		t.Fatal("analyst replaced a read-only root file")
	}
	assertNoTemp(t, ws)
	if _, err := writeBytes(ctx, td.client, "ro.txt", agentclient.WriteFileOptions{}, []byte("root again")); err != nil {
		t.Fatalf("root overwriting its own 0444 file: %v", err)
	}
	if diskContent(t, ro) != "root again" {
		t.Fatal("root's write did not land")
	}
	if uid, _ := diskOwner(t, ro); uid != 0 {
		t.Fatalf("root's file now owned by %d", uid)
	}
	// A private root file is closed to analyst.
	mustWrite(t, filepath.Join(ws, "private.txt"), "private", 0o600)
	got, _, err := readBytes(ctx, td.client, "private.txt", agentclient.ReadFileOptions{User: "analyst"})
	assertPathErr(t, err, errkind.ErrPermissionDenied, "private.txt", ws)
	if len(got) != 0 {
		t.Fatal("bytes of a private file reached analyst")
	}
	err = td.client.Remove(ctx, "adir", agentclient.RemoveOptions{Recursive: true, User: "analyst"})
	if err != nil {
		t.Fatalf("analyst removing its own tree: %v", err)
	}

	// An unknown user is NotFound, names run_as, and nothing happens.
	_, err = writeBytes(ctx, td.client, "ghost.txt", agentclient.WriteFileOptions{User: "mallory"}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotFound, "ghost.txt", ws)
	if !strings.Contains(err.Error(), "run_as") {
		t.Fatalf("unknown user error does not name run_as: %v", err)
	}
	assertMissing(t, filepath.Join(ws, "ghost.txt"))
	for name, call := range map[string]func() error{
		"read": func() error {
			_, _, err := readBytes(ctx, td.client, "mine.txt", agentclient.ReadFileOptions{User: "mallory"})
			return err
		},
		"stat": func() error {
			_, err := td.client.Stat(ctx, "mine.txt", agentclient.StatOptions{User: "mallory"})
			return err
		},
		"list": func() error {
			_, err := td.client.ListDir(ctx, ".", agentclient.ListDirOptions{User: "mallory"})
			return err
		},
		"mkdir": func() error {
			_, err := td.client.MakeDir(ctx, "gd", agentclient.MakeDirOptions{User: "mallory"})
			return err
		},
		"remove": func() error {
			err := td.client.Remove(ctx, "mine.txt", agentclient.RemoveOptions{User: "mallory"})
			return err
		},
		"rename": func() error {
			err := td.client.Rename(ctx, "mine.txt", "x", agentclient.RenameOptions{User: "mallory"})
			return err
		},
	} {
		err := call()
		if !errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "run_as") {
			t.Fatalf("%s as an unknown user: %v", name, err)
		}
	}
	if diskContent(t, filepath.Join(ws, "mine.txt")) != "analyst's" {
		t.Fatal("a call as an unknown user changed a file")
	}
	assertMissing(t, filepath.Join(ws, "gd"))
}
