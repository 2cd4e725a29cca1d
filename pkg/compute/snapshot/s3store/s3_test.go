package s3store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot/s3store"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newS3 opens a store on srv's bucket with quick retries. Each call stands
// for another harness: nothing is shared but the bucket.
func newS3(t *testing.T, srv *s3server.Server, bucket string, mutate func(*s3store.Config)) *s3store.Store {
	t.Helper()
	cfg := s3store.Config{Bucket: bucket, Prefix: "team/snaps", Endpoint: srv.Endpoint, Region: srv.Region, UsePathStyle: true,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, MaxAttempts: 3,
		RetryBaseDelay: 10 * time.Millisecond, RetryMaxDelay: 50 * time.Millisecond, Log: zaptest.NewLogger(t)}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := s3store.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// fillWorkspace writes n files of size bytes each (half random, half
// text, so both compress differently) under dir.
func fillWorkspace(t *testing.T, dir string, n, size int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%10), fmt.Sprintf("f%03d.bin", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, size)
		for j := 0; j+8 <= size/2; j += 8 {
			binary.LittleEndian.PutUint64(b[j:], rng.Uint64())
		}
		var text bytes.Buffer
		for j := 0; text.Len() < size; j++ {
			fmt.Fprintf(&text, "file %d line %d value %d\n", i, j, rng.IntN(1000))
		}
		copy(b[size/2:], text.Bytes())
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// treeOf maps each regular file under root to its content.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		m[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameTree(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("tree has %d files, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("file %s differs", k)
		}
	}
}

// archive streams a daemon's workspace (zstd, as sessions do) into store.
func archive(ctx context.Context, t *testing.T, d *agentdtest.Daemon, store snapshot.Store, id string) (snapshot.Info, error) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := d.Client.Archive(ctx, agentclient.ArchiveOptions{}, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	info, err := store.Put(ctx, id, pr)
	pr.CloseWithError(errors.New("store stopped reading"))
	if aerr := <-done; aerr != nil && err == nil {
		t.Fatalf("archive: %v", aerr)
	}
	return info, err
}

// restore streams snapshot id from store into a daemon's workspace.
func restore(ctx context.Context, d *agentdtest.Daemon, store snapshot.Store, id string) error {
	r, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = d.Client.Restore(ctx, agentclient.RestoreOptions{}, r)
	return err
}

// TestS3SnapshotMovesBetweenHarnesses: a workspace snapshotted by one
// harness (daemon + store client) is restored by another that shares only
// the bucket; a second snapshot after changing 1% of the files uploads a
// small fraction of the first.
func TestS3SnapshotMovesBetweenHarnesses(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	ctx := ctxT(t)
	a := agentdtest.Start(t, nil)
	fillWorkspace(t, a.Workspace, 200, 32<<10, 1)
	storeA := newS3(t, srv, bucket, nil)

	first, err := archive(ctx, t, a, storeA, "sess-1")
	if err != nil {
		t.Fatal(err)
	}
	if first.Chunks < 5 || first.Reused != 0 || first.Uploaded == 0 || len(first.SHA256) != 64 {
		t.Fatalf("first snapshot: %+v", first)
	}

	// Change 1% of the workspace: two files of two hundred, rewritten.
	for _, f := range []string{"d05/f055.bin", "d07/f137.bin"} {
		if err := os.WriteFile(filepath.Join(a.Workspace, f), bytes.Repeat([]byte("changed\n"), 4<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	second, err := archive(ctx, t, a, storeA, "sess-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first snapshot: %d bytes read, %d chunks, %d bytes uploaded; second (1%% changed): %d chunks, %d reused, %d bytes uploaded",
		first.Size, first.Chunks, first.Uploaded, second.Chunks, second.Reused, second.Uploaded)
	if second.Reused == 0 || second.Uploaded*4 > first.Uploaded {
		t.Fatalf("second snapshot uploaded %d bytes of %d: the chunks are not shared", second.Uploaded, first.Uploaded)
	}

	// Another harness: its own daemon, its own store client.
	b := agentdtest.Start(t, nil)
	storeB := newS3(t, srv, bucket, nil)
	if ok, err := storeB.Exists(ctx, "sess-1"); !ok || err != nil {
		t.Fatalf("exists on the other harness: %v %v", ok, err)
	}
	if err := restore(ctx, b, storeB, "sess-1"); err != nil {
		t.Fatal(err)
	}
	sameTree(t, treeOf(t, b.Workspace), treeOf(t, a.Workspace))
	st, err := storeB.Stat(ctx, "sess-1")
	if err != nil || st.Size != second.Size || st.SHA256 != second.SHA256 || st.Chunks != second.Chunks {
		t.Fatalf("stat %+v (%v), want %+v", st, err, second)
	}
}

// TestS3RawStream: bytes that are not zstd come back exactly.
func TestS3RawStream(t *testing.T) {
	srv := s3server.Start(t)
	s := newS3(t, srv, srv.Bucket(t), func(c *s3store.Config) { c.Prefix = "" })
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(7, 7))
	data := make([]byte, 3<<20)
	for i := 0; i < len(data); i += 8 {
		binary.LittleEndian.PutUint64(data[i:], rng.Uint64()&0x0303030303030303) // compressible, not zstd
	}
	data = append(data, data[:1<<20]...) // a repeated region: chunks repeat
	info, err := s.Put(ctx, "raw", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(data)) {
		t.Fatalf("info %+v", info)
	}
	r, err := s.Get(ctx, "raw")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("raw round trip: %v (got %d bytes, want %d)", err, len(got), len(data))
	}
	if _, err := s.Get(ctx, "absent"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("get absent: %v", err)
	}
	if err := s.Delete(ctx, "raw"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "raw"); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
	if ok, err := s.Exists(ctx, "raw"); ok || err != nil {
		t.Fatalf("exists after delete: %v %v", ok, err)
	}
	if _, err := s.Put(ctx, "../x", bytes.NewReader(nil)); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("bad id: %v", err)
	}
}

// TestS3CorruptChunk: a chunk whose bytes changed on the server fails the
// restore with snapshot.ErrCorrupt instead of restoring wrong data.
func TestS3CorruptChunk(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	s := newS3(t, srv, bucket, nil)
	ctx := ctxT(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	if _, err := s.Put(ctx, "c", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	keys, err := s.ChunkKeys(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	// Overwrite a chunk with another chunk's valid frame under its name.
	other := s.Encode([]byte("not the chunk"))
	if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String(keys[0]), Body: bytes.NewReader(other)}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(r)
	r.Close()
	if !errors.Is(err, snapshot.ErrCorrupt) || errkind.Retryable(err) {
		t.Fatalf("want snapshot.ErrCorrupt, not retryable: %v", err)
	}
}

// TestS3ServerStopsMidUpload: the server dies while chunks are uploaded.
// The Put fails with a retryable ErrUnavailable, and no snapshot that
// looks complete is left: the earlier one under the id is intact.
func TestS3ServerStopsMidUpload(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	s := newS3(t, srv, bucket, nil)
	ctx := ctxT(t)
	old := bytes.Repeat([]byte("old snapshot "), 100000)
	if _, err := s.Put(ctx, "s", bytes.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	data := make([]byte, 8<<20)
	for i := 0; i < len(data); i += 8 {
		binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
	}
	var read atomic.Int64
	src := readerFunc(func(p []byte) (int, error) {
		if read.Load() > 2<<20 {
			srv.Stop()
		}
		n := copy(p, data[read.Load():])
		read.Add(int64(n))
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	})
	_, err := s.Put(ctx, "s", src)
	if err == nil {
		t.Fatal("put succeeded with the server stopped")
	}
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
		t.Fatalf("want a retryable ErrUnavailable, got %v", err)
	}
	if strings.Contains(err.Error(), srv.SecretKey) || strings.Contains(err.Error(), srv.AccessKey) {
		t.Fatalf("credentials in the error: %v", err)
	}
	t.Logf("mid-upload: %v", err)
	srv.Restart(t)
	r, err := s.Get(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, old) {
		t.Fatalf("the earlier snapshot was damaged: %v", err)
	}
}

// TestS3ServerStopsMidRestore: the server dies while a restore streams.
// The restore fails with a retryable error and the workspace is as it was;
// once the server is back the same restore succeeds.
func TestS3ServerStopsMidRestore(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	ctx := ctxT(t)
	a := agentdtest.Start(t, nil)
	fillWorkspace(t, a.Workspace, 60, 64<<10, 5)
	s := newS3(t, srv, bucket, func(c *s3store.Config) { c.Concurrency = 1 })
	if _, err := archive(ctx, t, a, s, "s"); err != nil {
		t.Fatal(err)
	}
	b := agentdtest.Start(t, nil)
	if err := os.WriteFile(filepath.Join(b.Workspace, "mine.txt"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := treeOf(t, b.Workspace)

	r, err := s.Get(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	stopping := readerFunc(func(p []byte) (int, error) {
		if n > 512<<10 {
			srv.Stop()
		}
		k, err := r.Read(p)
		n += int64(k)
		return k, err
	})
	_, err = b.Client.Restore(ctx, agentclient.RestoreOptions{}, stopping)
	r.Close()
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
		t.Fatalf("want a retryable ErrUnavailable, got %v", err)
	}
	t.Logf("mid-restore: %v", err)
	// The daemon extracts into a staging directory inside the workspace
	// and swaps only a complete archive in; the failed one's staging
	// directory goes away soon after the call returns.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		entries, _ := os.ReadDir(b.Workspace)
		staging := false
		for _, e := range entries {
			staging = staging || strings.HasPrefix(e.Name(), ".bulkhead-restore-")
		}
		if !staging {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the failed restore's staging directory stays")
		}
	}
	sameTree(t, treeOf(t, b.Workspace), before)

	srv.Restart(t)
	if err := restore(ctx, b, s, "s"); err != nil {
		t.Fatal(err)
	}
	sameTree(t, treeOf(t, b.Workspace), treeOf(t, a.Workspace))
}

// TestS3WrongCredentials: a clear ErrUnauthenticated that names neither
// key.
func TestS3WrongCredentials(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	ctx := ctxT(t)
	wrongSecret := "wrong-secret-" + srv.SecretKey[:8]
	for name, mutate := range map[string]func(*s3store.Config){
		"secret": func(c *s3store.Config) { c.SecretAccessKey = wrongSecret },
		"key":    func(c *s3store.Config) { c.AccessKeyID = "AKIAWRONGKEY000001"; c.SecretAccessKey = wrongSecret },
	} {
		t.Run(name, func(t *testing.T) {
			s := newS3(t, srv, bucket, mutate)
			_, perr := s.Put(ctx, "x", bytes.NewReader([]byte("data")))
			_, eerr := s.Exists(ctx, "x")
			lerr := s.List(ctx, func(snapshot.Info) error { return nil })
			for _, err := range []error{perr, eerr, lerr} {
				if !errors.Is(err, errkind.ErrUnauthenticated) || errkind.Retryable(err) {
					t.Fatalf("want ErrUnauthenticated, not retryable: %v", err)
				}
				for _, secret := range []string{srv.SecretKey, wrongSecret, "AKIAWRONGKEY000001", srv.AccessKey} {
					if strings.Contains(err.Error(), secret) || strings.Contains(fmt.Sprintf("%+v %#v", err, s), secret) {
						t.Fatalf("a credential is in the error: %v", err)
					}
				}
			}
			t.Logf("wrong %s: %v", name, perr)
		})
	}
	if _, err := s3store.New(s3store.Config{Bucket: bucket, Endpoint: srv.Endpoint}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("no credentials: %v", err)
	}
	s := newS3(t, srv, "no-such-bucket", nil)
	if _, err := s.Exists(ctx, "x"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("missing bucket: %v", err)
	}
}

// TestS3ListPagesAndGC: listings are read one small page at a time; GC
// deletes only unreferenced chunks older than the grace period, keeps the
// chunks an upload touched, and leaves every remaining snapshot whole.
func TestS3ListPagesAndGC(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	ctx := ctxT(t)
	// A page of 3 keys: 25 snapshots take 9 listing requests.
	small := s3store.Chunking{Min: 1 << 10, Avg: 4 << 10, Max: 16 << 10}
	s := newS3(t, srv, bucket, func(c *s3store.Config) { c.PageSize = 3; c.Chunking = small; c.GCGrace = 4 * time.Second })
	rng := rand.New(rand.NewPCG(9, 9))
	contents := map[string][]byte{}
	for i := range 25 {
		b := make([]byte, 20<<10)
		for j := 0; j < len(b); j += 8 {
			binary.LittleEndian.PutUint64(b[j:], rng.Uint64())
		}
		id := fmt.Sprintf("snap-%02d", i)
		contents[id] = b
		if _, err := s.Put(ctx, id, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	if err := s.List(ctx, func(in snapshot.Info) error {
		if in.Modified.IsZero() {
			t.Errorf("%s: no modification time", in.ID)
		}
		ids = append(ids, in.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 25 || !sort.StringsAreSorted(ids) {
		t.Fatalf("listed %d snapshots: %v", len(ids), ids)
	}

	// Unreference ten snapshots' chunks; within the grace period nothing
	// is old enough to go. (An explicit hour: the store's 4 s can pass
	// while 25 uploads run on a loaded machine.)
	for i := range 10 {
		if err := s.Delete(ctx, fmt.Sprintf("snap-%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.GC(ctx, s3store.GCOptions{Grace: time.Hour})
	if err != nil || st.Deleted != 0 || st.Snapshots != 15 {
		t.Fatalf("gc within the grace period: %+v %v", st, err)
	}
	// Past half the grace period an upload that reuses a chunk touches
	// it: snap-00 stored again keeps its chunks young.
	time.Sleep(2500 * time.Millisecond)
	again, err := s.Put(ctx, "snap-00", bytes.NewReader(contents["snap-00"]))
	if err != nil || again.Reused != again.Chunks {
		t.Fatalf("put again: %+v %v", again, err)
	}
	st, err = s.GC(ctx, s3store.GCOptions{Grace: 2 * time.Second, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	dry := st.Deleted
	st, err = s.GC(ctx, s3store.GCOptions{Grace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gc: %+v (dry run said %d)", st, dry)
	if st.Deleted == 0 || st.Deleted != dry || st.Snapshots != 16 {
		t.Fatalf("gc: %+v (dry run %d)", st, dry)
	}
	for id, want := range contents {
		r, err := s.Get(ctx, id)
		if n, _ := fmt.Sscanf(id, "snap-%02d", new(int)); n == 1 && id != "snap-00" && id < "snap-10" {
			if !errors.Is(err, errkind.ErrNotFound) {
				t.Fatalf("%s: deleted, got %v", id, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after gc: %v", id, err)
		}
	}
	// Nothing is left to collect.
	if st, err := s.GC(ctx, s3store.GCOptions{Grace: time.Nanosecond}); err != nil || st.Deleted != 0 {
		t.Fatalf("second gc: %+v %v", st, err)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestS3GCBesideAnUpload: a collection that runs while an upload is half
// done (chunks stored, no manifest yet) keeps that upload's chunks, which
// are younger than the grace period; the upload then completes whole.
func TestS3GCBesideAnUpload(t *testing.T) {
	srv := s3server.Start(t)
	s := newS3(t, srv, srv.Bucket(t), func(c *s3store.Config) {
		c.Chunking = s3store.Chunking{Min: 1 << 10, Avg: 4 << 10, Max: 16 << 10}
	})
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(11, 11))
	data := make([]byte, 256<<10)
	for i := 0; i < len(data); i += 8 {
		binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
	}
	// The upload pauses after 3/4 of its input until the collection ran.
	paused, resume := make(chan struct{}), make(chan struct{})
	var off int
	pause := len(data) * 3 / 4
	src := readerFunc(func(p []byte) (int, error) {
		if off == pause {
			close(paused)
			<-resume
		}
		end := min(len(data), off+4096)
		if off < pause {
			end = min(end, pause) // stop exactly at the pause
		}
		n := copy(p, data[off:end])
		off += n
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	})
	done := make(chan error, 1)
	go func() { _, err := s.Put(ctx, "up", src); done <- err }()
	<-paused
	time.Sleep(500 * time.Millisecond) // let the uploads of the chunks read so far finish
	st, err := s.GC(ctx, s3store.GCOptions{})
	close(resume)
	if err != nil || st.Deleted != 0 || st.Chunks == 0 || st.Snapshots != 0 {
		t.Fatalf("gc beside an upload: %+v %v", st, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, "up")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the upload is not whole after the collection: %v", err)
	}
}
