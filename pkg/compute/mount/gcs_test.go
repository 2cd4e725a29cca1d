package mount_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/gcsserver"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// gcsTestToken is the bearer token the mounts present (fake-gcs-server
// takes any); it stands for a credential that must not reach a sandbox.
const gcsTestToken = "ya29.gcs-mount-test-token-4f1c9a"

// gcsEnv is a fake-gcs-server with a bucket and a local client whose
// Mounter holds the token as a secret.
type gcsEnv struct {
	srv     *gcsserver.Server
	bucket  string
	mounter *mount.Mounter
	client  *compute.Client
	// newClient, when set before newGCSEnvOn, makes the client on another
	// provider than local.
	newClient func(compute.ClientOptions) (*compute.Client, error)
}

func newGCSEnv(t *testing.T, mutate func(*mount.Config)) *gcsEnv {
	t.Helper()
	srv := gcsserver.Start(t)
	return newGCSEnvOn(t, srv, srv.Bucket(t), mutate)
}

// newGCSEnvOn is newGCSEnv on a running server and an existing bucket.
func newGCSEnvOn(t *testing.T, srv *gcsserver.Server, bucket string, mutate func(*mount.Config)) *gcsEnv {
	t.Helper()
	return newGCSEnvWith(t, &gcsEnv{srv: srv, bucket: bucket}, mutate)
}

// newGCSEnvWith completes e (server, bucket and optionally newClient set).
func newGCSEnvWith(t *testing.T, e *gcsEnv, mutate func(*mount.Config)) *gcsEnv {
	t.Helper()
	cfg := mount.Config{
		Secrets: manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
			if name == "GCS_TOKEN" {
				return gcsTestToken, nil
			}
			return "", fmt.Errorf("no secret %s", name)
		}),
		MaxAttempts: 2,
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
	opts := compute.ClientOptions{Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Materializer: materializer.Options{Mounts: m}, PreStopHooks: []compute.PreStopHook{m.PreStop}}
	newClient := e.newClient
	if newClient == nil {
		newClient = func(opts compute.ClientOptions) (*compute.Client, error) {
			return local.NewClient(local.Config{StateDir: testenv.SearchableTempDir(t), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, opts)
		}
	}
	c, err := newClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.client = c
	return e
}

func (e *gcsEnv) put(t *testing.T, key, body string) string {
	t.Helper()
	gen, err := e.srv.Put(ctxT(t), e.bucket, key, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

func (e *gcsEnv) get(t *testing.T, key string) (string, bool) {
	t.Helper()
	b, ok, err := e.srv.Get(ctxT(t), e.bucket, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), ok
}

func (e *gcsEnv) mountEntry(readOnly bool) *manifest.Entry {
	return &manifest.Entry{Type: manifest.TypeGCSMount, Mount: &manifest.Mount{Bucket: e.bucket, Prefix: "team/data", Endpoint: e.srv.Endpoint,
		ReadOnly: &readOnly, Credentials: map[string]manifest.SecretRef{"access_token": manifest.Secret("GCS_TOKEN")}}}
}

func (e *gcsEnv) session(t *testing.T, entries map[string]*manifest.Entry) *compute.Session {
	t.Helper()
	s, err := e.client.Create(ctxT(t), compute.CreateOptions{Manifest: &manifest.Manifest{Entries: entries}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctxT(t))
		_ = s.Close(ctx)
		_ = e.client.Delete(ctx, s)
	})
	return s
}

// TestGCSReadOnlyMount: a gcs_mount's objects under the prefix land with
// exact bytes (a key with a space and a non-ASCII name too), belong to
// root and are not writable by run_as; the token is neither in the sandbox
// nor in the state.
func TestGCSReadOnlyMount(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newGCSEnv(t, nil)
	binary := string([]byte{0, 1, 2, 0xff, '\n', 'x'})
	e.put(t, "team/data/readme.md", "# hello\n")
	e.put(t, "team/data/sub/deep/blob.bin", binary)
	e.put(t, "team/data/with space/é.txt", "unicode")
	e.put(t, "team/other.txt", "outside the prefix")
	s := e.session(t, map[string]*manifest.Entry{"data": e.mountEntry(true)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"data/readme.md": "# hello\n", "data/sub/deep/blob.bin": binary, "data/with space/é.txt": "unicode"} {
		if got := readFile(t, s, p); got != want {
			t.Fatalf("%s = %q, want %q", p, got, want)
		}
	}
	out, _ := sh(t, s, "", "cd data && stat -c '%n %U %a' . readme.md sub sub/deep/blob.bin")
	if want := ". root 555\nreadme.md root 444\nsub root 555\nsub/deep/blob.bin root 444"; !strings.Contains(out, want) {
		t.Fatalf("mount tree:\n%s\nwant:\n%s", out, want)
	}
	runAs := s.Manifest().RunAs
	for _, cmd := range []string{"echo x >> data/readme.md", "echo x > data/new.txt", "rm -f data/readme.md"} {
		if out, code := sh(t, s, runAs, cmd); code == 0 {
			t.Fatalf("run_as %s could %q in a read-only mount: %s", runAs, cmd, out)
		}
	}
	for _, user := range []string{runAs, ""} {
		if out, _ := sh(t, s, user, "env; cat /proc/$PPID/environ 2>/dev/null; grep -r -F -l -- '"+gcsTestToken+"' . ; true"); strings.Contains(out, gcsTestToken) {
			t.Fatalf("the token reached the sandbox (user %q):\n%s", user, out)
		}
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(st)
	if strings.Contains(string(js), gcsTestToken) || !strings.Contains(string(js), "GCS_TOKEN") {
		t.Fatalf("state: %s", js)
	}
}

// TestGCSWritableMountSyncedAtClose: changed and new files are uploaded
// when the session closes, deleted ones deleted, untouched ones not
// rewritten (same generation).
func TestGCSWritableMountSyncedAtClose(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newGCSEnv(t, nil)
	keepGen := e.put(t, "team/data/keep.txt", "keep")
	e.put(t, "team/data/edit.txt", "before")
	e.put(t, "team/data/gone.txt", "delete me")
	e.put(t, "team/data/dir/nested.txt", "nested")
	s := e.session(t, map[string]*manifest.Entry{"out": e.mountEntry(false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "cd out && printf after > edit.txt && printf new > dir/new.txt && mkdir -p fresh && printf f > fresh/f.txt && rm gone.txt && touch keep.txt"); code != 0 {
		t.Fatalf("run_as could not write its writable mount: %s", out)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
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
	if gen, err := e.srv.Generation(ctx, e.bucket, "team/data/keep.txt"); err != nil || gen != keepGen {
		t.Fatalf("keep.txt generation %s -> %s (%v): an unchanged file was uploaded again", keepGen, gen, err)
	}
}

// TestGCSWritableMountConflict: objects changed (or created, or changed
// then deleted locally) behind the session's back are not overwritten;
// the error is a conflict naming each path; the agent's versions stay in
// the sandbox (nothing lost); the other changes are synced.
func TestGCSWritableMountConflict(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newGCSEnv(t, nil)
	e.put(t, "team/data/shared.txt", "v1")
	e.put(t, "team/data/other.txt", "o1")
	e.put(t, "team/data/removed.txt", "r1")
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.put(t, "team/data/shared.txt", "remote v2")
	e.put(t, "team/data/removed.txt", "remote r2")
	e.put(t, "team/data/born.txt", "remote born")
	if out, code := sh(t, s, s.Manifest().RunAs, "cd w && printf local > shared.txt && printf o2 > other.txt && rm removed.txt && printf mine > born.txt"); code != 0 {
		t.Fatal(out)
	}
	stats, err := e.mounter.Sync(ctx, s)
	if !errors.Is(err, errkind.ErrConflict) {
		t.Fatalf("Sync = %v, want a conflict", err)
	}
	sort.Strings(stats.Conflicts)
	if fmt.Sprint(stats.Conflicts) != "[w/born.txt w/removed.txt w/shared.txt]" || stats.Uploaded != 1 {
		t.Fatalf("stats = %+v (%v)", stats, err)
	}
	for _, p := range stats.Conflicts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("conflict error does not name %s: %v", p, err)
		}
	}
	for key, want := range map[string]string{"team/data/shared.txt": "remote v2", "team/data/removed.txt": "remote r2",
		"team/data/born.txt": "remote born", "team/data/other.txt": "o2"} {
		if got, _ := e.get(t, key); got != want {
			t.Fatalf("%s = %q, want %q", key, got, want)
		}
	}
	if got := readFile(t, s, "w/shared.txt") + readFile(t, s, "w/born.txt"); got != "localmine" {
		t.Fatalf("the sandbox's versions were lost: %q", got)
	}
	if stats, err := e.mounter.Sync(ctx, s); !errors.Is(err, errkind.ErrConflict) || stats.Uploaded != 0 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
}

// gcsRaceTransport changes an object right after the harness looked up
// its generation: the window between the check and the upload.
type gcsRaceTransport struct {
	key   string // escaped object name
	fired atomic.Bool
	write func()
}

func (rt *gcsRaceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && req.Method == http.MethodGet && strings.HasSuffix(req.URL.EscapedPath(), "/o/"+rt.key) &&
		req.URL.Query().Get("alt") == "" && rt.fired.CompareAndSwap(false, true) {
		rt.write()
	}
	return resp, err
}

// TestGCSWritableMountConflictRace: a remote write landing between Sync's
// generation check and its upload is caught by ifGenerationMatch.
func TestGCSWritableMountConflictRace(t *testing.T) {
	testenv.Require(t, testenv.Root)
	var e *gcsEnv
	var raceErr error
	rt := &gcsRaceTransport{key: url.PathEscape("team/data/race.txt")}
	rt.write = func() {
		_, raceErr = e.srv.Put(context.Background(), e.bucket, "team/data/race.txt", []byte("remote wins"))
	}
	e = newGCSEnv(t, func(c *mount.Config) { c.HTTPClient = &http.Client{Transport: rt} })
	e.put(t, "team/data/race.txt", "v1")
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(false)})
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

// countingTransport counts listing requests and the most media downloads
// in flight at once.
type countingTransport struct {
	lists          atomic.Int32
	inFlight, peak atomic.Int32
}

func (ct *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	media := req.URL.Query().Get("alt") == "media"
	if strings.HasSuffix(req.URL.Path, "/o") && req.Method == http.MethodGet {
		ct.lists.Add(1)
	}
	if media {
		n := ct.inFlight.Add(1)
		for p := ct.peak.Load(); n > p && !ct.peak.CompareAndSwap(p, n); p = ct.peak.Load() {
		}
		defer ct.inFlight.Add(-1)
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestGCSMountManyObjects: a bucket of 10,000 objects (loaded by the
// server at start) is listed 500 keys a page, its objects fetched at most
// Concurrency at a time (the harness holds at most 2*Concurrency small
// objects in memory), all arrive whole, and a change to one of them syncs
// only that one.
func TestGCSMountManyObjects(t *testing.T) {
	testenv.Require(t, testenv.Root)
	const n = 10_000
	phase := time.Now()
	seed := gcsserver.MemoryDir(t)
	for i := range n {
		p := filepath.Join(seed, "seeded", "team", "data", fmt.Sprintf("d%02d", i%100), fmt.Sprintf("f%05d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, fmt.Appendf(nil, "object %d\n", i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ct := &countingTransport{}
	const conc = 4
	e := newGCSEnvOn(t, gcsserver.StartSeeded(t, seed), "seeded", func(c *mount.Config) {
		c.PageSize, c.Concurrency = 500, conc
		c.HTTPClient = &http.Client{Transport: ct}
	})
	ctx := ctxT(t)
	t.Logf("filled the bucket in %v", time.Since(phase).Round(time.Millisecond))
	phase = time.Now()
	s := e.session(t, map[string]*manifest.Entry{"bulk": e.mountEntry(false)})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("mounted in %v", time.Since(phase).Round(time.Millisecond))
	out, _ := sh(t, s, "", "find bulk -type f | wc -l; cat bulk/d97/f09997.txt bulk/d00/f00000.txt")
	if want := "10000\nobject 9997\nobject 0\n"; out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	if l := ct.lists.Load(); l < n/500 {
		t.Fatalf("%d listing requests for %d objects at 500 a page: not paged", l, n)
	}
	if p := ct.peak.Load(); p > conc || p == 0 {
		t.Fatalf("%d downloads at once, the limit is %d", p, conc)
	}
	if _, code := sh(t, s, s.Manifest().RunAs, "printf changed > bulk/d23/f00123.txt"); code != 0 {
		t.Fatal("write failed")
	}
	phase = time.Now()
	stats, err := e.mounter.Sync(ctx, s)
	t.Logf("synced in %v", time.Since(phase).Round(time.Millisecond))
	if err != nil || stats.Uploaded != 1 || stats.Unchanged != n-1 {
		t.Fatalf("Sync = %+v, %v", stats, err)
	}
	if got, _ := e.get(t, "team/data/d23/f00123.txt"); got != "changed" {
		t.Fatalf("f00123 = %q", got)
	}
}

// tokenServer is an OAuth token endpoint that checks the JWT bearer
// assertion of a service account (RS256 with the account's public key,
// its issuer, audience and scope) before it hands out a token.
type tokenServer struct {
	*httptest.Server
	refuse bool
	calls  atomic.Int32
}

func newTokenServer(t *testing.T, pub *rsa.PublicKey, email, token string) *tokenServer {
	ts := &tokenServer{}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.calls.Add(1)
		if err := r.ParseForm(); err != nil || r.Form.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" || ts.refuse {
			http.Error(w, `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`, http.StatusBadRequest)
			return
		}
		parts := strings.Split(r.Form.Get("assertion"), ".")
		if len(parts) != 3 {
			http.Error(w, "bad assertion", http.StatusBadRequest)
			return
		}
		sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
		sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
		if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
		var claims struct {
			Iss, Aud, Scope string
		}
		_ = json.Unmarshal(raw, &claims)
		if claims.Iss != email || claims.Aud != ts.URL+"/token" || claims.Scope != "https://www.googleapis.com/auth/devstorage.read_only" {
			http.Error(w, "bad claims "+string(raw), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":3600}`, token)
	}))
	t.Cleanup(ts.Close)
	return ts
}

// authRecorder records the Authorization headers sent to the storage.
type authRecorder struct {
	mu   sync.Mutex
	seen map[string]int
}

func (ar *authRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.Contains(req.URL.Path, "/storage/v1/") {
		ar.mu.Lock()
		ar.seen[req.Header.Get("Authorization")]++
		ar.mu.Unlock()
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestGCSServiceAccountKey: a service account's JSON key is exchanged for
// an access token (a JWT signed with the key, checked by a token
// endpoint), and only that token goes to the storage; a key the endpoint
// refuses is Unauthenticated, with nothing of the key in the error; a
// missing bucket is NotFound; HMAC keys are refused.
func TestGCSServiceAccountKey(t *testing.T) {
	srv := gcsserver.Start(t)
	bucket := srv.Bucket(t)
	if _, err := srv.Put(ctxT(t), bucket, "p/a.txt", []byte("a")); err != nil {
		t.Fatal(err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: must(x509.MarshalPKCS8PrivateKey(key))}))
	const email = "mounter@project.iam.gserviceaccount.com"
	const token = "ya29.exchanged-token-77"
	ts := newTokenServer(t, &key.PublicKey, email, token)
	keyJSON, _ := json.Marshal(map[string]string{"type": "service_account", "client_email": email, "private_key": pemKey,
		"private_key_id": "kid1", "token_uri": ts.URL + "/token"})
	ar := &authRecorder{seen: map[string]int{}}
	m, err := mount.New(mount.Config{MaxAttempts: 1, HTTPClient: &http.Client{Transport: ar},
		Secrets: manifest.SecretResolverFunc(func(context.Context, string) (string, error) { return string(keyJSON), nil })})
	if err != nil {
		t.Fatal(err)
	}
	entry := func(b string) *manifest.Entry {
		return &manifest.Entry{Type: manifest.TypeGCSMount, Mount: &manifest.Mount{Bucket: b, Prefix: "p", Endpoint: srv.Endpoint,
			Credentials: map[string]manifest.SecretRef{"service_account_key": manifest.Secret("SA_KEY")}}}
	}
	plan, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: entry(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	plan.Close()
	if len(plan.Entries) != 2 || plan.Entries[1].GetPath() != "data/a.txt" {
		t.Fatalf("plan: %v", plan.Entries)
	}
	if len(ar.seen) != 1 || ar.seen["Bearer "+token] == 0 || ts.calls.Load() != 1 {
		t.Fatalf("authorization sent: %v (token requests %d)", ar.seen, ts.calls.Load())
	}

	_, err = m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: entry("no-such-bucket")})
	if !errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "no-such-bucket") {
		t.Fatalf("missing bucket: %v", err)
	}

	ts.refuse = true
	m2, _ := mount.New(mount.Config{MaxAttempts: 1,
		Secrets: manifest.SecretResolverFunc(func(context.Context, string) (string, error) { return string(keyJSON), nil })})
	_, err = m2.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: entry(bucket)})
	if !errors.Is(err, errkind.ErrUnauthenticated) || strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), pemKey[40:80]) {
		t.Fatalf("refused key: %v", err)
	}

	hmac := entry(bucket)
	hmac.Mount.Credentials = map[string]manifest.SecretRef{"access_id": manifest.Secret("A"), "secret_access_key": manifest.Secret("S")}
	if _, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: hmac}); !errors.Is(err, errkind.ErrUnimplemented) {
		t.Fatalf("HMAC keys: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// lostAnswerTransport delivers the first upload to the server but tells
// the client it failed (a 503, as a proxy losing the answer would), so
// that the client retries an upload that already happened.
type lostAnswerTransport struct{ dropped atomic.Bool }

func (lt *lostAnswerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && strings.Contains(req.URL.Path, "/upload/") && lt.dropped.CompareAndSwap(false, true) {
		resp.Body.Close()
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Header: http.Header{},
			Body: http.NoBody, Request: req}, nil
	}
	return resp, err
}

// TestGCSUploadRetriedAfterLostAnswer: an upload whose answer was lost is
// retried; its precondition then fails against the object it wrote
// itself, which is recognised (same MD5) as uploaded, not a conflict.
func TestGCSUploadRetriedAfterLostAnswer(t *testing.T) {
	testenv.Require(t, testenv.Root)
	lt := &lostAnswerTransport{}
	e := newGCSEnv(t, func(c *mount.Config) { c.HTTPClient = &http.Client{Transport: lt}; c.MaxAttempts = 3 })
	e.put(t, "team/data/f.txt", "v1")
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "printf v2 > w/f.txt"); code != 0 {
		t.Fatal(out)
	}
	stats, err := e.mounter.Sync(ctx, s)
	if err != nil || stats.Uploaded != 1 || !lt.dropped.Load() {
		t.Fatalf("Sync = %+v, %v (answer dropped %v)", stats, err, lt.dropped.Load())
	}
	if got, _ := e.get(t, "team/data/f.txt"); got != "v2" {
		t.Fatalf("f.txt = %q", got)
	}
	// The baseline is the new generation: a second sync has nothing to do.
	if stats, err := e.mounter.Sync(ctx, s); err != nil || stats.Uploaded != 0 || len(stats.Conflicts) != 0 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
}

// TestGCSLimitsAndFaults: a prefix over MaxObjects or MaxBytes is
// ResourceExhausted before anything is read; a server that is down is
// Unavailable and retryable.
func TestGCSLimitsAndFaults(t *testing.T) {
	srv := gcsserver.Start(t)
	bucket := srv.Bucket(t)
	for _, k := range []string{"p/a.txt", "p/b.txt", "p/c.txt"} {
		if _, err := srv.Put(ctxT(t), bucket, k, []byte(strings.Repeat("x", 60))); err != nil {
			t.Fatal(err)
		}
	}
	entry := &manifest.Entry{Type: manifest.TypeGCSMount, Mount: &manifest.Mount{Bucket: bucket, Prefix: "p", Endpoint: srv.Endpoint,
		Credentials: map[string]manifest.SecretRef{"access_token": manifest.Secret("T")}}}
	secrets := manifest.SecretResolverFunc(func(context.Context, string) (string, error) { return gcsTestToken, nil })
	for name, cfg := range map[string]mount.Config{"objects": {MaxObjects: 2}, "bytes": {MaxBytes: 100}} {
		cfg.Secrets = secrets
		m, err := mount.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: entry}); !errors.Is(err, errkind.ErrResourceExhausted) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	srv.Stop()
	m, _ := mount.New(mount.Config{Secrets: secrets, MaxAttempts: 2})
	_, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: entry})
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) || strings.Contains(err.Error(), gcsTestToken) {
		t.Fatalf("server down: %v", err)
	}
}
