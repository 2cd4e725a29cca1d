package mount_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/azureserver"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

const (
	azAccount   = "bulkheadtest"
	azContainer = "data"
)

// azEnv is an in-test Azure Blob server, a Mounter holding its
// credentials as secrets, and a local client.
type azEnv struct {
	srv     *azureserver.Server
	mounter *mount.Mounter
	client  *compute.Client
	store   snapshot.Store
	secrets map[string]string
}

func newAzureMounter(t *testing.T, srv *azureserver.Server, secrets map[string]string, mutate func(*mount.Config)) *mount.Mounter {
	t.Helper()
	cfg := mount.Config{
		Secrets: manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
			v, ok := secrets[name]
			if !ok {
				return "", fmt.Errorf("no secret %s", name)
			}
			return v, nil
		}),
		MaxAttempts: 2,
		HTTPClient:  srv.Client(),
		Log:         zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := mount.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newAzEnv(t *testing.T, mutate func(*mount.Config)) *azEnv {
	t.Helper()
	srv := azureserver.Start(t, azAccount, azContainer, false)
	e := &azEnv{srv: srv, secrets: map[string]string{"AZ_KEY": srv.KeyB64, "AZ_SAS": srv.SAS}}
	e.mounter = newAzureMounter(t, srv, e.secrets, mutate)
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e.store = store
	c, err := local.NewClient(local.Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone},
		compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
			Materializer: materializer.Options{Mounts: e.mounter}, PreStopHooks: []compute.PreStopHook{e.mounter.PreStop}})
	if err != nil {
		t.Fatal(err)
	}
	e.client = c
	return e
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

func (e *azEnv) session(t *testing.T, entries map[string]*manifest.Entry) *compute.Session {
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

// TestAzureReadOnlyMount: the container's blobs under the prefix land with
// exact bytes, owned by root and not writable by run_as; every request
// passed the server's own Shared Key check; neither the account key nor
// the SAS token is anywhere in the sandbox or the state; the mount is not
// in the snapshot.
func TestAzureReadOnlyMount(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newAzEnv(t, nil)
	binary := string([]byte{0, 1, 2, 0xff, '\n', 'x'})
	e.srv.Put(azContainer, "team/data/readme.md", "# hello\n")
	e.srv.Put(azContainer, "team/data/sub/deep/blob & name.bin", binary)
	e.srv.Put(azContainer, "team/other.txt", "outside the prefix")
	s := e.session(t, map[string]*manifest.Entry{
		"notes.txt": {Type: manifest.TypeFile, Content: []byte("mine")},
		"data":      azureEntry(e.srv, true, nil),
	})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, s, "data/readme.md"); got != "# hello\n" {
		t.Fatalf("readme.md = %q", got)
	}
	if got := readFile(t, s, "data/sub/deep/blob & name.bin"); got != binary {
		t.Fatalf("blob.bin = %q", got)
	}
	out, _ := sh(t, s, "", "cd data && stat -c '%n %U %a' . readme.md sub 'sub/deep/blob & name.bin'; ls -R")
	if want := ". root 555\nreadme.md root 444\nsub root 555\nsub/deep/blob & name.bin root 444"; !strings.Contains(out, want) || strings.Contains(out, "other.txt") {
		t.Fatalf("mount tree:\n%s\nwant:\n%s", out, want)
	}
	runAs := s.Manifest().RunAs
	for _, cmd := range []string{"echo x >> data/readme.md", "echo x > data/new.txt", "rm -f data/readme.md"} {
		if out, code := sh(t, s, runAs, cmd); code == 0 {
			t.Fatalf("run_as %s could %q in a read-only mount: %s", runAs, cmd, out)
		}
	}
	verified, refused, _, _, _ := e.srv.Stats()
	if verified == 0 || refused != 0 {
		t.Fatalf("server: %d requests verified, %d refused", verified, refused)
	}
	assertNoAzureSecret(t, e.srv, s)
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(snapshotMembers(t, e.store, s.ID()), "\n")
	if !strings.Contains(joined, "notes.txt") || strings.Contains(joined, "data") {
		t.Fatalf("snapshot members:\n%s", joined)
	}
}

// assertNoAzureSecret: the account key and the SAS signature are not in
// any process's environment (run_as or root), the daemon's environment,
// the workspace, or the session's state (which keeps the secret names).
func assertNoAzureSecret(t *testing.T, srv *azureserver.Server, s *compute.Session) {
	t.Helper()
	secrets := []string{srv.KeyB64, srv.SASSig, srv.Bearer}
	for _, user := range []string{s.Manifest().RunAs, ""} {
		cmd := "env; cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'"
		for _, sec := range secrets {
			cmd += "; grep -r -F -l -- '" + sec + "' . 2>/dev/null"
		}
		out, _ := sh(t, s, user, cmd+"; true")
		for _, sec := range secrets {
			if strings.Contains(out, sec) {
				t.Fatalf("an Azure credential reached the sandbox (user %q):\n%s", user, out)
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
	for _, sec := range secrets {
		if bytes.Contains(js, []byte(sec)) {
			t.Fatalf("state carries an Azure credential: %s", js)
		}
	}
	if !bytes.Contains(js, []byte("AZ_")) {
		t.Fatalf("state lost the secret's name: %s", js)
	}
}

// TestAzureWritableMountSync: a writable mount (SAS token) is uploaded
// back at Close: changed and new files put, deleted files deleted,
// untouched (only touched) blobs not rewritten; no credential in the
// sandbox.
func TestAzureWritableMountSync(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newAzEnv(t, nil)
	for name, body := range map[string]string{"keep.txt": "keep", "edit.txt": "before", "gone.txt": "delete me", "dir/nested.txt": "nested"} {
		e.srv.Put(azContainer, "team/data/"+name, body)
	}
	_, keepTag, _ := e.srv.Get(azContainer, "team/data/keep.txt")
	s := e.session(t, map[string]*manifest.Entry{"out": azureEntry(e.srv, false, map[string]manifest.SecretRef{"sas_token": manifest.Secret("AZ_SAS")})})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "cd out && printf after > edit.txt && printf new > dir/new.txt && mkdir -p fresh && printf f > fresh/f.txt && rm gone.txt && touch keep.txt"); code != 0 {
		t.Fatalf("run_as could not write its writable mount: %s", out)
	}
	assertNoAzureSecret(t, e.srv, s)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"keep.txt": "keep", "edit.txt": "after", "dir/new.txt": "new", "fresh/f.txt": "f", "dir/nested.txt": "nested"} {
		if got, _, ok := e.srv.Get(azContainer, "team/data/"+name); !ok || got != want {
			t.Fatalf("%s = %q (present %v), want %q", name, got, ok, want)
		}
	}
	if _, _, ok := e.srv.Get(azContainer, "team/data/gone.txt"); ok {
		t.Fatal("gone.txt was deleted in the sandbox but not remotely")
	}
	if _, tag, _ := e.srv.Get(azContainer, "team/data/keep.txt"); tag != keepTag {
		t.Fatal("an unchanged (touched) file was uploaded again")
	}
	if _, refused, _, _, puts := e.srv.Stats(); refused != 0 || puts != 3 {
		t.Fatalf("server: %d refused, %d uploads (want 3)", refused, puts)
	}
}

// TestAzureWritableMountConflict: blobs changed remotely after the
// download are not overwritten (If-Match), a new blob created remotely is
// not overwritten (If-None-Match *), a deletion of a changed blob is a
// conflict (conditional delete); the rest is synced, and a second Sync
// keeps the conflicts.
func TestAzureWritableMountConflict(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newAzEnv(t, nil)
	e.srv.Put(azContainer, "team/data/shared.txt", "v1")
	e.srv.Put(azContainer, "team/data/other.txt", "o1")
	e.srv.Put(azContainer, "team/data/removed.txt", "r1")
	s := e.session(t, map[string]*manifest.Entry{"w": azureEntry(e.srv, false, nil)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.Put(azContainer, "team/data/shared.txt", "remote v2")
	e.srv.Put(azContainer, "team/data/removed.txt", "remote r2")
	e.srv.Put(azContainer, "team/data/born.txt", "remote born")
	if out, code := sh(t, s, s.Manifest().RunAs, "cd w && printf local > shared.txt && printf o2 > other.txt && rm removed.txt && printf mine > born.txt"); code != 0 {
		t.Fatal(out)
	}
	stats, err := e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("Sync = %v, want a conflict", err)
	}
	sort.Strings(stats.Conflicts)
	if fmt.Sprint(stats.Conflicts) != "[w/born.txt w/removed.txt w/shared.txt]" || stats.Uploaded != 1 {
		t.Fatalf("stats = %+v", stats)
	}
	for name, want := range map[string]string{"shared.txt": "remote v2", "removed.txt": "remote r2", "born.txt": "remote born", "other.txt": "o2"} {
		if got, _, _ := e.srv.Get(azContainer, "team/data/"+name); got != want {
			t.Fatalf("%s = %q, want %q", name, got, want)
		}
	}
	stats, err = e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) || stats.Uploaded != 0 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
	if got, _, _ := e.srv.Get(azContainer, "team/data/shared.txt"); got != "remote v2" {
		t.Fatalf("shared.txt overwritten: %q", got)
	}
}

// planAzure plans a mount of the server's container without a sandbox
// and reads every planned file through the plan (the downloads, ahead and
// bounded), returning path -> bytes.
func planAzure(t *testing.T, m *mount.Mounter, e *manifest.Entry) (map[string]string, error) {
	t.Helper()
	plan, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: e, Session: "s-" + t.Name()})
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	got := map[string]string{}
	for _, we := range plan.Entries {
		if we.GetSize() == 0 && !strings.Contains(we.GetPath(), ".") {
			continue // a directory
		}
		body, _, err := plan.Open(we.GetPath())
		if err != nil {
			return got, err
		}
		b, err := io.ReadAll(body)
		body.Close()
		if err != nil {
			return got, err
		}
		got[we.GetPath()] = string(b)
	}
	return got, nil
}

// TestAzureListingPagedAndDownloadsPinned: 50 blobs listed 7 a page (each
// page asked with the marker of the one before) all arrive, through
// bounded concurrent downloads; a blob replaced between the listing and
// its download is a retryable conflict, not bytes of another version.
func TestAzureListingPagedAndDownloadsPinned(t *testing.T) {
	srv := azureserver.Start(t, azAccount, azContainer, false)
	const n = 50
	for i := range n {
		srv.Put(azContainer, fmt.Sprintf("team/data/d%d/f%02d.txt", i%5, i), fmt.Sprintf("blob %d", i))
	}
	m := newAzureMounter(t, srv, map[string]string{"AZ_KEY": srv.KeyB64}, func(c *mount.Config) { c.PageSize = 7; c.Concurrency = 3 })
	got, err := planAzure(t, m, azureEntry(srv, true, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n || got["data/d3/f48.txt"] != "blob 48" || got["data/d0/f00.txt"] != "blob 0" {
		t.Fatalf("got %d files: %v", len(got), got)
	}
	_, refused, markers, gets, _ := srv.Stats()
	if refused != 0 || len(markers) != (n+6)/7 || markers[0] != "" || markers[1] == "" || gets != n {
		t.Fatalf("refused %d, listings with markers %q (want %d pages), downloads %d", refused, markers, (n+6)/7, gets)
	}

	// Replaced after the listing: the download is If-Match the listed ETag.
	plan, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: azureEntry(srv, true, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	srv.Put(azContainer, "team/data/d0/f00.txt", "replaced, longer than before")
	srv.Put(azContainer, "team/data/d0/f05.txt", "same len")
	var conflicts int
	for _, p := range []string{"data/d0/f00.txt", "data/d0/f05.txt"} {
		body, _, err := plan.Open(p)
		if err == nil {
			b, _ := io.ReadAll(body)
			body.Close()
			t.Fatalf("%s: read %q, want a conflict", p, b)
		}
		if errors.Is(err, errkind.ErrConflict) && errkind.Retryable(err) {
			conflicts++
		}
	}
	if conflicts != 2 {
		t.Fatal("a replaced blob was not a retryable conflict")
	}
}

// TestAzureCredentialsRefused: a wrong account key or SAS token fails with
// Unauthenticated and no secret in the text; a key that is not base64, a
// mount naming no credentials without Config.AzureCredential, and a
// missing container fail clearly.
func TestAzureCredentialsRefused(t *testing.T) {
	srv := azureserver.Start(t, azAccount, azContainer, false)
	srv.Put(azContainer, "team/data/a.txt", "a")
	const wrongKey = "d3Jvbmcta2V5LXRoYXQtaXMtYmFzZTY0LWFuZC1sb25nLWVub3VnaA=="
	const wrongSAS = "sv=2022-11-02&sp=rl&sig=d3Jvbmctc2lnbmF0dXJlLXZhbHVl"
	secrets := map[string]string{"AZ_KEY": wrongKey, "AZ_SAS": wrongSAS, "AZ_BAD": "not base64!!"}
	m := newAzureMounter(t, srv, secrets, func(c *mount.Config) { c.MaxAttempts = 1 })
	for name, creds := range map[string]map[string]manifest.SecretRef{
		"key": {"account_key": manifest.Secret("AZ_KEY")},
		"sas": {"sas_token": manifest.Secret("AZ_SAS")},
	} {
		_, err := planAzure(t, m, azureEntry(srv, true, creds))
		if !errors.Is(err, errkind.ErrUnauthenticated) || strings.Contains(err.Error(), wrongKey) || strings.Contains(err.Error(), "d3Jvbmctc2lnbmF0dXJlLXZhbHVl") ||
			!strings.Contains(err.Error(), "AuthenticationFailed") || errkind.Retryable(err) {
			t.Fatalf("%s: PlanMount = %v, want Unauthenticated without the secret", name, err)
		}
	}
	_, err := planAzure(t, m, azureEntry(srv, true, map[string]manifest.SecretRef{"account_key": manifest.Secret("AZ_BAD")}))
	if !errors.Is(err, errkind.ErrInvalidArgument) || strings.Contains(err.Error(), "not base64!!") || !strings.Contains(err.Error(), "AZ_BAD") {
		t.Fatalf("a key that is not base64: %v", err)
	}
	_, err = planAzure(t, m, azureEntry(srv, true, map[string]manifest.SecretRef{}))
	if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "AzureCredential") {
		t.Fatalf("no credentials: %v", err)
	}
	good := newAzureMounter(t, srv, map[string]string{"AZ_KEY": srv.KeyB64}, nil)
	e := azureEntry(srv, true, nil)
	e.Mount.Container = "missing"
	if _, err := planAzure(t, good, e); !errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "missing does not exist") {
		t.Fatalf("missing container: %v", err)
	}
}

// staticToken is an azcore.TokenCredential handing out one token.
type staticToken struct {
	token  string
	scopes atomic.Value
}

func (s *staticToken) GetToken(_ context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	s.scopes.Store(strings.Join(o.Scopes, " "))
	return azcore.AccessToken{Token: s.token, ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// TestAzureDefaultCredential: a mount naming no credentials is authorized
// by Config.AzureCredential's bearer tokens (over TLS, for the storage
// scope).
func TestAzureDefaultCredential(t *testing.T) {
	srv := azureserver.Start(t, azAccount, azContainer, true)
	srv.Put(azContainer, "team/data/a.txt", "through a token")
	tok := &staticToken{token: srv.Bearer}
	m := newAzureMounter(t, srv, nil, func(c *mount.Config) { c.AzureCredential = tok })
	got, err := planAzure(t, m, azureEntry(srv, true, map[string]manifest.SecretRef{}))
	if err != nil || got["data/a.txt"] != "through a token" {
		t.Fatalf("PlanMount = %v, %v", got, err)
	}
	if sc, _ := tok.scopes.Load().(string); !strings.Contains(sc, "storage.azure.com") {
		t.Fatalf("token scopes = %q", sc)
	}
}

// TestAzureLimitsAndRetries: MaxBytes and MaxObjects refuse an oversized
// container before any download; answers of 503 are retried up to
// MaxAttempts, then reported as retryable Unavailable.
func TestAzureLimitsAndRetries(t *testing.T) {
	srv := azureserver.Start(t, azAccount, azContainer, false)
	secrets := map[string]string{"AZ_KEY": srv.KeyB64}
	srv.Put(azContainer, "team/data/a.txt", strings.Repeat("a", 60))
	srv.Put(azContainer, "team/data/b.txt", strings.Repeat("b", 60))
	srv.Put(azContainer, "team/data/c.txt", "c")
	for name, mutate := range map[string]func(*mount.Config){
		"bytes":   func(c *mount.Config) { c.MaxBytes = 100 },
		"objects": func(c *mount.Config) { c.MaxObjects = 2 },
	} {
		m := newAzureMounter(t, srv, secrets, mutate)
		if _, err := planAzure(t, m, azureEntry(srv, true, nil)); !errors.Is(err, errkind.ErrResourceExhausted) || !strings.Contains(err.Error(), "nothing was written") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, _, _, gets, _ := srv.Stats(); gets != 0 {
		t.Fatalf("%d downloads before the limit refused the mount", gets)
	}
	var failures atomic.Int32
	failures.Store(2)
	srv.SetFault(func(r *http.Request) int {
		if r.URL.Query().Get("comp") == "list" && failures.Add(-1) >= 0 {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	got, err := planAzure(t, newAzureMounter(t, srv, secrets, func(c *mount.Config) { c.MaxAttempts = 3 }), azureEntry(srv, true, nil))
	if err != nil || len(got) != 3 {
		t.Fatalf("after two 503s: %v, %v", got, err)
	}
	failures.Store(100)
	_, err = planAzure(t, newAzureMounter(t, srv, secrets, func(c *mount.Config) { c.MaxAttempts = 2 }), azureEntry(srv, true, nil))
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
		t.Fatalf("a server answering 503: %v", err)
	}
}

// loseAnswer drops the answer of the first successful Put Blob of a key
// (the blob is written, the client sees a broken connection), as when a
// connection breaks after the server committed.
type loseAnswer struct {
	base http.RoundTripper
	key  string
	done atomic.Bool
}

func (l *loseAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err == nil && r.Method == http.MethodPut && strings.HasSuffix(r.URL.EscapedPath(), l.key) && resp.StatusCode == http.StatusCreated && l.done.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errors.New("connection reset by peer (injected after the server wrote the blob)")
	}
	return resp, err
}

// TestAzureLostUploadAnswer: an upload whose answer was lost is retried;
// the retry's failed condition (the blob holds our bytes already) is
// recognized by the blob's Content-MD5, not reported as a conflict.
func TestAzureLostUploadAnswer(t *testing.T) {
	testenv.Require(t, testenv.Root)
	var lose *loseAnswer
	e := newAzEnv(t, func(c *mount.Config) {
		lose = &loseAnswer{base: c.HTTPClient.Transport, key: "edit.txt"}
		if lose.base == nil {
			lose.base = http.DefaultTransport
		}
		c.HTTPClient = &http.Client{Transport: lose}
		c.MaxAttempts = 3
	})
	e.srv.Put(azContainer, "team/data/edit.txt", "before")
	s := e.session(t, map[string]*manifest.Entry{"w": azureEntry(e.srv, false, nil)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "printf after > w/edit.txt"); code != 0 {
		t.Fatal(out)
	}
	stats, err := e.mounter.Sync(ctx, s)
	if err != nil || stats.Uploaded != 1 || !lose.done.Load() {
		t.Fatalf("Sync = %+v, %v (answer lost: %v)", stats, err, lose.done.Load())
	}
	if got, _, _ := e.srv.Get(azContainer, "team/data/edit.txt"); got != "after" {
		t.Fatalf("edit.txt = %q", got)
	}
	// The baseline is the blob's current ETag: a second change syncs
	// without a conflict.
	if out, code := sh(t, s, s.Manifest().RunAs, "printf again > w/edit.txt"); code != 0 {
		t.Fatal(out)
	}
	if stats, err := e.mounter.Sync(ctx, s); err != nil || stats.Uploaded != 1 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
}

// TestAzureWritableMountConflictRace: remote changes landing between
// Sync's ETag check (Get Blob Properties) and its upload or delete are
// still caught by the conditional Put Blob and Delete Blob, not
// overwritten or deleted.
func TestAzureWritableMountConflictRace(t *testing.T) {
	testenv.Require(t, testenv.Root)
	var e *azEnv
	putRace := &raceTransport{key: "/team/data/race.txt"}
	putRace.write = func() { e.srv.Put(azContainer, "team/data/race.txt", "remote wins") }
	delRace := &raceTransport{base: putRace, key: "/team/data/doomed.txt"}
	delRace.write = func() { e.srv.Put(azContainer, "team/data/doomed.txt", "remote keeps it") }
	e = newAzEnv(t, func(c *mount.Config) {
		putRace.base = c.HTTPClient.Transport
		if putRace.base == nil {
			putRace.base = http.DefaultTransport
		}
		c.HTTPClient = &http.Client{Transport: delRace}
	})
	e.srv.Put(azContainer, "team/data/race.txt", "v1")
	e.srv.Put(azContainer, "team/data/doomed.txt", "d1")
	s := e.session(t, map[string]*manifest.Entry{"w": azureEntry(e.srv, false, nil)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "printf local > w/race.txt && rm w/doomed.txt"); code != 0 {
		t.Fatal(out)
	}
	stats, err := e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/doomed.txt w/race.txt]" || !putRace.fired.Load() || !delRace.fired.Load() {
		t.Fatalf("Sync = %+v, %v (races fired %v %v)", stats, err, putRace.fired.Load(), delRace.fired.Load())
	}
	if got, _, _ := e.srv.Get(azContainer, "team/data/race.txt"); got != "remote wins" {
		t.Fatalf("race.txt = %q: overwritten", got)
	}
	if got, _, ok := e.srv.Get(azContainer, "team/data/doomed.txt"); !ok || got != "remote keeps it" {
		t.Fatalf("doomed.txt = %q (present %v): deleted", got, ok)
	}
}
