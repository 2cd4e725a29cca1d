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

func writeBytes(ctx context.Context, c *agentclient.Client, h *agentdv1.WriteFileHeader, data []byte) (*agentdv1.WriteFileResponse, error) {
	return c.WriteFile(ctx, h, bytes.NewReader(data))
}

func readBytes(ctx context.Context, c *agentclient.Client, req *agentdv1.ReadFileRequest) ([]byte, *agentdv1.FileInfo, error) {
	var buf bytes.Buffer
	info, err := c.ReadFile(ctx, req, &buf)
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

	resp, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{
		Path: "deep/dir/blob.bin", CreateParents: true, ExpectedSize: &size, ExpectedSha256: sum[:],
	}, data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.GetSha256(), sum[:]) || resp.GetInfo().GetSize() != size || resp.GetInfo().GetPath() != "deep/dir/blob.bin" {
		t.Fatalf("write response: size %d path %q sha %x", resp.GetInfo().GetSize(), resp.GetInfo().GetPath(), resp.GetSha256())
	}
	if got := sha256.Sum256([]byte(diskContent(t, filepath.Join(td.workspace, "deep/dir/blob.bin")))); got != sum {
		t.Fatal("the file on disk differs from what was sent")
	}
	if resp.GetInfo().GetMode() != 0o644 || resp.GetInfo().GetType() != agentdv1.FileType_FILE_TYPE_REGULAR {
		t.Fatalf("new file info %v", resp.GetInfo())
	}

	got, info, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "deep/dir/blob.bin"})
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sum || info.GetSize() != size {
		t.Fatalf("read back %d bytes (info size %d), sha mismatch or wrong size", len(got), info.GetSize())
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
		if (msgs == 0) != (msg.GetInfo() != nil) {
			t.Fatalf("message %d: info present = %v; only the first carries it", msgs, msg.GetInfo() != nil)
		}
		if len(msg.GetData()) > readChunkBytes {
			t.Fatalf("message %d carries %d bytes, more than a chunk", msgs, len(msg.GetData()))
		}
		h.Write(msg.GetData())
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
		got, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "deep/dir/blob.bin", Offset: c.offset, Limit: c.limit})
		if err != nil {
			t.Fatalf("offset %d limit %d: %v", c.offset, c.limit, err)
		}
		if !bytes.Equal(got, c.want) {
			t.Fatalf("offset %d limit %d: got %d bytes, want %d", c.offset, c.limit, len(got), len(c.want))
		}
	}
	_, _, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "deep/dir/blob.bin", Offset: -1})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "deep/dir/blob.bin")
	_, _, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "deep/dir/blob.bin", Limit: -5})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "deep/dir/blob.bin")

	// An empty file still answers with its info.
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "empty"}, nil); err != nil {
		t.Fatal(err)
	}
	got, info, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "empty"})
	if err != nil || len(got) != 0 || info == nil || info.GetName() != "empty" {
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
		name   string
		header *agentdv1.WriteFileHeader
		want   []byte
	}{
		{"default", &agentdv1.WriteFileHeader{Path: "a.bin"}, nil},
		{"compute_sha256", &agentdv1.WriteFileHeader{Path: "b.bin", ComputeSha256: true}, sum[:]},
		{"expected_sha256", &agentdv1.WriteFileHeader{Path: "c.bin", ExpectedSha256: sum[:]}, sum[:]},
	} {
		resp, err := writeBytes(ctx, td.client, c.header, data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(resp.GetSha256(), c.want) {
			t.Errorf("%s: sha256 %x, want %x", c.name, resp.GetSha256(), c.want)
		}
		if got := sha256.Sum256([]byte(diskContent(t, filepath.Join(td.workspace, c.header.GetPath())))); got != sum {
			t.Errorf("%s: the file on disk differs from what was sent", c.name)
		}
	}
	short := int64(len(data) - 1)
	_, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "d.bin", ExpectedSize: &short}, data)
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
		h    *agentdv1.WriteFileHeader
		data []byte
	}{
		{"fewer bytes than announced", &agentdv1.WriteFileHeader{ExpectedSize: i64(10)}, []byte("short")},
		{"more bytes than announced", &agentdv1.WriteFileHeader{ExpectedSize: i64(3)}, []byte("too long")},
		{"announced empty", &agentdv1.WriteFileHeader{ExpectedSize: i64(0)}, []byte("x")},
		{"wrong sha256", &agentdv1.WriteFileHeader{ExpectedSha256: wrongSum[:]}, []byte("new")},
		{"large, wrong sha256", &agentdv1.WriteFileHeader{ExpectedSha256: wrongSum[:]}, big},
		{"large, size one short", &agentdv1.WriteFileHeader{ExpectedSize: i64(int64(len(big)) + 1), ExpectedSha256: bigSum[:]}, big},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.h.Path = "keep.txt"
			_, err := writeBytes(ctx, td.client, c.h, c.data)
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
	_, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "new.bin", ExpectedSha256: wrongSum[:]}, big)
	assertPathErr(t, err, errkind.ErrConflict, "new.bin")
	assertMissing(t, filepath.Join(td.workspace, "new.bin"))
	assertNoTemp(t, td.workspace)
	// A malformed checksum is a bad request, not a conflict.
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "keep.txt", ExpectedSha256: []byte{1, 2, 3}}, []byte("x"))
	assertPathErr(t, err, errkind.ErrInvalidArgument, "keep.txt")
	// The right announcement succeeds.
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "keep.txt", ExpectedSize: i64(int64(len(big))), ExpectedSha256: bigSum[:]}, big); err != nil {
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

	_, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "exists.txt", Overwrite: agentdv1.OverwritePolicy_OVERWRITE_POLICY_NEVER}, []byte("clobbered"))
	assertPathErr(t, err, errkind.ErrAlreadyExists, "exists.txt", ws)
	if diskContent(t, filepath.Join(ws, "exists.txt")) != "original" {
		t.Fatal("NEVER replaced an existing file")
	}
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "fresh.txt", Overwrite: agentdv1.OverwritePolicy_OVERWRITE_POLICY_NEVER}, []byte("fresh")); err != nil {
		t.Fatalf("NEVER on a new file: %v", err)
	}

	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "missing.txt", Overwrite: agentdv1.OverwritePolicy_OVERWRITE_POLICY_ONLY_IF_EXISTS}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotFound, "missing.txt", ws)
	assertMissing(t, filepath.Join(ws, "missing.txt"))
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "exists.txt", Overwrite: agentdv1.OverwritePolicy_OVERWRITE_POLICY_ONLY_IF_EXISTS}, []byte("replaced")); err != nil {
		t.Fatalf("ONLY_IF_EXISTS on an existing file: %v", err)
	}
	if diskContent(t, filepath.Join(ws, "exists.txt")) != "replaced" {
		t.Fatal("ONLY_IF_EXISTS did not replace")
	}

	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "no/such/parent.txt"}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotFound, "no/such/parent.txt", ws)
	assertMissing(t, filepath.Join(ws, "no"))
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "no/such/parent.txt", CreateParents: true}, []byte("x")); err != nil {
		t.Fatalf("create_parents: %v", err)
	}

	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "adir"}, []byte("x"))
	assertPathErr(t, err, errkind.ErrIsDirectory, "adir", ws)
	if fi, err := os.Stat(filepath.Join(ws, "adir")); err != nil || !fi.IsDir() {
		t.Fatal("the directory was replaced")
	}
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "exists.txt/child"}, []byte("x"))
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
		resp, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: name, Mode: mode}, []byte("x"))
		if err != nil {
			t.Fatalf("mode %#o: %v", mode, err)
		}
		fi, err := os.Stat(filepath.Join(ws, name))
		if err != nil {
			t.Fatal(err)
		}
		if uint32(fi.Mode().Perm()) != mode || resp.GetInfo().GetMode() != mode {
			t.Fatalf("mode %#o: disk %v, reported %#o", mode, fi.Mode(), resp.GetInfo().GetMode())
		}
	}
	// Without a mode, a replaced file keeps its bits.
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "script", Mode: 0o755}, []byte("#!/bin/sh\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "script"}, []byte("#!/bin/sh\necho\n")); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(ws, "script")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("overwrite without mode changed it to %v", fi.Mode())
	}
	// Set-id, sticky and out-of-range bits are refused, and nothing is created.
	for _, mode := range []uint32{0o4755, 0o2755, 0o1755, 0o10644} {
		_, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "setid", Mode: mode}, []byte("x"))
		assertPathErr(t, err, errkind.ErrInvalidArgument, "setid", ws)
		assertMissing(t, filepath.Join(ws, "setid"))
	}
	// Nor may an existing file be turned set-id.
	_, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "script", Mode: 0o4755}, []byte("evil"))
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

	st, err := td.client.Stat(ctx, &agentdv1.StatRequest{Path: "dir/file.txt"})
	if err != nil {
		t.Fatal(err)
	}
	fi := st.GetInfo()
	if fi.GetType() != agentdv1.FileType_FILE_TYPE_REGULAR || fi.GetSize() != 12 || fi.GetMode() != 0o640 ||
		fi.GetName() != "file.txt" || fi.GetPath() != "dir/file.txt" || fi.GetOwner() != "root" || fi.GetUid() != 0 ||
		fi.GetModifiedAt() == nil || fi.GetRawName() != nil {
		t.Fatalf("file: %v", fi)
	}
	st, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	fi = st.GetInfo()
	if fi.GetType() != agentdv1.FileType_FILE_TYPE_DIRECTORY || fi.GetName() != "dir" || fi.GetOwner() != "root" {
		t.Fatalf("dir: %v", fi)
	}
	st, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "dir/link"})
	if err != nil {
		t.Fatal(err)
	}
	fi = st.GetInfo()
	if fi.GetType() != agentdv1.FileType_FILE_TYPE_SYMLINK || fi.GetSymlinkTarget() != "file.txt" || fi.GetName() != "link" {
		t.Fatalf("symlink (described, not followed): %v", fi)
	}
	// Absolute paths inside the workspace work and are echoed as given.
	abs := filepath.Join(ws, "dir/file.txt")
	if st, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: abs}); err != nil || st.GetInfo().GetPath() != abs || st.GetInfo().GetSize() != 12 {
		t.Fatalf("absolute: %v %v", st, err)
	}
	// The workspace root itself.
	if st, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "."}); err != nil || st.GetInfo().GetType() != agentdv1.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("root: %v %v", st, err)
	}
	_, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "dir/nope"})
	assertPathErr(t, err, errkind.ErrNotFound, "dir/nope", ws)
	_, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "dir/file.txt/below"})
	assertPathErr(t, err, errkind.ErrNotDirectory, "dir/file.txt/below", ws)
	_, err = td.client.Stat(ctx, &agentdv1.StatRequest{})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "", ws)
}

func listAll(t *testing.T, ctx context.Context, c *agentclient.Client, dir string, pageSize int32) (names []string, pages int) {
	t.Helper()
	token := ""
	for {
		resp, err := c.ListDir(ctx, &agentdv1.ListDirRequest{Path: dir, PageSize: pageSize, PageToken: token})
		if err != nil {
			t.Fatalf("ListDir %q page %d: %v", dir, pages, err)
		}
		pages++
		if pageSize > 0 && len(resp.GetEntries()) > int(pageSize) {
			t.Fatalf("page %d holds %d entries, more than %d", pages, len(resp.GetEntries()), pageSize)
		}
		for _, e := range resp.GetEntries() {
			name := e.GetName()
			if e.GetRawName() != nil {
				name = string(e.GetRawName())
			}
			names = append(names, name)
		}
		token = resp.GetNextPageToken()
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
	resp, err := td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "list", PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	e0, e1 := resp.GetEntries()[0], resp.GetEntries()[1]
	if e0.GetPath() != "list/a.txt" || e0.GetType() != agentdv1.FileType_FILE_TYPE_REGULAR || e0.GetSize() != 5 ||
		e1.GetPath() != "list/b" || e1.GetType() != agentdv1.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("entries %v %v", e0, e1)
	}
	// An entry added between pages neither repeats nor shifts the listing.
	mustWrite(t, filepath.Join(ws, "list", "aa.txt"), "", 0o644)
	resp2, err := td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "list", PageSize: 2, PageToken: resp.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if n := []string{resp2.GetEntries()[0].GetName(), resp2.GetEntries()[1].GetName()}; !slices.Equal(n, []string{"c.txt", "d"}) {
		t.Fatalf("second page after an insert: %v", n)
	}

	_, err = td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "list", PageToken: "!!not a token!!"})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "list", ws)
	_, err = td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "list", PageSize: -1})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "list", ws)
	_, err = td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "list/a.txt"})
	assertPathErr(t, err, errkind.ErrNotDirectory, "list/a.txt", ws)
	_, err = td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "nothere"})
	assertPathErr(t, err, errkind.ErrNotFound, "nothere", ws)
}

func TestListDirNonUTF8Name(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	raw := "bad\xff\xfename"
	for _, n := range []string{"a", raw, "bad\xffz", "z"} {
		mustWrite(t, filepath.Join(td.workspace, "odd", n), "x", 0o644)
	}
	resp, err := td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "odd"})
	if err != nil {
		t.Fatalf("listing a directory with a non-UTF-8 name failed: %v", err)
	}
	var found *agentdv1.FileInfo
	for _, e := range resp.GetEntries() {
		if bytes.Equal(e.GetRawName(), []byte(raw)) {
			found = e
		} else if e.GetRawName() != nil && (e.GetName() == "a" || e.GetName() == "z") {
			t.Fatalf("raw_name set on a UTF-8 name: %v", e)
		}
	}
	if found == nil {
		t.Fatalf("no entry carries raw_name %q: %v", raw, resp.GetEntries())
	}
	if found.GetName() != "bad\uFFFDname" || found.GetPath() != "odd/bad\uFFFDname" {
		t.Fatalf("lossy name %q", found.GetName())
	}
	// Paging across non-UTF-8 names loses and repeats nothing.
	want := []string{"a", raw, "bad\xffz", "z"}
	sort.Strings(want)
	for _, size := range []int32{1, 2, 3} {
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

	made, err := td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "a/b/c", Parents: true, Mode: 0o750})
	if err != nil {
		t.Fatal(err)
	}
	if info := made.GetInfo(); info.GetType() != agentdv1.FileType_FILE_TYPE_DIRECTORY || info.GetPath() != "a/b/c" || info.GetMode() != 0o750 {
		t.Fatalf("MakeDir info %v", info)
	}
	if fi, err := os.Stat(filepath.Join(ws, "a/b/c")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
		t.Fatalf("a/b/c on disk: %v %v", fi, err)
	}
	if _, err := td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "a/b/c", Parents: true}); err != nil {
		t.Fatalf("parents: an existing directory is not an error: %v", err)
	}
	_, err = td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "a/b/c"})
	assertPathErr(t, err, errkind.ErrAlreadyExists, "a/b/c", ws)
	_, err = td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "x/y"})
	assertPathErr(t, err, errkind.ErrNotFound, "x/y", ws)
	assertMissing(t, filepath.Join(ws, "x"))
	if made, err := td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "plain"}); err != nil || made.GetInfo().GetMode() != 0o755 {
		t.Fatalf("default directory mode: %v %v", made, err)
	}
	mustWrite(t, filepath.Join(ws, "a/b/c/f.txt"), "f", 0o644)

	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "a"})
	assertPathErr(t, err, errkind.ErrNotEmpty, "a", ws)
	if diskContent(t, filepath.Join(ws, "a/b/c/f.txt")) != "f" {
		t.Fatal("a refused removal removed something")
	}
	if _, err := td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "a", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, filepath.Join(ws, "a"))
	if _, err := td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "plain"}); err != nil {
		t.Fatalf("empty directory: %v", err)
	}
	assertMissing(t, filepath.Join(ws, "plain"))
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "gone"})
	assertPathErr(t, err, errkind.ErrNotFound, "gone", ws)

	// The workspace root is never removed, however it is named.
	mustWrite(t, filepath.Join(ws, "survivor"), "s", 0o644)
	for _, p := range []string{".", "", "./", ws, "sub/.."} {
		_, err := td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: p, Recursive: true})
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
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "."})
	assertPathErr(t, err, errkind.ErrPermissionDenied, ".")
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: ""})
	assertPathErr(t, err, errkind.ErrInvalidArgument, "")

	// Rename.
	mustWrite(t, filepath.Join(ws, "r1"), "one", 0o600)
	mustWrite(t, filepath.Join(ws, "existing"), "old", 0o644)
	if _, err := td.client.Rename(ctx, &agentdv1.RenameRequest{From: "r1", To: "r2"}); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, filepath.Join(ws, "r1"))
	if fi, _ := os.Stat(filepath.Join(ws, "r2")); diskContent(t, filepath.Join(ws, "r2")) != "one" || fi.Mode().Perm() != 0o600 {
		t.Fatal("rename did not move the file as is")
	}
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: "r2", To: "existing"})
	assertPathErr(t, err, errkind.ErrAlreadyExists, "existing", ws) // the path in the way, as given
	if diskContent(t, filepath.Join(ws, "r2")) != "one" || diskContent(t, filepath.Join(ws, "existing")) != "old" {
		t.Fatal("a refused rename changed files")
	}
	if _, err := td.client.Rename(ctx, &agentdv1.RenameRequest{From: "r2", To: "existing", Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, filepath.Join(ws, "r2"))
	if diskContent(t, filepath.Join(ws, "existing")) != "one" {
		t.Fatal("overwrite rename did not replace")
	}
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: "nope", To: "other"})
	assertPathErr(t, err, errkind.ErrNotFound, "nope", ws)
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: ".", To: "moved-root"})
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
	_, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "missing/file.txt"})
	check(err, errkind.ErrNotFound, "missing/file.txt")
	_, _, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "./f.txt/x"})
	check(err, errkind.ErrNotDirectory, "./f.txt/x")
	_, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "sub/../nope"})
	check(err, errkind.ErrNotFound, "sub/../nope")
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "nodir/x"}, []byte("x"))
	check(err, errkind.ErrNotFound, "nodir/x")
	_, err = td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "nothere"})
	check(err, errkind.ErrNotFound, "nothere")
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "gone/x"})
	check(err, errkind.ErrNotFound, "gone/x")
	_, err = td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "f.txt"})
	check(err, errkind.ErrAlreadyExists, "f.txt")
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: "ghost", To: "g2"})
	check(err, errkind.ErrNotFound, "ghost")
	_, _, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "sub/.."})
	check(err, errkind.ErrIsDirectory, "sub/..")
	_, _, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "../escape"})
	check(err, errkind.ErrPathEscape, "../escape")
	// The error text the model would see names the path.
	_, _, err = readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "missing/file.txt"})
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
		got, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: p})
		if strings.HasPrefix(p, outside) {
			assertPathErr(t, err, errkind.ErrPathEscape, p) // the caller named the host path itself
		} else {
			assertPathErr(t, err, errkind.ErrPathEscape, p, hosts...)
		}
		if len(got) > 0 {
			t.Fatalf("%q: %d bytes were read through an escape", p, len(got))
		}
	}
	_, err := td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "etc"})
	assertPathErr(t, err, errkind.ErrPathEscape, "etc", hosts...)
	_, err = td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: "out"})
	assertPathErr(t, err, errkind.ErrPathEscape, "out", hosts...)
	_, err = td.client.Stat(ctx, &agentdv1.StatRequest{Path: "out/secret.txt"})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/secret.txt", hosts...)

	writes := []string{"../x", "/etc/bulkhead-pwned", "etc/bulkhead-pwned", "out/pwned", "out/secret.txt", "rel", outside + "/abs-pwned", "a/../../x"}
	for _, p := range writes {
		for _, parents := range []bool{false, true} {
			_, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: p, CreateParents: parents}, []byte("pwned"))
			if strings.HasPrefix(p, outside) {
				assertPathErr(t, err, errkind.ErrPathEscape, p)
			} else {
				assertPathErr(t, err, errkind.ErrPathEscape, p, hosts...)
			}
		}
	}
	_, err = td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "out/newdir", Parents: true})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/newdir", hosts...)
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "out/secret.txt"})
	assertPathErr(t, err, errkind.ErrPathEscape, "out/secret.txt", hosts...)
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "../sibling.txt"})
	assertPathErr(t, err, errkind.ErrPathEscape, "../sibling.txt", hosts...)
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: "inside.txt", To: "../moved.txt"})
	assertPathErr(t, err, errkind.ErrPathEscape, "../moved.txt", hosts...)
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: "inside.txt", To: "out/moved.txt", Overwrite: true})
	if !errors.Is(err, errkind.ErrPathEscape) {
		t.Fatalf("rename into a link to outside: %v", err)
	}
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: "out/secret.txt", To: "stolen.txt"})
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
	if fi, err := td.client.Stat(ctx, &agentdv1.StatRequest{Path: "etc"}); err != nil || fi.GetInfo().GetSymlinkTarget() != "/etc" {
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

	got, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: grant + "/data.txt"})
	if err != nil || string(got) != "reference data" {
		t.Fatalf("read in a read-only grant: %q %v", got, err)
	}
	names, _ := listAll(t, ctx, td.client, grant, 0)
	if !slices.Equal(names, []string{"data.txt", "sub"}) {
		t.Fatalf("list of the grant: %v", names)
	}
	if fi, err := td.client.Stat(ctx, &agentdv1.StatRequest{Path: grant + "/sub/more.txt"}); err != nil || fi.GetInfo().GetSize() != 4 {
		t.Fatalf("stat in the grant: %v %v", fi, err)
	}
	info, err := td.client.Info(ctx, &agentdv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var sawRO bool
	for _, g := range info.GetGrants() {
		if g.GetPath() == grant && g.GetReadOnly() {
			sawRO = true
		}
	}
	if !sawRO {
		t.Fatalf("Info does not report the read-only grant: %v", info.GetGrants())
	}

	p := grant + "/new.txt"
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: p}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, p)
	p = grant + "/data.txt"
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: p}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, p)
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: grant + "/deep/new.txt", CreateParents: true}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, grant+"/deep/new.txt")
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: p})
	assertPathErr(t, err, errkind.ErrReadOnly, p)
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: grant + "/sub", Recursive: true})
	assertPathErr(t, err, errkind.ErrReadOnly, grant+"/sub")
	_, err = td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: grant + "/newdir"})
	assertPathErr(t, err, errkind.ErrReadOnly, grant+"/newdir")
	_, err = td.client.Rename(ctx, &agentdv1.RenameRequest{From: p, To: grant + "/renamed.txt"})
	if !errors.Is(err, errkind.ErrReadOnly) {
		t.Fatalf("rename in a read-only grant: %v", err)
	}
	// A symlink in the workspace does not turn a read-only grant writable.
	if err := os.Symlink(grant, filepath.Join(td.workspace, "ro")); err != nil {
		t.Fatal(err)
	}
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "ro/data.txt"}, []byte("x"))
	assertPathErr(t, err, errkind.ErrReadOnly, "ro/data.txt")
	assertSameTree(t, "read-only grant", before, snapshotTree(t, grant))

	// A writable grant takes writes.
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: rw + "/out.txt"}, []byte("ok")); err != nil {
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

	resp, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "mine.txt", User: "analyst"}, []byte("analyst's"))
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := diskOwner(t, filepath.Join(ws, "mine.txt")); uid != 65534 || gid != 65534 {
		t.Fatalf("file written as analyst is owned by %d:%d", uid, gid)
	}
	if resp.GetInfo().GetUid() != 65534 || resp.GetInfo().GetOwner() != "analyst" {
		t.Fatalf("reported owner %d %q", resp.GetInfo().GetUid(), resp.GetInfo().GetOwner())
	}
	if _, err := td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "adir/sub", Parents: true, User: "analyst"}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"adir", "adir/sub"} {
		if uid, _ := diskOwner(t, filepath.Join(ws, d)); uid != 65534 {
			t.Fatalf("%s made as analyst is owned by %d", d, uid)
		}
	}
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "adir/sub/deep/f", User: "analyst", CreateParents: true}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if uid, _ := diskOwner(t, filepath.Join(ws, "adir/sub/deep")); uid != 65534 {
		t.Fatalf("parent created as analyst is owned by %d", uid)
	}
	// Stat names owners through the sandbox's own /etc/passwd.
	if fi, err := td.client.Stat(ctx, &agentdv1.StatRequest{Path: "mine.txt"}); err != nil || fi.GetInfo().GetOwner() != "analyst" || fi.GetInfo().GetGroup() != "analyst" {
		t.Fatalf("stat owner: %v %v", fi, err)
	}

	// A read-only root file: analyst may read it but not replace it, even
	// though the directory is writable; root may.
	ro := filepath.Join(ws, "ro.txt")
	mustWrite(t, ro, "root's", 0o444)
	if got, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "ro.txt", User: "analyst"}); err != nil || string(got) != "root's" {
		t.Fatalf("analyst reading a 0444 file: %q %v", got, err)
	}
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "ro.txt", User: "analyst"}, []byte("analyst was here"))
	assertPathErr(t, err, errkind.ErrPermissionDenied, "ro.txt", ws)
	if diskContent(t, ro) != "root's" {
		t.Fatal("analyst replaced a read-only root file")
	}
	assertNoTemp(t, ws)
	if _, err := writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "ro.txt"}, []byte("root again")); err != nil {
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
	got, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "private.txt", User: "analyst"})
	assertPathErr(t, err, errkind.ErrPermissionDenied, "private.txt", ws)
	if len(got) != 0 {
		t.Fatal("bytes of a private file reached analyst")
	}
	_, err = td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "adir", Recursive: true, User: "analyst"})
	if err != nil {
		t.Fatalf("analyst removing its own tree: %v", err)
	}

	// An unknown user is NotFound, names run_as, and nothing happens.
	_, err = writeBytes(ctx, td.client, &agentdv1.WriteFileHeader{Path: "ghost.txt", User: "mallory"}, []byte("x"))
	assertPathErr(t, err, errkind.ErrNotFound, "ghost.txt", ws)
	if !strings.Contains(err.Error(), "run_as") {
		t.Fatalf("unknown user error does not name run_as: %v", err)
	}
	assertMissing(t, filepath.Join(ws, "ghost.txt"))
	for name, call := range map[string]func() error{
		"read": func() error {
			_, _, err := readBytes(ctx, td.client, &agentdv1.ReadFileRequest{Path: "mine.txt", User: "mallory"})
			return err
		},
		"stat": func() error {
			_, err := td.client.Stat(ctx, &agentdv1.StatRequest{Path: "mine.txt", User: "mallory"})
			return err
		},
		"list": func() error {
			_, err := td.client.ListDir(ctx, &agentdv1.ListDirRequest{Path: ".", User: "mallory"})
			return err
		},
		"mkdir": func() error {
			_, err := td.client.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: "gd", User: "mallory"})
			return err
		},
		"remove": func() error {
			_, err := td.client.Remove(ctx, &agentdv1.RemoveRequest{Path: "mine.txt", User: "mallory"})
			return err
		},
		"rename": func() error {
			_, err := td.client.Rename(ctx, &agentdv1.RenameRequest{From: "mine.txt", To: "x", User: "mallory"})
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
