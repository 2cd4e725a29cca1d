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
	"net/url"
	"os"
	"slices"
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

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/azureserver"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gcsserver"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/azuremount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/gcsmount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/s3mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func TestMain(m *testing.M) { agentdtest.Main(m, new(string)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// storage is one storage server with a bucket (or container) that mounts
// read and write: how a test reaches its objects behind the harness's
// back, the mount entry of its root, and what must stay secret. The
// shared scenarios (TestMounts) run against each kind in backends.
type storage struct {
	// root is the key prefix the mount's root maps to ("team/data/").
	root string
	// outside are keys beside root that no mount of root shows or changes.
	outside []string
	// putObject writes a full key as another writer would; getObject
	// reads one (false when there is none); versionOf returns what
	// changes when an object is written again (an ETag and a time, a
	// generation).
	putObject func(ctx context.Context, key, body string) error
	getObject func(ctx context.Context, key string) (string, bool, error)
	versionOf func(ctx context.Context, key string) (string, error)
	// entry mounts root.
	entry func(readOnly bool) *manifest.Entry
	// config is what the backend needs of the Mounter's configuration (an
	// HTTP client, a region, file systems), before Secrets and a test's
	// changes.
	config testConfig
	// secrets are the Mounter's secrets; hidden the credential values
	// that must reach neither a sandbox nor a session's state, and
	// secretName the name of one the state keeps ("": the manifest names
	// none).
	secrets    map[string]string
	hidden     []string
	secretName string
	// checks tells whether req is Sync's look-up of key's current
	// version: the window before a conditional upload or delete.
	checks func(req *http.Request, key string) bool
	// deletesUnconditionally: the server ignores the condition of a
	// delete (fake-gcs-server v1.56.1 ignores ifGenerationMatch on
	// DELETE, real GCS does not), so the race of a remote write between
	// Sync's check and its delete cannot be closed there.
	deletesUnconditionally bool
	// uploads tells whether req uploads an object (for the
	// lost_upload_answer scenario).
	uploads func(req *http.Request) bool
	// serverStats, where the server counts them: the requests whose
	// signature it verified and refused, and the uploads.
	serverStats func() (verified, refused, uploads int)

	// S3's server, bucket and client, for the S3-specific tests.
	srv    *s3server.Server
	bucket string
	s3     *s3.Client
}

// backends are the kinds of storage the shared scenarios run against,
// each started afresh per scenario.
var backends = []struct {
	name  string
	start func(t *testing.T) *storage
}{
	{"s3", func(t *testing.T) *storage { return s3Storage(t, manifest.TypeS3Mount) }},
	{"r2", func(t *testing.T) *storage { return s3Storage(t, manifest.TypeR2Mount) }},
	{"gcs", func(t *testing.T) *storage { srv := gcsserver.Start(t); return gcsStorage(srv, srv.Bucket(t)) }},
	{"azure_key", func(t *testing.T) *storage { return azureStorage(t, false) }},
	{"azure_sas", func(t *testing.T) *storage { return azureStorage(t, true) }},
	{"s3_files", s3FilesStorage},
}

// s3Storage is a Versity gateway with a bucket, mounted as an s3_mount
// or an r2_mount (an explicit endpoint; the account is not used then).
func s3Storage(t *testing.T, typ manifest.EntryType) *storage {
	t.Helper()
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	client := srv.Client()
	st := &storage{root: "team/data/", outside: []string{"team/elsewhere.txt"},
		srv: srv, bucket: bucket, s3: client,
		config:     testConfig{S3: s3mount.Config{R2Region: srv.Region}},
		secrets:    map[string]string{"MOUNT_KEY_ID": srv.AccessKey, "MOUNT_SECRET": srv.SecretKey},
		hidden:     []string{srv.SecretKey, srv.AccessKey},
		secretName: "MOUNT_SECRET",
		checks: func(req *http.Request, key string) bool {
			return req.Method == http.MethodHead && strings.HasSuffix(req.URL.Path, "/"+key)
		},
		uploads: func(req *http.Request) bool { return req.Method == http.MethodPut },
	}
	st.putObject = func(ctx context.Context, key, body string) error {
		_, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String(key), Body: strings.NewReader(body)})
		return err
	}
	st.getObject = func(ctx context.Context, key string) (string, bool, error) {
		out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: aws.String(key)})
		if err != nil {
			var nsk interface{ ErrorCode() string }
			if errors.As(err, &nsk) && (nsk.ErrorCode() == "NoSuchKey" || nsk.ErrorCode() == "NotFound") {
				return "", false, nil
			}
			return "", false, err
		}
		defer out.Body.Close()
		b, err := io.ReadAll(out.Body)
		return string(b), true, err
	}
	// The ETag alone is the content's MD5: a rewrite of the same bytes
	// keeps it, the modification time does not.
	st.versionOf = func(ctx context.Context, key string) (string, error) {
		h, err := client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: aws.String(key)})
		if err != nil {
			return "", err
		}
		return aws.ToString(h.ETag) + " " + aws.ToTime(h.LastModified).Format(time.RFC3339Nano), nil
	}
	st.entry = func(readOnly bool) *manifest.Entry {
		mt := &manifest.Mount{Bucket: bucket, Prefix: "team/data", Endpoint: srv.Endpoint, ReadOnly: &readOnly,
			Credentials: map[string]manifest.SecretRef{"access_key_id": manifest.Secret("MOUNT_KEY_ID"), "secret_access_key": manifest.Secret("MOUNT_SECRET")}}
		if typ == manifest.TypeR2Mount {
			mt.Account = "acct"
		} else {
			mt.Region = srv.Region
		}
		return &manifest.Entry{Type: typ, Mount: mt}
	}
	return st
}

// s3FilesStorage is an S3 Files file system (testFS) kept under "fsroot/"
// of a Versity bucket, mounted through access point testAP (rooted at
// /teams/a) at subpath /work: the mount's root is
// fsroot/teams/a/work/. Beside it: another access point's directory, the
// access point's root above the subpath, and a key outside the file
// system's prefix.
func s3FilesStorage(t *testing.T) *storage {
	t.Helper()
	st := s3Storage(t, manifest.TypeS3Mount)
	st.root = "fsroot/teams/a/work/"
	st.secretName = "" // the credentials are the harness's configuration, not the manifest's
	st.outside = []string{"fsroot/teams/b/work/elsewhere.txt", "fsroot/teams/a/elsewhere.txt", "teams/a/work/elsewhere.txt"}
	st.config.S3.FileSystems = map[string]s3mount.FileSystem{testFS: {
		Bucket: st.bucket, Prefix: "/fsroot/", Endpoint: st.srv.Endpoint, Region: st.srv.Region,
		Credentials:  map[string]manifest.SecretRef{"access_key_id": manifest.Secret("MOUNT_KEY_ID"), "secret_access_key": manifest.Secret("MOUNT_SECRET")},
		AccessPoints: map[string]string{testAP: "/teams/a"},
	}}
	st.entry = func(readOnly bool) *manifest.Entry {
		e := s3FilesEntry(readOnly, "/work")
		e.Mount.AccessPoint = testAP
		return e
	}
	return st
}

// gcsTestToken is the bearer token the mounts present (fake-gcs-server
// takes any); it stands for a credential that must not reach a sandbox.
const gcsTestToken = "ya29.gcs-mount-test-token-4f1c9a"

// gcsStorage is a bucket of a fake-gcs-server, mounted with an access
// token.
func gcsStorage(srv *gcsserver.Server, bucket string) *storage {
	return &storage{root: "team/data/", outside: []string{"team/elsewhere.txt"},
		putObject: func(ctx context.Context, key, body string) error {
			_, err := srv.Put(ctx, bucket, key, []byte(body))
			return err
		},
		getObject: func(ctx context.Context, key string) (string, bool, error) {
			b, ok, err := srv.Get(ctx, bucket, key)
			return string(b), ok, err
		},
		versionOf: func(ctx context.Context, key string) (string, error) { return srv.Generation(ctx, bucket, key) },
		entry: func(readOnly bool) *manifest.Entry {
			return &manifest.Entry{Type: manifest.TypeGCSMount, Mount: &manifest.Mount{Bucket: bucket, Prefix: "team/data", Endpoint: srv.Endpoint,
				ReadOnly: &readOnly, Credentials: map[string]manifest.SecretRef{"access_token": manifest.Secret("GCS_TOKEN")}}}
		},
		secrets:    map[string]string{"GCS_TOKEN": gcsTestToken},
		hidden:     []string{gcsTestToken},
		secretName: "GCS_TOKEN",
		// The generation look-up: the object's metadata, not its media.
		checks: func(req *http.Request, key string) bool {
			return req.Method == http.MethodGet && strings.HasSuffix(req.URL.EscapedPath(), "/o/"+url.PathEscape(key)) && req.URL.Query().Get("alt") == ""
		},
		uploads:                func(req *http.Request) bool { return strings.Contains(req.URL.Path, "/upload/") },
		deletesUnconditionally: true,
	}
}

const (
	azAccount   = "bulkheadtest"
	azContainer = "data"
)

// azureStorage is the in-test Azure Blob server's container, mounted
// with the account key (Shared Key) or, with sas, a SAS token. Every
// request must pass the server's own signature check.
func azureStorage(t *testing.T, sas bool) *storage {
	t.Helper()
	srv := azureserver.Start(t, azAccount, azContainer, false)
	secretName, creds := "AZ_KEY", map[string]manifest.SecretRef(nil)
	if sas {
		secretName, creds = "AZ_SAS", map[string]manifest.SecretRef{"sas_token": manifest.Secret("AZ_SAS")}
	}
	return &storage{root: "team/data/", outside: []string{"team/elsewhere.txt"},
		putObject: func(_ context.Context, key, body string) error { srv.Put(azContainer, key, body); return nil },
		getObject: func(_ context.Context, key string) (string, bool, error) {
			body, _, ok := srv.Get(azContainer, key)
			return body, ok, nil
		},
		versionOf: func(_ context.Context, key string) (string, error) {
			_, etag, _ := srv.Get(azContainer, key)
			return etag, nil
		},
		entry:      func(readOnly bool) *manifest.Entry { return azureEntry(srv, readOnly, creds) },
		config:     testConfig{Config: mount.Config{HTTPClient: srv.Client()}},
		secrets:    map[string]string{"AZ_KEY": srv.KeyB64, "AZ_SAS": srv.SAS},
		hidden:     []string{srv.KeyB64, srv.SASSig, srv.Bearer},
		secretName: secretName,
		checks: func(req *http.Request, key string) bool {
			return req.Method == http.MethodHead && strings.HasSuffix(req.URL.Path, "/"+key)
		},
		uploads: func(req *http.Request) bool { return req.Method == http.MethodPut },
		serverStats: func() (int, int, int) {
			verified, refused, _, _, puts := srv.Stats()
			return verified, refused, puts
		},
	}
}

// azureEntry is an azure_blob_mount of the server's container under
// "team/data", signed with the account key (or the named credential).
func azureEntry(srv *azureserver.Server, readOnly bool, creds map[string]manifest.SecretRef) *manifest.Entry {
	if creds == nil {
		creds = map[string]manifest.SecretRef{"account_key": manifest.Secret("AZ_KEY")}
	}
	return &manifest.Entry{Type: manifest.TypeAzureBlobMount, Mount: &manifest.Mount{Account: azAccount, Container: azContainer, Prefix: "team/data",
		Endpoint: srv.Endpoint(), ReadOnly: &readOnly, Credentials: creds}}
}

// mountConfig is the storage's Mounter configuration with its secrets,
// two attempts per request and the test's log, changed by mutate.
func (st *storage) mountConfig(t *testing.T, mutate func(*testConfig)) mount.Config {
	cfg := st.config
	cfg.Secrets = manifest.SecretMap(st.secrets)
	cfg.MaxAttempts = 2
	cfg.Log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	if mutate != nil {
		mutate(&cfg)
	}
	return cfg.build()
}

// testConfig is a Mounter's configuration with its backends'.
type testConfig struct {
	mount.Config
	S3    s3mount.Config
	GCS   gcsmount.Config
	Azure azuremount.Config
}

// build is the Mounter's configuration with every backend, each with its
// configuration.
func (c testConfig) build() mount.Config {
	cfg := c.Config
	cfg.Backends = []mount.Backend{s3mount.New(c.S3), gcsmount.New(c.GCS), azuremount.New(c.Azure)}
	return cfg
}

// withAll is cfg with every backend, unconfigured.
func withAll(cfg mount.Config) mount.Config { return testConfig{Config: cfg}.build() }

// transportOf is the transport a configuration's HTTP client uses.
func transportOf(c *testConfig) http.RoundTripper {
	if c.HTTPClient != nil && c.HTTPClient.Transport != nil {
		return c.HTTPClient.Transport
	}
	return http.DefaultTransport
}

// env is a storage, a Mounter holding its credentials as secrets, and a
// client with a snapshot store whose sessions the Mounter materializes.
type env struct {
	*storage
	mounter   *mount.Mounter
	client    *compute.Client
	snapshots snapshot.Store
}

// newEnv is an env on a Versity gateway (s3_mount) and the local provider.
func newEnv(t *testing.T, mutate func(*testConfig)) *env {
	t.Helper()
	return newEnvOn(t, s3Storage(t, manifest.TypeS3Mount), mutate, nil)
}

// newEnvOn is an env on st whose client newClient makes (nil: the local
// provider, without isolation).
func newEnvOn(t *testing.T, st *storage, mutate func(*testConfig), newClient func(compute.ClientOptions) (*compute.Client, error)) *env {
	t.Helper()
	m, err := mount.New(st.mountConfig(t, mutate))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{storage: st, mounter: m}
	if e.snapshots, err = snapshot.NewLocal(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if newClient == nil {
		newClient = func(opts compute.ClientOptions) (*compute.Client, error) {
			return local.NewClient(local.Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, opts)
		}
	}
	e.client, err = newClient(compute.ClientOptions{Snapshots: e.snapshots, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Materializer: materializer.Options{Mounts: m}, PreStopHooks: []compute.PreStopHook{m.PreStop}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// put writes the object at rel under the mount's root.
func (e *env) put(t *testing.T, rel, body string) {
	t.Helper()
	if err := e.putObject(ctxT(t), e.root+rel, body); err != nil {
		t.Fatal(err)
	}
}

// putAll writes each object (rel -> body) under the mount's root.
func (e *env) putAll(t *testing.T, objects map[string]string) {
	t.Helper()
	for rel, body := range objects {
		e.put(t, rel, body)
	}
}

// putOutside writes each of the keys outside the mount's root.
func (e *env) putOutside(t *testing.T) {
	t.Helper()
	for _, k := range e.outside {
		if err := e.putObject(ctxT(t), k, "outside the mount"); err != nil {
			t.Fatal(err)
		}
	}
}

// get reads the object at rel under the mount's root.
func (e *env) get(t *testing.T, rel string) (string, bool) {
	t.Helper()
	body, ok, err := e.getObject(ctxT(t), e.root+rel)
	if err != nil {
		t.Fatal(err)
	}
	return body, ok
}

// version is the version of the object at rel under the mount's root.
func (e *env) version(t *testing.T, rel string) string {
	t.Helper()
	v, err := e.versionOf(ctxT(t), e.root+rel)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkServer fails the test if the server refused a request or, when
// uploads >= 0, counted another number of uploads. Only servers that
// count (Azure) are checked.
func (e *env) checkServer(t *testing.T, uploads int) {
	t.Helper()
	if e.serverStats == nil {
		return
	}
	verified, refused, puts := e.serverStats()
	if verified == 0 || refused != 0 || (uploads >= 0 && puts != uploads) {
		t.Fatalf("server: %d requests verified, %d refused, %d uploads (want %d)", verified, refused, puts, uploads)
	}
}

// session creates a session of entries (checked first), closed and
// deleted when the test ends.
func (e *env) session(t *testing.T, entries map[string]*manifest.Entry) *compute.Session {
	t.Helper()
	m := &manifest.Manifest{Entries: entries}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := e.client.Create(ctxT(t), compute.CreateOptions{Manifest: m})
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

// started is session followed by Start.
func (e *env) started(t *testing.T, entries map[string]*manifest.Entry) *compute.Session {
	t.Helper()
	s := e.session(t, entries)
	if err := s.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return s
}

func sh(t *testing.T, s *compute.Session, user, command string) (string, int) {
	t.Helper()
	res, err := s.Exec(ctxT(t), compute.ProcessSpec{Command: command, User: user}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	return string(res.Stdout) + string(res.Stderr), res.Exit.ExitCode
}

// asRunAs runs command as the session's run_as account; it must succeed.
func asRunAs(t *testing.T, s *compute.Session, command string) {
	t.Helper()
	if out, code := sh(t, s, s.Manifest().RunAs, command); code != 0 {
		t.Fatalf("run_as could not %q: %s", command, out)
	}
}

func readFile(t *testing.T, s *compute.Session, p string) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := s.ReadFile(ctxT(t), p, compute.ReadFileOptions{}, &b); err != nil {
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

// assertReadOnly: run_as is an account of its own, and can neither
// change, add, remove, chmod nor make a directory in the mount at dir
// (which holds readme.md and sub/).
func assertReadOnly(t *testing.T, s *compute.Session, dir string) {
	t.Helper()
	runAs := s.Manifest().RunAs
	if runAs == "" || runAs == "root" {
		t.Fatalf("run_as = %q, want an account of its own", runAs)
	}
	for _, cmd := range []string{"echo x >> %s/readme.md", "echo x > %s/new.txt", "rm -f %s/readme.md", "chmod 666 %s/readme.md", "mkdir %s/sub/more"} {
		cmd = fmt.Sprintf(cmd, dir)
		if out, code := sh(t, s, runAs, cmd); code == 0 {
			t.Fatalf("run_as %s could %q in a read-only mount: %s", runAs, cmd, out)
		}
	}
}

// assertNoSecret: none of the hidden credentials is in a process's
// environment (run_as or root), the daemon's environment, the workspace,
// or the session's state, which keeps the secret's name (secretName).
func assertNoSecret(t *testing.T, e *env, s *compute.Session) {
	t.Helper()
	for _, user := range []string{s.Manifest().RunAs, ""} {
		cmd := "env; cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'"
		for _, sec := range e.hidden {
			cmd += "; grep -r -F -l -- '" + sec + "' . 2>/dev/null"
		}
		out, code := sh(t, s, user, cmd+"; true")
		for _, sec := range e.hidden {
			if code != 0 || strings.Contains(out, sec) {
				t.Fatalf("a credential reached the sandbox (user %q, exit %d):\n%s", user, code, out)
			}
		}
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range e.hidden {
		if bytes.Contains(js, []byte(sec)) {
			t.Fatalf("state carries a credential: %s", js)
		}
	}
	if e.secretName != "" && !bytes.Contains(js, []byte(e.secretName)) {
		t.Fatalf("state lost the secret's name %s: %s", e.secretName, js)
	}
}

// assertStoppedWithout stops the session: its snapshot holds the
// workspace's own notes.txt and nothing of the mount at dir.
func assertStoppedWithout(t *testing.T, e *env, s *compute.Session, dir string) {
	t.Helper()
	if err := s.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(snapshotMembers(t, e.snapshots, s.ID()), "\n")
	if !strings.Contains(joined, "notes.txt") || strings.Contains(joined, dir) {
		t.Fatalf("snapshot members:\n%s", joined)
	}
}

// wantObjects fails the test unless each object (rel -> body) is there.
func wantObjects(t *testing.T, e *env, want map[string]string) {
	t.Helper()
	for rel, body := range want {
		if got, ok := e.get(t, rel); !ok || got != body {
			t.Fatalf("%s = %q (present %v), want %q", rel, got, ok, body)
		}
	}
}

// mountScenarios are the behaviours every backend shows. Each runs on a
// storage of its own; backends, when set, are the only backends it is for
// (see the scenario).
var mountScenarios = []struct {
	name     string
	backends []string
	run      func(t *testing.T, st *storage)
}{
	{name: "read_only", run: scenarioReadOnly},
	{name: "synced_at_close", run: scenarioSyncedAtClose},
	{name: "conflict", run: scenarioConflict},
	{name: "conflict_race", run: scenarioConflictRace},
	{name: "lost_upload_answer", run: scenarioLostUploadAnswer},
	{name: "size_limit", run: scenarioSizeLimit},
	{name: "resumed_elsewhere", run: scenarioResumedElsewhere},
}

// TestMounts runs each scenario of mountScenarios against each backend.
func TestMounts(t *testing.T) {
	testenv.Require(t, testenv.Root)
	for _, sc := range mountScenarios {
		t.Run(sc.name, func(t *testing.T) {
			for _, b := range backends {
				if sc.backends == nil || slices.Contains(sc.backends, b.name) {
					t.Run(b.name, func(t *testing.T) { sc.run(t, b.start(t)) })
				}
			}
		})
	}
}

// scenarioReadOnly: the objects under the mount's root land with exact
// bytes (a binary one, names with a space, an ampersand and non-ASCII
// letters), a directory marker is a directory, a key that is not a usable
// path and the keys outside the root are left out; everything belongs to
// root and is not writable by run_as; no credential is in the sandbox or
// the state; the mount is not in the snapshot, the workspace's own file
// is.
func scenarioReadOnly(t *testing.T, st *storage) {
	e := newEnvOn(t, st, nil, nil)
	binary := string([]byte{0, 1, 2, 0xff, '\n', 'x'})
	files := map[string]string{"readme.md": "# hello\n", "sub/deep/blob & name.bin": binary, "with space/é.txt": "unicode"}
	e.putAll(t, files)
	e.put(t, "sub/", "")             // a directory marker
	e.put(t, "../escape", "bad key") // not a usable path: left out
	e.putOutside(t)
	s := e.started(t, map[string]*manifest.Entry{
		"notes.txt": {Type: manifest.TypeFile, Content: []byte("mine")},
		"data":      e.entry(true),
	})
	for rel, want := range files {
		if got := readFile(t, s, "data/"+rel); got != want {
			t.Fatalf("%s = %q, want %q", rel, got, want)
		}
	}
	out, _ := sh(t, s, "", "cd data && find . | sort && stat -c '%n %U %a' . readme.md sub 'sub/deep/blob & name.bin'")
	want := ". root 555\nreadme.md root 444\nsub root 555\nsub/deep/blob & name.bin root 444"
	if !strings.Contains(out, want) || strings.Contains(out, "escape") || strings.Contains(out, "elsewhere") {
		t.Fatalf("mount tree:\n%s\nwant ownership:\n%s", out, want)
	}
	assertReadOnly(t, s, "data")
	e.checkServer(t, 0)
	assertNoSecret(t, e, s)
	assertStoppedWithout(t, e, s, "data")
}

// scenarioSyncedAtClose: a writable mount that run_as changes is uploaded
// back when the session closes: changed and new files put, deleted files
// deleted, untouched (even touched) objects not written again, nothing
// outside the root changed; the changes leave the workspace fingerprint
// as it was, the mount is not in the snapshot, no credential is in the
// sandbox.
func scenarioSyncedAtClose(t *testing.T, st *storage) {
	e := newEnvOn(t, st, nil, nil)
	e.putAll(t, map[string]string{"keep.txt": "keep", "edit.txt": "before", "gone.txt": "delete me", "dir/nested.txt": "nested"})
	e.putOutside(t)
	keepVersion, nestedVersion := e.version(t, "keep.txt"), e.version(t, "dir/nested.txt")
	s := e.started(t, map[string]*manifest.Entry{"out": e.entry(false)})
	ctx := ctxT(t)
	if got := readFile(t, s, "out/edit.txt"); got != "before" {
		t.Fatalf("out/edit.txt = %q", got)
	}
	fingerprintOf := func(exclude []string) string {
		fp, err := s.Agent().Fingerprint(ctx, compute.FingerprintOptions{Exclude: exclude})
		if err != nil {
			t.Fatal(err)
		}
		return fp
	}
	fingerprint := func() string { return fingerprintOf(s.Manifest().EphemeralPaths()) }
	before, beforeAll := fingerprint(), fingerprintOf(nil)
	asRunAs(t, s, "cd out && printf after > edit.txt && printf new > dir/new.txt && mkdir -p fresh && printf f > fresh/f.txt && rm gone.txt && touch keep.txt")
	if fingerprint() != before || fingerprintOf(nil) == beforeAll {
		t.Fatal("changes inside the mount changed the workspace fingerprint (or the fingerprint sees no change at all)")
	}
	assertNoSecret(t, e, s)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if members := snapshotMembers(t, e.snapshots, s.ID()); len(members) != 0 {
		t.Fatalf("the snapshot holds mount files: %v", members)
	}
	wantObjects(t, e, map[string]string{"keep.txt": "keep", "edit.txt": "after", "dir/new.txt": "new", "fresh/f.txt": "f", "dir/nested.txt": "nested"})
	if _, ok := e.get(t, "gone.txt"); ok {
		t.Fatal("gone.txt was deleted in the sandbox but not remotely")
	}
	if e.version(t, "keep.txt") != keepVersion || e.version(t, "dir/nested.txt") != nestedVersion {
		t.Fatal("an unchanged (touched) file was uploaded again")
	}
	for _, k := range e.outside {
		if got, ok, err := e.getObject(ctx, k); err != nil || !ok || got != "outside the mount" {
			t.Fatalf("%s, outside the mount = %q (present %v, %v)", k, got, ok, err)
		}
	}
	e.checkServer(t, 3)
}

// scenarioConflict: objects changed (or created, or changed and then
// deleted in the sandbox) behind the session's back are not overwritten;
// the error is a conflict naming each path; the sandbox's versions stay
// (nothing lost); the other change is synced; a second Sync keeps the
// conflicts and uploads nothing again; Close reports them too.
func scenarioConflict(t *testing.T, st *storage) {
	e := newEnvOn(t, st, nil, nil)
	e.putAll(t, map[string]string{"shared.txt": "v1", "other.txt": "o1", "removed.txt": "r1"})
	s := e.started(t, map[string]*manifest.Entry{"w": e.entry(false)})
	ctx := ctxT(t)
	e.put(t, "shared.txt", "remote v2")  // someone else writes meanwhile
	e.put(t, "removed.txt", "remote r2") // and here
	e.put(t, "born.txt", "remote born")  // and creates a key the agent creates too
	asRunAs(t, s, "cd w && printf local > shared.txt && printf o2 > other.txt && rm removed.txt && printf mine > born.txt")
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
	wantObjects(t, e, map[string]string{"shared.txt": "remote v2", "removed.txt": "remote r2", "born.txt": "remote born", "other.txt": "o2"})
	if got := readFile(t, s, "w/shared.txt") + readFile(t, s, "w/born.txt"); got != "localmine" {
		t.Fatalf("the sandbox's versions were lost: %q", got)
	}
	stats, err = e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) || stats.Uploaded != 0 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
	if got, _ := e.get(t, "shared.txt"); got != "remote v2" {
		t.Fatalf("shared.txt overwritten: %q", got)
	}
	if err := s.Close(ctx); !errors.Is(err, errkind.ErrConflict) || !strings.Contains(err.Error(), "w/shared.txt") {
		t.Fatalf("Close = %v, want the conflict naming w/shared.txt", err)
	}
}

// raceTransport runs write once, right after the first request that
// match accepts returned: a remote change landing in the window between
// Sync's check of an object and the write that check guards.
type raceTransport struct {
	base  http.RoundTripper
	match func(*http.Request) bool
	write func() error
	rel   string // the object's path in the mount, for the messages
	fired atomic.Bool
	err   error // write's, set on the syncing goroutine, read after Sync
}

func (rt *raceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.base.RoundTrip(req)
	if err == nil && rt.match(req) && rt.fired.CompareAndSwap(false, true) {
		rt.err = rt.write()
	}
	return resp, err
}

// scenarioConflictRace: a remote change landing between Sync's version
// check and its upload (and, where the server honours a delete's
// condition, its delete) is still caught by the conditional write: a
// conflict naming the path, nothing overwritten or deleted.
func scenarioConflictRace(t *testing.T, st *storage) {
	race := func(base http.RoundTripper, rel, body string) *raceTransport {
		return &raceTransport{base: base, rel: rel,
			match: func(req *http.Request) bool { return st.checks(req, st.root+rel) },
			write: func() error { return st.putObject(context.Background(), st.root+rel, body) },
		}
	}
	var races []*raceTransport
	e := newEnvOn(t, st, func(c *testConfig) {
		races = append(races, race(transportOf(c), "race.txt", "remote wins"))
		if !st.deletesUnconditionally {
			races = append(races, race(races[0], "doomed.txt", "remote keeps it"))
		}
		c.HTTPClient = &http.Client{Transport: races[len(races)-1]}
	}, nil)
	e.putAll(t, map[string]string{"race.txt": "v1", "doomed.txt": "d1"})
	s := e.started(t, map[string]*manifest.Entry{"w": e.entry(false)})
	command, want := "printf local > w/race.txt", []string{"w/race.txt"}
	if !st.deletesUnconditionally {
		command, want = command+" && rm w/doomed.txt", []string{"w/doomed.txt", "w/race.txt"}
	}
	asRunAs(t, s, command)
	stats, err := e.mounter.Sync(ctxT(t), s)
	sort.Strings(stats.Conflicts)
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != fmt.Sprint(want) {
		t.Fatalf("Sync = %+v, %v, want conflicts naming %v", stats, err, want)
	}
	for _, rt := range races {
		if rt.err != nil || !rt.fired.Load() || !strings.Contains(err.Error(), "w/"+rt.rel) {
			t.Fatalf("race on %s: fired %v, %v; Sync = %v", rt.rel, rt.fired.Load(), rt.err, err)
		}
	}
	if got, _ := e.get(t, "race.txt"); got != "remote wins" {
		t.Fatalf("race.txt = %q: overwritten", got)
	}
	if got, ok := e.get(t, "doomed.txt"); !ok || (!st.deletesUnconditionally && got != "remote keeps it") {
		t.Fatalf("doomed.txt = %q (present %v): deleted", got, ok)
	}
}

// How lostAnswer loses the answer of the next upload.
const (
	keepAnswers int32 = iota
	answer503         // a 503, as a proxy losing the answer would send
	answerReset       // a broken connection after the server wrote the object
)

// lostAnswer delivers the next upload (once mode is set) to the server
// but tells the client it failed, so that the client retries an upload
// that already happened.
type lostAnswer struct {
	base    http.RoundTripper
	uploads func(*http.Request) bool
	mode    atomic.Int32
	dropped atomic.Int32
}

func (lt *lostAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := lt.base.RoundTrip(req)
	if err != nil || !lt.uploads(req) || resp.StatusCode/100 != 2 {
		return resp, err
	}
	switch lt.mode.Swap(keepAnswers) {
	case answer503:
		resp.Body.Close()
		lt.dropped.Add(1)
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Header: http.Header{},
			Body: http.NoBody, Request: req}, nil
	case answerReset:
		resp.Body.Close()
		lt.dropped.Add(1)
		return nil, errors.New("connection reset by peer (injected after the server wrote the object)")
	}
	return resp, err
}

// scenarioLostUploadAnswer: an upload whose answer was lost (a 503, then
// a broken connection) is retried; the retry's failed condition against
// the object it wrote itself is recognised (same MD5) as uploaded, not a
// conflict; the baseline is then the new version, so a sync after has
// nothing to do and a further change syncs without a conflict.
func scenarioLostUploadAnswer(t *testing.T, st *storage) {
	lt := &lostAnswer{uploads: st.uploads}
	e := newEnvOn(t, st, func(c *testConfig) {
		lt.base = transportOf(c)
		c.HTTPClient = &http.Client{Transport: lt}
		c.MaxAttempts = 3
	}, nil)
	e.put(t, "f.txt", "v1")
	s := e.started(t, map[string]*manifest.Entry{"w": e.entry(false)})
	ctx := ctxT(t)
	for i, mode := range []int32{answer503, answerReset} {
		body := fmt.Sprintf("v%d", i+2)
		asRunAs(t, s, "printf "+body+" > w/f.txt")
		lt.mode.Store(mode)
		stats, err := e.mounter.Sync(ctx, s)
		if err != nil || stats.Uploaded != 1 || lt.dropped.Load() != int32(i+1) {
			t.Fatalf("Sync (answer lost as %d) = %+v, %v (answers dropped %d)", mode, stats, err, lt.dropped.Load())
		}
		if got, _ := e.get(t, "f.txt"); got != body {
			t.Fatalf("f.txt = %q, want %q", got, body)
		}
		if stats, err := e.mounter.Sync(ctx, s); err != nil || stats.Uploaded != 0 || len(stats.Conflicts) != 0 {
			t.Fatalf("Sync after = %+v, %v", stats, err)
		}
	}
}

// scenarioSizeLimit: a mount larger than MaxBytes (or with more objects
// than MaxObjects) fails Start with ResourceExhausted naming the mount
// before anything is written.
func scenarioSizeLimit(t *testing.T, st *storage) {
	if err := errors.Join(st.putObject(ctxT(t), st.root+"a.txt", strings.Repeat("a", 60)),
		st.putObject(ctxT(t), st.root+"b.txt", strings.Repeat("b", 60)), st.putObject(ctxT(t), st.root+"c.txt", "c")); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*testConfig){
		"bytes":   func(c *testConfig) { c.MaxBytes = 100 },
		"objects": func(c *testConfig) { c.MaxObjects = 2 },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnvOn(t, st, mutate, nil)
			s := e.session(t, map[string]*manifest.Entry{
				"first.txt": {Type: manifest.TypeFile, Content: []byte("x")},
				"data":      e.entry(true),
			})
			err := s.Start(ctxT(t))
			if !errors.Is(err, errkind.ErrResourceExhausted) || !strings.Contains(err.Error(), "data") || !strings.Contains(err.Error(), "nothing was written") {
				t.Fatalf("Start = %v, want ResourceExhausted naming the mount", err)
			}
			ls, err := s.ListDir(ctxT(t), ".", compute.ListDirOptions{User: "root"})
			if err != nil || len(ls.Entries) != 0 {
				t.Fatalf("something was written: %+v %v", ls, err)
			}
		})
	}
}

// scenarioResumedElsewhere: a session started by one harness (Mounter A)
// and reattached by another process's client and Mounter (B) sharing the
// baseline store syncs from B: the agent's changes are uploaded, a remote
// change is still a conflict. A Mounter without the store refuses,
// uploading nothing. Close deletes the saved baselines.
func scenarioResumedElsewhere(t *testing.T, st *storage) {
	stateDir := testenv.SearchableTempDir(t)
	baselineDir := t.TempDir()
	newLocal := func(opts compute.ClientOptions) (*compute.Client, error) {
		return local.NewClient(local.Config{StateDir: stateDir, AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, opts)
	}
	withStore := func(c *testConfig) { c.Baselines = mount.DirBaselines(baselineDir) }
	e := newEnvOn(t, st, withStore, newLocal)
	e.putAll(t, map[string]string{"edit.txt": "before", "theirs.txt": "t1", "same.txt": "same"})
	sA := e.started(t, map[string]*manifest.Entry{"w": e.entry(false)})
	ctx := ctxT(t)
	state, err := sA.State()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(state)
	for _, sec := range e.hidden {
		if strings.Contains(string(js), sec) {
			t.Fatal("the state carries a credential")
		}
	}
	asRunAs(t, sA, "cd w && printf after > edit.txt && printf mine > theirs.txt && printf new > new.txt")
	e.put(t, "theirs.txt", "t2 remote")

	// Another process: its own Mounter and client over the same provider
	// state, resuming from the saved session state.
	resume := func(cfg func(*testConfig)) (*mount.Mounter, *compute.Session) {
		m, err := mount.New(st.mountConfig(t, cfg))
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
	if got, _ := e.get(t, "edit.txt"); got != "before" {
		t.Fatalf("edit.txt = %q after a refused sync", got)
	}
	mB, sB := resume(withStore)
	stats, err := mB.Sync(ctx, sB)
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/theirs.txt]" || stats.Uploaded != 2 || stats.Unchanged != 1 {
		t.Fatalf("Sync from the other process = %+v, %v", stats, err)
	}
	wantObjects(t, e, map[string]string{"edit.txt": "after", "new.txt": "new", "theirs.txt": "t2 remote", "same.txt": "same"})
	// A's Mounter still works from its own memory; then Close drops the
	// saved baselines.
	if err := sA.Close(ctx); !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("Close = %v, want the standing conflict", err)
	}
	if left, _ := os.ReadDir(baselineDir); len(left) != 0 {
		t.Fatalf("baselines left after Close: %v", left)
	}
}

// assertBulk: the mount "bulk" of a session holds n files (name(i) holds
// "object i"); a change to one of them syncs only that one.
func assertBulk(t *testing.T, e *env, s *compute.Session, n int, name func(i int) string) {
	t.Helper()
	out, _ := sh(t, s, "", "find bulk -type f | wc -l; cat bulk/"+name(n-3)+" bulk/"+name(0))
	if want := fmt.Sprintf("%d\nobject %d\nobject 0\n", n, n-3); out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	asRunAs(t, s, "printf changed > bulk/"+name(123))
	stats, err := e.mounter.Sync(ctxT(t), s)
	if err != nil || stats.Uploaded != 1 || stats.Unchanged != n-1 {
		t.Fatalf("Sync = %+v, %v", stats, err)
	}
	if got, _ := e.get(t, name(123)); got != "changed" {
		t.Fatalf("%s = %q", name(123), got)
	}
}
