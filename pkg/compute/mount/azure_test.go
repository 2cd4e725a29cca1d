package mount_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/azureserver"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// newAzureMounter is a Mounter of the server's secrets (a test's own),
// for the plan-level tests.
func newAzureMounter(t *testing.T, srv *azureserver.Server, secrets map[string]string, mutate func(*testConfig)) *mount.Mounter {
	t.Helper()
	cfg := testConfig{Config: mount.Config{
		Secrets:     manifest.SecretMap(secrets),
		MaxAttempts: 2,
		HTTPClient:  srv.Client(),
		Log:         zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	}}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := mount.New(cfg.build())
	if err != nil {
		t.Fatal(err)
	}
	return m
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
		if we.Size == 0 && !strings.Contains(we.Path, ".") {
			continue // a directory
		}
		body, _, err := plan.Open(we.Path)
		if err != nil {
			return got, err
		}
		b, err := io.ReadAll(body)
		body.Close()
		if err != nil {
			return got, err
		}
		got[we.Path] = string(b)
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
	m := newAzureMounter(t, srv, map[string]string{"AZ_KEY": srv.KeyB64}, func(c *testConfig) { c.PageSize = 7; c.Concurrency = 3 })
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
// mount naming no credentials without azuremount.Config.Credential, and a
// missing container fail clearly.
func TestAzureCredentialsRefused(t *testing.T) {
	srv := azureserver.Start(t, azAccount, azContainer, false)
	srv.Put(azContainer, "team/data/a.txt", "a")
	const wrongKey = "d3Jvbmcta2V5LXRoYXQtaXMtYmFzZTY0LWFuZC1sb25nLWVub3VnaA=="
	const wrongSAS = "sv=2022-11-02&sp=rl&sig=d3Jvbmctc2lnbmF0dXJlLXZhbHVl"
	secrets := map[string]string{"AZ_KEY": wrongKey, "AZ_SAS": wrongSAS, "AZ_BAD": "not base64!!"}
	m := newAzureMounter(t, srv, secrets, func(c *testConfig) { c.MaxAttempts = 1 })
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
	if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "azuremount.Config.Credential") {
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
// by azuremount.Config.Credential's bearer tokens (over TLS, for the storage
// scope).
func TestAzureDefaultCredential(t *testing.T) {
	srv := azureserver.Start(t, azAccount, azContainer, true)
	srv.Put(azContainer, "team/data/a.txt", "through a token")
	tok := &staticToken{token: srv.Bearer}
	m := newAzureMounter(t, srv, nil, func(c *testConfig) { c.Azure.Credential = tok })
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
	for name, mutate := range map[string]func(*testConfig){
		"bytes":   func(c *testConfig) { c.MaxBytes = 100 },
		"objects": func(c *testConfig) { c.MaxObjects = 2 },
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
	got, err := planAzure(t, newAzureMounter(t, srv, secrets, func(c *testConfig) { c.MaxAttempts = 3 }), azureEntry(srv, true, nil))
	if err != nil || len(got) != 3 {
		t.Fatalf("after two 503s: %v, %v", got, err)
	}
	failures.Store(100)
	_, err = planAzure(t, newAzureMounter(t, srv, secrets, func(c *testConfig) { c.MaxAttempts = 2 }), azureEntry(srv, true, nil))
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
		t.Fatalf("a server answering 503: %v", err)
	}
}
