package mount_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

func TestMain(m *testing.M) { agentdtest.Main(m, new(string)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// env is a Versity gateway with a bucket, a Mounter holding the bucket's
// credentials as secrets, and a local client with a snapshot store.
type env struct {
	srv     *s3server.Server
	bucket  string
	mounter *mount.Mounter
	client  *compute.Client
	store   snapshot.Store
	s3      *s3.Client
}

func newEnv(t *testing.T, mutate func(*mount.Config)) *env {
	t.Helper()
	return newEnvWith(t, mutate, func(opts compute.ClientOptions) (*compute.Client, error) {
		return local.NewClient(local.Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, opts)
	})
}

// newEnvWith is newEnv on the provider newClient makes.
func newEnvWith(t *testing.T, mutate func(*mount.Config), newClient func(compute.ClientOptions) (*compute.Client, error)) *env {
	t.Helper()
	srv := s3server.Start(t)
	e := &env{srv: srv, bucket: srv.Bucket(t), s3: srv.Client()}
	secrets := map[string]string{"MOUNT_KEY_ID": srv.AccessKey, "MOUNT_SECRET": srv.SecretKey}
	cfg := mount.Config{
		Secrets: manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
			v, ok := secrets[name]
			if !ok {
				return "", fmt.Errorf("no secret %s", name)
			}
			return v, nil
		}),
		MaxAttempts: 2,
		R2Region:    srv.Region,
		Log:         zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := mount.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.mounter = m
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e.store = store
	c, err := newClient(compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Materializer: materializer.Options{Mounts: m}, PreStopHooks: []compute.PreStopHook{m.PreStop}})
	if err != nil {
		t.Fatal(err)
	}
	e.client = c
	return e
}

func (e *env) put(t *testing.T, key, body string) {
	t.Helper()
	if _, err := e.s3.PutObject(ctxT(t), &s3.PutObjectInput{Bucket: &e.bucket, Key: aws.String(key), Body: strings.NewReader(body)}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) get(t *testing.T, key string) (string, bool) {
	t.Helper()
	out, err := e.s3.GetObject(ctxT(t), &s3.GetObjectInput{Bucket: &e.bucket, Key: aws.String(key)})
	if err != nil {
		var nsk interface{ ErrorCode() string }
		if errors.As(err, &nsk) && (nsk.ErrorCode() == "NoSuchKey" || nsk.ErrorCode() == "NotFound") {
			return "", false
		}
		t.Fatal(err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func (e *env) mountEntry(typ manifest.EntryType, readOnly bool) *manifest.Entry {
	mt := &manifest.Mount{Bucket: e.bucket, Prefix: "team/data", Endpoint: e.srv.Endpoint, ReadOnly: &readOnly,
		Credentials: map[string]manifest.SecretRef{"access_key_id": manifest.Secret("MOUNT_KEY_ID"), "secret_access_key": manifest.Secret("MOUNT_SECRET")}}
	if typ == manifest.TypeR2Mount {
		mt.Account = "acct"
	} else {
		mt.Region = e.srv.Region
	}
	return &manifest.Entry{Type: typ, Mount: mt}
}

func (e *env) session(t *testing.T, entries map[string]*manifest.Entry) *compute.Session {
	t.Helper()
	s, err := e.client.Create(ctxT(t), compute.CreateOptions{Manifest: &manifest.Manifest{Entries: entries}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = s.Close(ctx)
		_ = e.client.Delete(ctx, s)
	})
	return s
}

func sh(t *testing.T, s *compute.Session, user, command string) (string, int32) {
	t.Helper()
	res, err := s.Agent().Exec(ctxT(t), &agentdv1.ExecRequest{Spec: &agentdv1.ProcessSpec{Command: command, User: user}}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	return string(res.Stdout) + string(res.Stderr), res.Exit.GetExitCode()
}

func readFile(t *testing.T, s *compute.Session, p string) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := s.Agent().ReadFile(ctxT(t), &agentdv1.ReadFileRequest{Path: p}, &b); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return b.String()
}

// snapshotMembers lists the member names of the session's snapshot.
func snapshotMembers(t *testing.T, store snapshot.Store, id string) []string {
	t.Helper()
	r, err := store.Get(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	zr, err := zstd.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

// TestReadOnlyMount: the bucket's objects under the prefix land with
// exact bytes, belong to root and are not writable by run_as; the secret
// key is nowhere in the sandbox (environment, workspace) nor in the
// state; the mount is not in the snapshot.
func TestReadOnlyMount(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnv(t, nil)
	binary := string([]byte{0, 1, 2, 0xff, '\n', 'x'})
	e.put(t, "team/data/readme.md", "# hello\n")
	e.put(t, "team/data/sub/deep/blob.bin", binary)
	e.put(t, "team/data/sub/", "") // a directory marker
	e.put(t, "team/other.txt", "outside the prefix")
	e.put(t, "team/data/../escape", "bad key") // not a usable path: left out
	s := e.session(t, map[string]*manifest.Entry{
		"notes.txt": {Type: manifest.TypeFile, Content: []byte("mine")},
		"data":      e.mountEntry(manifest.TypeS3Mount, true),
	})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, s, "data/readme.md"); got != "# hello\n" {
		t.Fatalf("readme.md = %q", got)
	}
	if got := readFile(t, s, "data/sub/deep/blob.bin"); got != binary {
		t.Fatalf("blob.bin = %q", got)
	}
	out, _ := sh(t, s, "", "cd data && find . | sort && stat -c '%n %U %a' . readme.md sub sub/deep/blob.bin")
	want := ". root 555\nreadme.md root 444\nsub root 555\nsub/deep/blob.bin root 444"
	if !strings.Contains(out, want) || strings.Contains(out, "escape") || strings.Contains(out, "other.txt") {
		t.Fatalf("mount tree:\n%s\nwant ownership:\n%s", out, want)
	}
	runAs := s.Manifest().RunAs
	if runAs == "" || runAs == "root" {
		t.Fatalf("run_as = %q, want an account of its own", runAs)
	}
	for _, cmd := range []string{"echo x >> data/readme.md", "echo x > data/new.txt", "rm -f data/readme.md", "chmod 666 data/readme.md", "mkdir data/sub/more"} {
		if out, code := sh(t, s, runAs, cmd); code == 0 {
			t.Fatalf("run_as %s could %q in a read-only mount: %s", runAs, cmd, out)
		}
	}
	// The secret key is not in the sandbox: not in a process's
	// environment, not in the workspace, not in the daemon's environment.
	secret := e.srv.SecretKey
	for _, user := range []string{runAs, ""} {
		out, code := sh(t, s, user, "env; grep -r -F -l -- '"+secret+"' . ; true")
		if code != 0 || strings.Contains(out, secret) || strings.Contains(out, e.srv.AccessKey) {
			t.Fatalf("the mount's credentials reached the sandbox (user %q):\n%s", user, out)
		}
	}
	out, _ = sh(t, s, "", "cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'; grep -r -F -l -- '"+secret+"' . ; true")
	if strings.Contains(out, secret) {
		t.Fatalf("the secret is visible in the sandbox:\n%s", out)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(js, []byte(secret)) || bytes.Contains(js, []byte(e.srv.AccessKey)) {
		t.Fatalf("state carries a credential: %s", js)
	}
	if !bytes.Contains(js, []byte("MOUNT_SECRET")) {
		t.Fatalf("state lost the secret's name: %s", js)
	}
	// Snapshot: the workspace's own file is in, the mount is not.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	members := snapshotMembers(t, e.store, s.ID())
	joined := strings.Join(members, "\n")
	if !strings.Contains(joined, "notes.txt") || strings.Contains(joined, "data") {
		t.Fatalf("snapshot members:\n%s", joined)
	}
}

// TestWritableMountSyncedAtClose: an r2_mount (explicit endpoint) that
// the agent changes is uploaded back when the session closes: changed and
// new files put, deleted files deleted, untouched objects not rewritten.
func TestWritableMountSyncedAtClose(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnv(t, nil)
	e.put(t, "team/data/keep.txt", "keep")
	e.put(t, "team/data/edit.txt", "before")
	e.put(t, "team/data/gone.txt", "delete me")
	e.put(t, "team/data/dir/nested.txt", "nested")
	s := e.session(t, map[string]*manifest.Entry{"out": e.mountEntry(manifest.TypeR2Mount, false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	keepHead, err := e.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &e.bucket, Key: aws.String("team/data/keep.txt")})
	if err != nil {
		t.Fatal(err)
	}
	fingerprintOf := func(exclude []string) string {
		fp, err := s.Agent().Fingerprint(ctx, &agentdv1.FingerprintRequest{Exclude: exclude})
		if err != nil {
			t.Fatal(err)
		}
		return fp.GetFingerprint()
	}
	fingerprint := func() string { return fingerprintOf(s.Manifest().EphemeralPaths()) }
	before, beforeAll := fingerprint(), fingerprintOf(nil)
	runAs := s.Manifest().RunAs
	if out, code := sh(t, s, runAs, "cd out && printf after > edit.txt && printf new > dir/new.txt && mkdir -p fresh && printf f > fresh/f.txt && rm gone.txt && touch keep.txt"); code != 0 {
		t.Fatalf("run_as could not write its writable mount: %s", out)
	}
	if fingerprint() != before || fingerprintOf(nil) == beforeAll {
		t.Fatal("changes inside the mount changed the workspace fingerprint (or the fingerprint sees no change at all)")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if members := snapshotMembers(t, e.store, s.ID()); len(members) != 0 {
		t.Fatalf("the snapshot holds mount files: %v", members)
	}
	for key, want := range map[string]string{"team/data/keep.txt": "keep", "team/data/edit.txt": "after", "team/data/dir/new.txt": "new",
		"team/data/fresh/f.txt": "f", "team/data/dir/nested.txt": "nested"} {
		if got, ok := e.get(t, key); !ok || got != want {
			t.Fatalf("%s = %q (present %v), want %q", key, got, ok, want)
		}
	}
	if _, ok := e.get(t, "team/data/gone.txt"); ok {
		t.Fatal("gone.txt was deleted in the sandbox but not remotely")
	}
	keepNow, err := e.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &e.bucket, Key: aws.String("team/data/keep.txt")})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(keepNow.ETag) != aws.ToString(keepHead.ETag) || !aws.ToTime(keepNow.LastModified).Equal(aws.ToTime(keepHead.LastModified)) {
		t.Fatal("an unchanged (touched) file was uploaded again")
	}
}

// TestWritableMountConflict: an object changed behind the session's back
// is not overwritten by Sync; the error is a conflict naming the path, the
// other changes are still synced, and a deletion of a changed object is a
// conflict too.
func TestWritableMountConflict(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnv(t, nil)
	e.put(t, "team/data/shared.txt", "v1")
	e.put(t, "team/data/other.txt", "o1")
	e.put(t, "team/data/removed.txt", "r1")
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(manifest.TypeS3Mount, false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.put(t, "team/data/shared.txt", "remote v2")  // someone else writes meanwhile
	e.put(t, "team/data/removed.txt", "remote r2") // and here
	e.put(t, "team/data/born.txt", "remote born")  // and creates a key the agent creates too
	if out, code := sh(t, s, s.Manifest().RunAs, "cd w && printf local > shared.txt && printf o2 > other.txt && rm removed.txt && printf mine > born.txt"); code != 0 {
		t.Fatal(out)
	}
	stats, err := e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("Sync = %v, want a conflict", err)
	}
	for _, p := range []string{"w/shared.txt", "w/removed.txt", "w/born.txt"} {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("conflict error does not name %s: %v", p, err)
		}
	}
	sort.Strings(stats.Conflicts)
	if fmt.Sprint(stats.Conflicts) != "[w/born.txt w/removed.txt w/shared.txt]" || stats.Uploaded != 1 {
		t.Fatalf("stats = %+v", stats)
	}
	for key, want := range map[string]string{"team/data/shared.txt": "remote v2", "team/data/removed.txt": "remote r2",
		"team/data/born.txt": "remote born", "team/data/other.txt": "o2"} {
		if got, _ := e.get(t, key); got != want {
			t.Fatalf("%s = %q, want %q", key, got, want)
		}
	}
	// Synced again: the conflicts stay conflicts (nothing overwritten),
	// the upload is not repeated.
	stats, err = e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) || stats.Uploaded != 0 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
	if got, _ := e.get(t, "team/data/shared.txt"); got != "remote v2" {
		t.Fatalf("shared.txt overwritten: %q", got)
	}
}

// TestMountSizeLimit: a bucket larger than MaxBytes (or with more objects
// than MaxObjects) fails Start with ResourceExhausted before anything is
// written.
func TestMountSizeLimit(t *testing.T) {
	testenv.Require(t, testenv.Root)
	for name, mutate := range map[string]func(*mount.Config){
		"bytes":   func(c *mount.Config) { c.MaxBytes = 100 },
		"objects": func(c *mount.Config) { c.MaxObjects = 2 },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, mutate)
			e.put(t, "team/data/a.txt", strings.Repeat("a", 60))
			e.put(t, "team/data/b.txt", strings.Repeat("b", 60))
			e.put(t, "team/data/c.txt", "c")
			s := e.session(t, map[string]*manifest.Entry{
				"first.txt": {Type: manifest.TypeFile, Content: []byte("x")},
				"data":      e.mountEntry(manifest.TypeS3Mount, true),
			})
			err := s.Start(ctxT(t))
			if !errors.Is(err, errkind.ErrResourceExhausted) || !strings.Contains(err.Error(), "data") {
				t.Fatalf("Start = %v, want ResourceExhausted naming the mount", err)
			}
			ls, err := s.Agent().ListDir(ctxT(t), &agentdv1.ListDirRequest{Path: ".", User: "root"})
			if err != nil || len(ls.GetEntries()) != 0 {
				t.Fatalf("something was written: %v %v", ls.GetEntries(), err)
			}
		})
	}
}

// TestMountManyObjects: 1,000 small objects listed 37 keys a page arrive
// whole, and a change to one of them syncs only that one.
func TestMountManyObjects(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnv(t, func(c *mount.Config) { c.PageSize = 37; c.Concurrency = 4 })
	ctx := ctxT(t)
	const n = 1000
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := e.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: &e.bucket, Key: aws.String(fmt.Sprintf("team/data/d%02d/f%04d.txt", i%10, i)),
				Body: strings.NewReader(fmt.Sprintf("object %d\n", i))})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s := e.session(t, map[string]*manifest.Entry{"bulk": e.mountEntry(manifest.TypeS3Mount, false)})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	out, _ := sh(t, s, "", "find bulk -type f | wc -l; cat bulk/d07/f0997.txt bulk/d00/f0000.txt")
	if want := "1000\nobject 997\nobject 0\n"; out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	var files int
	for _, f := range s.Materialized().GetFiles() {
		if strings.HasPrefix(f.GetPath(), "bulk/") {
			files++
		}
	}
	if files != n {
		t.Fatalf("materialized %d files, want %d", files, n)
	}
	if _, code := sh(t, s, s.Manifest().RunAs, "printf changed > bulk/d03/f0123.txt"); code != 0 {
		t.Fatal("write failed")
	}
	stats, err := e.mounter.Sync(ctx, s)
	if err != nil || stats.Uploaded != 1 || stats.Unchanged != n-1 {
		t.Fatalf("Sync = %+v, %v", stats, err)
	}
	if got, _ := e.get(t, "team/data/d03/f0123.txt"); got != "changed" {
		t.Fatalf("f0123 = %q", got)
	}
}

// TestOtherMountTypesRefused: an azure_blob_mount naming no credentials
// without a default Azure credential, an s3_files_mount of a file system
// the harness has no bucket for (see s3files_test.go) and a gcs_mount
// without credentials are each refused with a clear error before a
// sandbox is touched.
func TestOtherMountTypesRefused(t *testing.T) {
	m, err := mount.New(mount.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeAzureBlobMount,
		Mount: &manifest.Mount{Account: "a", Container: "c"}}})
	if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "AzureCredential") {
		t.Fatalf("azure_blob_mount: %v", err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeS3FilesMount,
		Mount: &manifest.Mount{FileSystemID: "fs-0123456789abcdef0", Region: "us-east-1"}}})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fs-0123456789abcdef0") {
		t.Fatalf("s3_files_mount: %v", err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeGCSMount,
		Mount: &manifest.Mount{Bucket: "b"}}})
	if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "GCSTokens") {
		t.Fatalf("gcs_mount without credentials: %v", err)
	}
}

// TestMountCredentialsRedacted: a mount whose credentials the storage
// refuses fails with Unauthenticated, and its error never carries the
// secret.
func TestMountCredentialsRedacted(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	const wrong = "wrong-secret-value-0123456789"
	m, err := mount.New(mount.Config{MaxAttempts: 1, Secrets: manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
		if name == "ID" {
			return srv.AccessKey, nil
		}
		return wrong, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	e := &manifest.Entry{Type: manifest.TypeS3Mount, Mount: &manifest.Mount{Bucket: bucket, Endpoint: srv.Endpoint,
		Credentials: map[string]manifest.SecretRef{"access_key_id": manifest.Secret("ID"), "secret_access_key": manifest.Secret("SK")}}}
	_, err = m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: e})
	if !errors.Is(err, errkind.ErrUnauthenticated) || strings.Contains(err.Error(), wrong) {
		t.Fatalf("PlanMount = %v", err)
	}
	// No credentials named and no default: refused up front.
	e.Mount.Credentials = nil
	if _, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: e}); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("PlanMount without credentials = %v", err)
	}
}

// raceTransport changes an object behind the harness's back right after
// the harness's HEAD of it returned: the window between the ETag check and
// the upload.
type raceTransport struct {
	base  http.RoundTripper
	key   string
	fired atomic.Bool
	write func()
}

func (rt *raceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.base.RoundTrip(req)
	if err == nil && req.Method == http.MethodHead && strings.HasSuffix(req.URL.Path, rt.key) && rt.fired.CompareAndSwap(false, true) {
		rt.write()
	}
	return resp, err
}

// TestWritableMountConflictRace: a remote change landing between Sync's
// ETag check and its upload is still caught (the conditional PUT), not
// overwritten.
func TestWritableMountConflictRace(t *testing.T) {
	testenv.Require(t, testenv.Root)
	var e *env
	rt := &raceTransport{base: http.DefaultTransport, key: "/team/data/race.txt"}
	var raceErr error // set on the syncing goroutine, read after Sync
	rt.write = func() {
		_, raceErr = e.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &e.bucket, Key: aws.String("team/data/race.txt"), Body: strings.NewReader("remote wins")})
	}
	e = newEnv(t, func(c *mount.Config) { c.HTTPClient = &http.Client{Transport: rt} })
	e.put(t, "team/data/race.txt", "v1")
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(manifest.TypeS3Mount, false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "printf local > w/race.txt"); code != 0 {
		t.Fatal(out)
	}
	_, err := e.mounter.Sync(ctx, s)
	if raceErr != nil {
		t.Fatal(raceErr)
	}
	if !errors.Is(err, errkind.ErrConflict) || !strings.Contains(err.Error(), "w/race.txt") || !rt.fired.Load() {
		t.Fatalf("Sync = %v (race fired %v), want a conflict naming w/race.txt", err, rt.fired.Load())
	}
	if got, _ := e.get(t, "team/data/race.txt"); got != "remote wins" {
		t.Fatalf("race.txt = %q: overwritten", got)
	}
}

// TestWritableMountResumedElsewhere: a session started by one harness
// (Mounter A) and reattached by another process's client and Mounter (B)
// sharing the baseline store syncs from B: the agent's change is uploaded,
// a remote change is still a conflict. A Mounter without the store
// refuses, uploading nothing. Close deletes the saved baselines.
func TestWritableMountResumedElsewhere(t *testing.T) {
	testenv.Require(t, testenv.Root)
	stateDir := testenv.SearchableTempDir(t)
	baselineDir := t.TempDir()
	newLocal := func(opts compute.ClientOptions) (*compute.Client, error) {
		return local.NewClient(local.Config{StateDir: stateDir, AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, opts)
	}
	withStore := func(c *mount.Config) { c.Baselines = mount.DirBaselines(baselineDir) }
	e := newEnvWith(t, withStore, newLocal)
	e.put(t, "team/data/edit.txt", "before")
	e.put(t, "team/data/theirs.txt", "t1")
	e.put(t, "team/data/same.txt", "same")
	sA := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(manifest.TypeS3Mount, false)})
	ctx := ctxT(t)
	if err := sA.Start(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := sA.State()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(st)
	if strings.Contains(string(js), e.srv.SecretKey) {
		t.Fatal("the state carries the secret")
	}
	if out, code := sh(t, sA, sA.Manifest().RunAs, "cd w && printf after > edit.txt && printf mine > theirs.txt && printf new > new.txt"); code != 0 {
		t.Fatal(out)
	}
	e.put(t, "team/data/theirs.txt", "t2 remote")

	// Another process: its own Mounter and client over the same provider
	// state, resuming from the saved session state.
	resume := func(cfg func(*mount.Config)) (*mount.Mounter, *compute.Session) {
		mc := mount.Config{MaxAttempts: 2, Secrets: manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
			return map[string]string{"MOUNT_KEY_ID": e.srv.AccessKey, "MOUNT_SECRET": e.srv.SecretKey}[name], nil
		})}
		if cfg != nil {
			cfg(&mc)
		}
		m, err := mount.New(mc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := newLocal(compute.ClientOptions{Materializer: materializer.Options{Mounts: m}})
		if err != nil {
			t.Fatal(err)
		}
		dec, err := compute.DecodeState(js)
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Resume(ctx, dec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Release() })
		return m, s
	}
	mNo, sNo := resume(nil)
	if stats, err := mNo.Sync(ctx, sNo); !errors.Is(err, errkind.ErrFailedPrecondition) || stats.Uploaded != 0 {
		t.Fatalf("Sync without the store = %+v, %v", stats, err)
	}
	if got, _ := e.get(t, "team/data/edit.txt"); got != "before" {
		t.Fatalf("edit.txt = %q after a refused sync", got)
	}
	mB, sB := resume(withStore)
	stats, err := mB.Sync(ctx, sB)
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/theirs.txt]" || stats.Uploaded != 2 || stats.Unchanged != 1 {
		t.Fatalf("Sync from the other process = %+v, %v", stats, err)
	}
	for key, want := range map[string]string{"team/data/edit.txt": "after", "team/data/new.txt": "new", "team/data/theirs.txt": "t2 remote", "team/data/same.txt": "same"} {
		if got, _ := e.get(t, key); got != want {
			t.Fatalf("%s = %q, want %q", key, got, want)
		}
	}
	// A's Mounter still works from its own memory; then Close drops the
	// saved baselines.
	if err := sA.Close(ctx); !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("Close = %v, want the standing conflict", err)
	}
	if left, _ := os.ReadDir(baselineDir); len(left) != 0 {
		t.Fatalf("baselines left after Close: %v", left)
	}
}
