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
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gcsserver"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

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
	srv := gcsserver.StartSeeded(t, seed)
	e := newEnvOn(t, gcsStorage(srv, "seeded"), func(c *testConfig) {
		c.PageSize, c.Concurrency = 500, conc
		c.HTTPClient = &http.Client{Transport: ct}
	}, nil)
	t.Logf("filled the bucket in %v", time.Since(phase).Round(time.Millisecond))
	phase = time.Now()
	s := e.started(t, map[string]*manifest.Entry{"bulk": e.entry(false)})
	t.Logf("mounted in %v", time.Since(phase).Round(time.Millisecond))
	if l := ct.lists.Load(); l < n/500 {
		t.Fatalf("%d listing requests for %d objects at 500 a page: not paged", l, n)
	}
	if p := ct.peak.Load(); p > conc || p == 0 {
		t.Fatalf("%d downloads at once, the limit is %d", p, conc)
	}
	phase = time.Now()
	assertBulk(t, e, s, n, func(i int) string { return fmt.Sprintf("d%02d/f%05d.txt", i%100, i) })
	t.Logf("checked and synced in %v", time.Since(phase).Round(time.Millisecond))
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
	m, err := mount.New(withAll(mount.Config{MaxAttempts: 1, HTTPClient: &http.Client{Transport: ar},
		Secrets: manifest.SecretResolverFunc(func(context.Context, string) (string, error) { return string(keyJSON), nil })}))
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
	if len(plan.Entries) != 2 || plan.Entries[1].Path != "data/a.txt" {
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
	m2, _ := mount.New(withAll(mount.Config{MaxAttempts: 1,
		Secrets: manifest.SecretResolverFunc(func(context.Context, string) (string, error) { return string(keyJSON), nil })}))
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

// TestGCSServerDown: a server that is down is Unavailable and
// retryable, with no token in the error. (The limits are TestMounts's
// size_limit.)
func TestGCSServerDown(t *testing.T) {
	srv := gcsserver.Start(t)
	bucket := srv.Bucket(t)
	entry := &manifest.Entry{Type: manifest.TypeGCSMount, Mount: &manifest.Mount{Bucket: bucket, Prefix: "p", Endpoint: srv.Endpoint,
		Credentials: map[string]manifest.SecretRef{"access_token": manifest.Secret("T")}}}
	secrets := manifest.SecretResolverFunc(func(context.Context, string) (string, error) { return gcsTestToken, nil })
	srv.Stop()
	m, _ := mount.New(withAll(mount.Config{Secrets: secrets, MaxAttempts: 2}))
	_, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: entry})
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) || strings.Contains(err.Error(), gcsTestToken) {
		t.Fatalf("server down: %v", err)
	}
}
