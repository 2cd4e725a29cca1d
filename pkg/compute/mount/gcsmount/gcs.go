package gcsmount

import (
	"bytes"
	"context"
	"crypto/md5" //nolint:gosec // GCS's integrity check of an upload, not a security measure
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/storeerr"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// DefaultEndpoint is where gcs_mount entries without an endpoint go.
const DefaultEndpoint = "https://storage.googleapis.com"

// defaultGoogleTokenURL is the token endpoint of a service-account key
// that names none.
const defaultGoogleTokenURL = "https://oauth2.googleapis.com/token"

// tokenExchangeTimeout bounds one exchange of a service account's JWT for
// an access token.
const tokenExchangeTimeout = 30 * time.Second

// OAuth scopes of a gcs_mount's access token.
const (
	gcsScopeReadOnly  = "https://www.googleapis.com/auth/devstorage.read_only"
	gcsScopeReadWrite = "https://www.googleapis.com/auth/devstorage.read_write"
)

// Config configures the GCS backend.
type Config struct {
	// Tokens authorize the requests of gcs_mount entries that name no
	// credentials (for example a workload identity's tokens); nil refuses
	// such mounts.
	Tokens oauth2.TokenSource
}

// Backend is the mount.Backend of gcs_mount entries. It is safe for
// concurrent use.
type Backend struct {
	cfg Config
}

var _ mount.Backend = (*Backend)(nil)

// New returns the backend.
func New(cfg Config) *Backend { return &Backend{cfg: cfg} }

// Types returns gcs_mount.
func (b *Backend) Types() []manifest.EntryType { return []manifest.EntryType{manifest.TypeGCSMount} }

// objects is a Google Cloud Storage bucket through the JSON API, by
// hand (a few requests do not warrant cloud.google.com/go/storage's
// dependency tree in the harness). Versions are object generations.
//
// Requests: objects.list (paged with maxResults/pageToken), a media
// download pinned to the listed generation, objects.get for the current
// generation, a multipart upload carrying the MD5 (which GCS verifies)
// with ifGenerationMatch (0: the object must not exist), and a delete with
// ifGenerationMatch. Requests failing with 429, a 5xx or a broken
// connection are retried with backoff.
type objects struct {
	hc       *http.Client
	base     string // endpoint, no trailing slash
	bucket   string
	tokens   oauth2.TokenSource
	attempts int
}

var _ mount.Objects = (*objects)(nil)

// Open returns the storage of a gcs_mount entry. Credentials (see
// manifest.CredentialKeys): access_token, a bearer token used as is; or
// service_account_key, a service account's JSON key, exchanged for tokens
// (a signed JWT to the key's token_uri) scoped read-only or read-write as
// the mount is. HMAC keys (access_id, secret_access_key) belong to the XML
// API and are refused. A mount naming none uses Config.Tokens.
func (b *Backend) Open(ctx context.Context, req *mount.Request) (*mount.Storage, error) {
	p, mt := req.Path, req.Entry.Mount
	base := strings.TrimRight(mt.Endpoint, "/")
	if base == "" {
		base = DefaultEndpoint
	}
	prefix := mount.KeyPrefix(mt.Prefix)
	desc := "gs://" + mt.Bucket + "/" + prefix
	if mt.Endpoint != "" {
		desc += " at " + mt.Endpoint
	}
	hc := req.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	objs := &objects{hc: hc, base: base, bucket: mt.Bucket, attempts: req.MaxAttempts}
	if len(mt.Credentials) == 0 {
		if b.cfg.Tokens == nil {
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s names no credentials and the harness has no default GCS token source (gcsmount.Config.Tokens)", p)
		}
		objs.tokens = b.cfg.Tokens
	} else {
		vals, err := req.Credentials(ctx, mt.Credentials)
		if err != nil {
			return nil, err
		}
		switch {
		case vals["access_token"] != "":
			objs.tokens = oauth2.StaticTokenSource(&oauth2.Token{AccessToken: vals["access_token"], TokenType: "Bearer"})
		case vals["service_account_key"] != "":
			scope := gcsScopeReadWrite
			if mt.IsReadOnly() {
				scope = gcsScopeReadOnly
			}
			ts, pk, err := serviceAccountTokens([]byte(vals["service_account_key"]), scope, hc)
			if err != nil {
				return nil, fmt.Errorf("mount %s: credential service_account_key: %w", p, err)
			}
			req.Redact(pk) // the key alone too, not only the whole JSON
			objs.tokens = ts
		case vals["access_id"] != "" || vals["secret_access_key"] != "":
			return nil, errkind.Errorf(errkind.ErrUnimplemented, "mount %s: GCS HMAC keys (access_id, secret_access_key) are for the XML API, which gcs_mount does not use; name a service_account_key or an access_token", p)
		default:
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: credentials need a service_account_key or an access_token", p)
		}
	}
	return &mount.Storage{Objects: objs, Bucket: mt.Bucket, Prefix: prefix, Description: desc}, nil
}

// serviceAccountKey is the part of a service account's JSON key that the
// token exchange needs.
type serviceAccountKey struct {
	Type         string `json:"type"`
	ClientEmail  string `json:"client_email"`
	PrivateKey   string `json:"private_key"`
	PrivateKeyID string `json:"private_key_id"`
	TokenURI     string `json:"token_uri"`
}

// serviceAccountTokens returns a caching token source that exchanges a
// JWT signed with the key for access tokens (RFC 7523, as Google's token
// endpoint does it), and the private key (to redact). Errors never quote
// the key.
func serviceAccountTokens(keyJSON []byte, scope string, hc *http.Client) (oauth2.TokenSource, string, error) {
	var k serviceAccountKey
	if err := json.Unmarshal(keyJSON, &k); err != nil {
		return nil, "", errkind.Errorf(errkind.ErrInvalidArgument, "not a service account JSON key (it does not parse as JSON)")
	}
	if k.Type != "" && k.Type != "service_account" {
		return nil, "", errkind.Errorf(errkind.ErrInvalidArgument, "the JSON key is of type %q, not service_account", k.Type)
	}
	if k.ClientEmail == "" || k.PrivateKey == "" {
		return nil, "", errkind.Errorf(errkind.ErrInvalidArgument, "the service account key lacks client_email or private_key")
	}
	if k.TokenURI == "" {
		k.TokenURI = defaultGoogleTokenURL
	}
	cfg := &jwt.Config{Email: k.ClientEmail, PrivateKey: []byte(k.PrivateKey), PrivateKeyID: k.PrivateKeyID,
		Scopes: []string{scope}, TokenURL: k.TokenURI}
	// The source outlives the call that made it: it must not hold that
	// call's context, only an HTTP client, whose timeout bounds an
	// exchange (TokenSource.Token takes no context).
	tc := *hc
	tc.Timeout = tokenExchangeTimeout
	return cfg.TokenSource(context.WithValue(context.Background(), oauth2.HTTPClient, &tc)), k.PrivateKey, nil
}

// gcsError is an error answer of the JSON API.
type gcsError struct {
	status  int
	code    string // "NoSuchBucket" for a listing of a missing bucket, else the first error reason
	message string
}

func (e *gcsError) Error() string {
	s := "HTTP " + strconv.Itoa(e.status)
	if e.code != "" {
		s += " " + e.code
	}
	if e.message != "" {
		s += ": " + e.message
	}
	return s
}

// Inspect reads an error of the JSON API or of the token exchange; a
// broken connection is Unavailable.
func (b *objects) Inspect(err error) mount.ErrorInfo {
	in := mount.ErrorInfo{Unavailable: storeerr.Transient(err)}
	var ge *gcsError
	var re *oauth2.RetrieveError
	switch {
	case errors.As(err, &ge):
		in.Code, in.Status = ge.code, ge.status
	case errors.As(err, &re):
		// The token endpoint refused the key: the mount's credentials.
		in.Code, in.Status = "TokenExchangeFailed", http.StatusUnauthorized
	}
	in.NoBucket = in.Code == "NoSuchBucket"
	return in
}

// objectURL is the JSON API resource of an object.
func (b *objects) objectURL(key string) string {
	return b.base + "/storage/v1/b/" + url.PathEscape(b.bucket) + "/o/" + url.PathEscape(key)
}

// do sends a request, retrying what retrying can cure. body, when not
// nil, makes a fresh body for each attempt. A 2xx answer is returned
// open; any other is a *gcsError.
func (b *objects) do(ctx context.Context, method, u string, hdr http.Header, body func() (io.Reader, int64, error)) (*http.Response, error) {
	var last error
	for attempt := 0; attempt < max(b.attempts, 1); attempt++ {
		if attempt > 0 {
			d := min(100*time.Millisecond<<(attempt-1), 5*time.Second)
			d = d/2 + rand.N(d/2+1)
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, errors.Join(ctx.Err(), last)
			}
		}
		tok, err := b.tokens.Token()
		if err != nil {
			return nil, fmt.Errorf("get an access token: %w", err)
		}
		var rd io.Reader
		n := int64(0)
		if body != nil {
			if rd, n, err = body(); err != nil {
				return nil, err
			}
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.ContentLength = n
		}
		for k, v := range hdr {
			req.Header[k] = v
		}
		tok.SetAuthHeader(req)
		resp, err := b.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil || !storeerr.Transient(err) {
				return nil, err
			}
			last = err
			continue
		}
		if resp.StatusCode/100 == 2 {
			return resp, nil
		}
		gerr := readGCSError(resp)
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented {
			last = gerr
			continue
		}
		return nil, gerr
	}
	return nil, last
}

// readGCSError reads and closes an error answer.
func readGCSError(resp *http.Response) *gcsError {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ge := &gcsError{status: resp.StatusCode}
	var body struct {
		Error struct {
			Message string `json:"message"`
			Errors  []struct {
				Reason string `json:"reason"`
			} `json:"errors"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && (body.Error.Message != "" || len(body.Error.Errors) > 0) {
		ge.message = body.Error.Message
		if len(body.Error.Errors) > 0 {
			ge.code = body.Error.Errors[0].Reason
		}
	} else {
		ge.message = strings.TrimSpace(string(raw))
		if len(ge.message) > 200 {
			ge.message = ge.message[:200] + "..."
		}
	}
	return ge
}

// gcsObject is an object resource, as much of it as the mount reads.
// Numbers are JSON strings in this API.
type gcsObject struct {
	Name       string `json:"name"`
	Size       string `json:"size"`
	Generation string `json:"generation"`
	MD5Hash    string `json:"md5Hash"`
}

// List pages through the objects under prefix.
func (b *objects) List(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error {
	token := ""
	for {
		q := url.Values{"prefix": {prefix}, "maxResults": {strconv.Itoa(int(pageSize))}, "projection": {"noAcl"},
			"fields": {"items(name,size,generation),nextPageToken"}}
		if token != "" {
			q.Set("pageToken", token)
		}
		resp, err := b.do(ctx, http.MethodGet, b.base+"/storage/v1/b/"+url.PathEscape(b.bucket)+"/o?"+q.Encode(), nil, nil)
		if err != nil {
			var ge *gcsError
			if errors.As(err, &ge) && ge.status == http.StatusNotFound {
				ge.code = "NoSuchBucket"
			}
			return err
		}
		var page struct {
			Items         []gcsObject `json:"items"`
			NextPageToken string      `json:"nextPageToken"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("read the object listing: %w", err)
		}
		for _, o := range page.Items {
			size, err := strconv.ParseInt(o.Size, 10, 64)
			if err != nil || size < 0 {
				return fmt.Errorf("object %s: bad size %q in the listing", o.Name, o.Size)
			}
			if err := fn(o.Name, o.Generation, size); err != nil {
				return err
			}
		}
		if page.NextPageToken == "" || len(page.Items) == 0 && page.NextPageToken == token {
			return nil
		}
		token = page.NextPageToken
	}
}

// Get reads the generation listed: an object replaced since (and not kept
// as a noncurrent version) is a 404, and so a conflict. The stored bytes
// are asked for as they are (no transparent decompression of objects
// stored gzip-encoded), so that their length is the listed size.
func (b *objects) Get(ctx context.Context, key, version string) (io.ReadCloser, int64, error) {
	q := url.Values{"alt": {"media"}}
	if version != "" {
		q.Set("generation", version)
	}
	resp, err := b.do(ctx, http.MethodGet, b.objectURL(key)+"?"+q.Encode(), http.Header{"Accept-Encoding": {"gzip"}}, nil)
	if err != nil {
		var ge *gcsError
		if errors.As(err, &ge) && (ge.status == http.StatusNotFound || ge.status == http.StatusPreconditionFailed) {
			return nil, 0, fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// Head returns the object's current generation.
func (b *objects) Head(ctx context.Context, key string) (string, error) {
	o, err := b.meta(ctx, key)
	if err != nil {
		return "", err
	}
	if o.Generation == "" {
		return "", fmt.Errorf("object %s: no generation in the answer", key)
	}
	return o.Generation, nil
}

// meta reads an object's generation and MD5; mount.ErrGone if there is none.
func (b *objects) meta(ctx context.Context, key string) (*gcsObject, error) {
	resp, err := b.do(ctx, http.MethodGet, b.objectURL(key)+"?"+url.Values{"fields": {"generation,md5Hash"}}.Encode(), nil, nil)
	if err != nil {
		var ge *gcsError
		if errors.As(err, &ge) && ge.status == http.StatusNotFound {
			return nil, fmt.Errorf("%w: %w", mount.ErrGone, err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	var o gcsObject
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return nil, fmt.Errorf("read object %s: %w", key, err)
	}
	return &o, nil
}

// Put is a multipart upload: the object's metadata (name, MD5, which GCS
// checks against the bytes) and its bytes in one request, conditional on
// the generation.
func (b *objects) Put(ctx context.Context, key string, body io.ReadSeeker, size int64, _ string, ifVersion string) (string, error) {
	h := md5.New() //nolint:gosec // see the import
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := io.Copy(h, body); err != nil {
		return "", fmt.Errorf("hash the upload: %w", err)
	}
	meta, err := json.Marshal(map[string]string{"name": key, "md5Hash": base64.StdEncoding.EncodeToString(h.Sum(nil))})
	if err != nil {
		return "", err
	}
	boundary := "bulkhead-" + strconv.FormatUint(rand.Uint64(), 36)
	head := "--" + boundary + "\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + string(meta) +
		"\r\n--" + boundary + "\r\nContent-Type: application/octet-stream\r\n\r\n"
	tail := "\r\n--" + boundary + "--\r\n"
	if ifVersion == "" {
		ifVersion = "0" // the object must not exist
	}
	q := url.Values{"uploadType": {"multipart"}, "ifGenerationMatch": {ifVersion}, "fields": {"generation,md5Hash"}}
	u := b.base + "/upload/storage/v1/b/" + url.PathEscape(b.bucket) + "/o?" + q.Encode()
	resp, err := b.do(ctx, http.MethodPost, u, http.Header{"Content-Type": {"multipart/related; boundary=" + boundary}},
		func() (io.Reader, int64, error) {
			if _, err := body.Seek(0, io.SeekStart); err != nil {
				return nil, 0, err
			}
			return io.MultiReader(strings.NewReader(head), io.LimitReader(body, size), strings.NewReader(tail)), int64(len(head)) + size + int64(len(tail)), nil
		})
	if err != nil {
		var ge *gcsError
		if errors.As(err, &ge) && ge.status == http.StatusPreconditionFailed {
			// A retried upload whose first answer was lost fails its own
			// precondition: the object holding these very bytes is ours
			// (or identical), not a conflict.
			if cur, merr := b.meta(ctx, key); merr == nil && cur.MD5Hash == base64.StdEncoding.EncodeToString(h.Sum(nil)) && cur.Generation != "" {
				return cur.Generation, nil
			}
			return "", fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return "", err
	}
	defer resp.Body.Close()
	var o gcsObject
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil {
		err = json.NewDecoder(bytes.NewReader(raw)).Decode(&o)
	}
	if err != nil || o.Generation == "" {
		return "", fmt.Errorf("upload %s: unreadable answer (%v)", key, err)
	}
	return o.Generation, nil
}

// Remove deletes the live object only if it is still at the generation
// (on a bucket with versioning it becomes noncurrent, as any delete).
func (b *objects) Remove(ctx context.Context, key, version string) error {
	u := b.objectURL(key)
	if version != "" {
		u += "?" + url.Values{"ifGenerationMatch": {version}}.Encode()
	}
	resp, err := b.do(ctx, http.MethodDelete, u, nil, nil)
	if err != nil {
		var ge *gcsError
		switch {
		case errors.As(err, &ge) && ge.status == http.StatusNotFound:
			return fmt.Errorf("%w: %w", mount.ErrGone, err)
		case errors.As(err, &ge) && ge.status == http.StatusPreconditionFailed:
			return fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return err
	}
	resp.Body.Close()
	return nil
}
