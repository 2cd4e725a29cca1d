package s3client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// noWait retries at once, so that the tests wait for nothing.
type noWait struct{}

func (noWait) BackoffDelay(int, error) (time.Duration, error) { return 0, nil }

// countingTransport counts the requests sent through it and records the
// host each was for, then sends them all to the server at target.
type countingTransport struct {
	target string
	n      atomic.Int64
	mu     sync.Mutex
	hosts  map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	c.mu.Lock()
	c.hosts[r.URL.Host]++
	c.mu.Unlock()
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = c.target, ""
	return http.DefaultTransport.RoundTrip(r)
}

func creds() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider("AKIDS3CLIENTTEST", "secret-s3client-test", "")
}

// TestRetriesHaveNoBudget sends more failing requests than the SDK's
// default retry quota allows (500 tokens, 5 per retry: 100 retries): each
// one still gets all its tries, through the given HTTP client, path-style
// to the endpoint (the client sends every request to the test server),
// signed for the given region.
func TestRetriesHaveNoBudget(t *testing.T) {
	var (
		mu      sync.Mutex
		paths   = map[string]int{}
		regions = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths[r.URL.Path]++
		if _, after, ok := strings.Cut(r.Header.Get("Authorization"), "Credential=AKIDS3CLIENTTEST/"); ok {
			if parts := strings.Split(after, "/"); len(parts) > 2 {
				regions[parts[1]]++
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code><Message>down</Message></Error>`)
	}))
	defer srv.Close()
	tr := &countingTransport{target: strings.TrimPrefix(srv.URL, "http://"), hosts: map[string]int{}}
	const tries, requests = 3, 60 // 120 retries
	c := New(Options{Region: "auto", Endpoint: "http://s3.example.test", UsePathStyle: true, Credentials: creds(),
		MaxAttempts: tries, Backoff: noWait{}, HTTPClient: &http.Client{Transport: tr}})
	for i := range requests {
		_, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k")})
		var re *awshttp.ResponseError
		if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %v, want the server's 503 after %d tries (a spent retry quota?)", i, err, tries)
		}
		if errors.As(err, new(ratelimit.QuotaExceededError)) {
			t.Fatalf("request %d: the retry quota ran out: %v", i, err)
		}
	}
	if got := tr.n.Load(); got != tries*requests {
		t.Errorf("%d requests went through the given HTTP client, want %d", got, tries*requests)
	}
	if paths["/bkt/k"] != tries*requests || len(paths) != 1 {
		t.Errorf("request paths %v, want /bkt/k (path style) %d times", paths, tries*requests)
	}
	if tr.hosts["s3.example.test"] != tries*requests || len(tr.hosts) != 1 {
		t.Errorf("request hosts %v, want the endpoint's (path style)", tr.hosts)
	}
	if regions["auto"] != tries*requests || len(regions) != 1 {
		t.Errorf("signing regions %v, want auto", regions)
	}
}

// TestOptions checks the client's settings: defaults for what is left
// out, cached credentials, and checksums only when required.
func TestOptions(t *testing.T) {
	o := New(Options{Credentials: creds()}).Options()
	if o.Region != DefaultRegion || o.BaseEndpoint != nil || o.UsePathStyle || o.HTTPClient == nil {
		t.Errorf("defaults: region %q, endpoint %v, path style %v, HTTP client %v", o.Region, o.BaseEndpoint, o.UsePathStyle, o.HTTPClient)
	}
	if _, ok := o.Credentials.(*aws.CredentialsCache); !ok {
		t.Errorf("credentials are a %T, want an *aws.CredentialsCache", o.Credentials)
	}
	if o.Retryer.MaxAttempts() != retry.DefaultMaxAttempts {
		t.Errorf("default tries %d, want the SDK's %d", o.Retryer.MaxAttempts(), retry.DefaultMaxAttempts)
	}
	if o.RequestChecksumCalculation != aws.RequestChecksumCalculationWhenRequired || o.ResponseChecksumValidation != aws.ResponseChecksumValidationWhenRequired {
		t.Errorf("checksums: request %v, response %v, want both when required", o.RequestChecksumCalculation, o.ResponseChecksumValidation)
	}
	o = New(Options{Region: "eu-west-3", Endpoint: "http://127.0.0.1:1", Credentials: creds(), MaxAttempts: 7}).Options()
	if o.Region != "eu-west-3" || aws.ToString(o.BaseEndpoint) != "http://127.0.0.1:1" || o.Retryer.MaxAttempts() != 7 {
		t.Errorf("set: region %q, endpoint %v, tries %d", o.Region, aws.ToString(o.BaseEndpoint), o.Retryer.MaxAttempts())
	}
}

// TestNoChecksumUnlessAsked checks that a PUT carries no checksum the
// caller did not ask for (the SDK's default adds a CRC32 trailer, which
// some S3-compatible servers refuse), and one it asked for.
func TestNoChecksumUnlessAsked(t *testing.T) {
	var mu sync.Mutex
	var headers []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		headers = append(headers, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("ETag", `"e"`)
	}))
	defer srv.Close()
	c := New(Options{Endpoint: srv.URL, UsePathStyle: true, Credentials: creds(), Backoff: noWait{}})
	put := func(alg types.ChecksumAlgorithm) {
		t.Helper()
		_, err := c.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String("k"),
			Body: strings.NewReader("hello"), ChecksumAlgorithm: alg})
		if err != nil {
			t.Fatal(err)
		}
	}
	put("")
	put(types.ChecksumAlgorithmSha256)
	if len(headers) != 2 {
		t.Fatalf("%d requests", len(headers))
	}
	checksum := func(h http.Header) string {
		for k, v := range h {
			if strings.HasPrefix(strings.ToLower(k), "x-amz-checksum-") || strings.EqualFold(k, "x-amz-trailer") || strings.EqualFold(k, "x-amz-sdk-checksum-algorithm") {
				return k + ": " + strings.Join(v, ",")
			}
		}
		return ""
	}
	if got := checksum(headers[0]); got != "" {
		t.Errorf("a PUT that asked for no checksum carries %s", got)
	}
	if got := checksum(headers[1]); !strings.Contains(strings.ToLower(got), "sha256") {
		t.Errorf("a PUT that asked for SHA-256 carries %q", got)
	}
}
