// Package azureserver is an in-test Azure Blob server: the subset of the
// Blob REST API that the azure_blob_mount backend (pkg/compute/mount)
// uses (List Blobs paged with markers, Get Blob, Get Blob Properties, Put
// Blob, Delete Blob, with If-Match and If-None-Match), authorizing every
// request on its own terms: a Shared Key signature recomputed here from
// Microsoft's documented canonicalization (not the SDK's code), a SAS
// token's parameters, or a bearer token.
//
// No Azure Blob emulator can run here (Azurite is an npm package, and
// neither the Go module proxy nor Debian has one), hence this server; the
// Azure code is tested at the unit level against it (see the README).
package azureserver

import (
	"bytes"
	"crypto/hmac"
	"crypto/md5" //nolint:gosec // the Blob service's Content-MD5, as the service computes it
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// StringToSign is the string a Shared Key signature of the Blob
// service covers (version 2015-02-21 and later), from Microsoft's
// "Authorize with Shared Key": the verb; the values of Content-Encoding,
// Content-Language, Content-Length (empty for zero), Content-MD5,
// Content-Type, Date (empty when x-ms-date is set), If-Modified-Since,
// If-Match, If-None-Match, If-Unmodified-Since and Range, each on its
// line; the x-ms-* headers lower-cased, sorted by name, values unfolded
// and trimmed, "name:value" each on its line; then the canonicalized
// resource: "/" account, the URI's path as encoded, and each query
// parameter lower-cased and sorted, "\nname:v1,v2" with the values
// decoded and sorted.
func StringToSign(account string, r *http.Request) string {
	var b strings.Builder
	b.WriteString(r.Method)
	b.WriteByte('\n')
	for _, h := range []string{"Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type", "Date",
		"If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range"} {
		v := r.Header.Get(h)
		switch h {
		case "Content-Length":
			if v == "" && r.ContentLength > 0 {
				v = strconv.FormatInt(r.ContentLength, 10)
			}
			if v == "0" {
				v = ""
			}
		case "Date":
			if r.Header.Get("x-ms-date") != "" {
				v = ""
			}
		}
		b.WriteString(v)
		b.WriteByte('\n')
	}
	var names []string
	vals := map[string]string{}
	for name, vs := range r.Header {
		n := strings.ToLower(name)
		if !strings.HasPrefix(n, "x-ms-") {
			continue
		}
		names = append(names, n)
		vals[n] = strings.Join(strings.Fields(strings.Join(vs, ",")), " ")
	}
	slices.Sort(names)
	for _, n := range names {
		b.WriteString(n + ":" + vals[n] + "\n")
	}
	b.WriteString("/" + account + r.URL.EscapedPath())
	params := map[string][]string{}
	for name, vs := range r.URL.Query() {
		n := strings.ToLower(name)
		params[n] = append(params[n], vs...)
	}
	keys := make([]string, 0, len(params))
	for n := range params {
		keys = append(keys, n)
	}
	slices.Sort(keys)
	for _, n := range keys {
		vs := params[n]
		slices.Sort(vs)
		b.WriteString("\n" + n + ":" + strings.Join(vs, ","))
	}
	return b.String()
}

// Signature is the base64 HMAC-SHA256 of s under the decoded key.
func Signature(key []byte, s string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(s))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

type blob struct {
	data     []byte
	etag     string // bare: 0x8D...
	md5      []byte
	modified time.Time
}

// Server serves one account's containers. Its zero value is not
// usable: see Start.
type Server struct {
	srv     *httptest.Server
	account string
	key     []byte // the account key, decoded
	// KeyB64 is the account key as a credential holds it (random).
	KeyB64 string
	// SAS is the one SAS token accepted (query parameters), and SASSig
	// its signature (random; a test looks for it where it must not be).
	SAS, SASSig string
	// Bearer is the one bearer token accepted (TLS servers only).
	Bearer string

	mu         sync.Mutex
	containers map[string]map[string]*blob
	seq        int
	// Counters and a log of what was asked, for the tests.
	verified, refused int
	lists             []string // the marker of each List Blobs
	gets, puts        int
	fault             func(r *http.Request) int
}

// Start starts a server for account with one container; tls
// serves HTTPS (for bearer tokens, which the SDK sends only over TLS).
func Start(t testing.TB, account, container string, tls bool) *Server {
	t.Helper()
	random := func(n int) []byte {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	key := random(64)
	sig := base64.RawURLEncoding.EncodeToString(random(24))
	s := &Server{account: account, key: key, KeyB64: base64.StdEncoding.EncodeToString(key), SASSig: sig,
		SAS:        "sv=2022-11-02&ss=b&srt=co&sp=rwdlac&se=2099-01-01T00%3A00%3A00Z&sig=" + sig,
		Bearer:     "bearer-" + base64.RawURLEncoding.EncodeToString(random(24)),
		containers: map[string]map[string]*blob{container: {}}}
	if tls {
		s.srv = httptest.NewTLSServer(s)
	} else {
		s.srv = httptest.NewServer(s)
	}
	t.Cleanup(s.srv.Close)
	return s
}

// Endpoint is the account's endpoint, path-style as emulators serve it.
func (s *Server) Endpoint() string { return s.srv.URL + "/" + s.account }

// Client is an HTTP client trusting the server (TLS or not).
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Put stores a blob as another writer would.
func (s *Server) Put(container, name, data string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store(container, name, []byte(data))
}

func (s *Server) store(container, name string, data []byte) *blob {
	s.seq++
	sum := md5.Sum(data) //nolint:gosec // see the import
	b := &blob{data: data, etag: fmt.Sprintf("0x8DC%012X", s.seq), md5: sum[:], modified: time.Now().UTC()}
	s.containers[container][name] = b
	return b
}

// Get returns a blob's bytes and ETag.
func (s *Server) Get(container, name string) (string, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.containers[container][name]
	if !ok {
		return "", "", false
	}
	return string(b.data), b.etag, true
}

// Stats returns the verified and refused request counts, the markers of
// the listings, and the downloads and uploads counted.
func (s *Server) Stats() (verified, refused int, markers []string, gets, puts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.verified, s.refused, slices.Clone(s.lists), s.gets, s.puts
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	w.Header().Set("x-ms-error-code", code)
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		fmt.Fprintf(w, `<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>%s</Message></Error>`, code, msg)
	}
}

// authorize checks the request's credential; false means it answered.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("x-ms-version") == "" {
		s.fail(w, r, http.StatusBadRequest, "MissingRequiredHeader", "x-ms-version")
		return false
	}
	auth := r.Header.Get("Authorization")
	ok := false
	switch {
	case strings.HasPrefix(auth, "SharedKey "):
		acct, sig, _ := strings.Cut(strings.TrimPrefix(auth, "SharedKey "), ":")
		ok = acct == s.account && r.Header.Get("x-ms-date") != "" &&
			hmac.Equal([]byte(sig), []byte(Signature(s.key, StringToSign(s.account, r))))
	case strings.HasPrefix(auth, "Bearer "):
		ok = r.TLS != nil && strings.TrimPrefix(auth, "Bearer ") == s.Bearer
	case r.URL.Query().Get("sig") != "":
		want, _ := url.ParseQuery(s.SAS)
		got := r.URL.Query()
		ok = true
		for k := range want {
			if got.Get(k) != want.Get(k) {
				ok = false
			}
		}
	default:
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		s.fail(w, r, http.StatusUnauthorized, "NoAuthenticationInformation", "Server failed to authenticate the request. Please refer to the information in the www-authenticate header.")
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		s.refused++
		s.fail(w, r, http.StatusForbidden, "AuthenticationFailed", "Server failed to authenticate the request. Make sure the value of Authorization header is formed correctly including the signature.")
		return false
	}
	s.verified++
	return true
}

// condition checks If-Match / If-None-Match against b (nil: no blob); it
// answers and returns false when one fails.
func (s *Server) condition(w http.ResponseWriter, r *http.Request, b *blob) bool {
	if im := r.Header.Get("If-Match"); im != "" {
		if b == nil || im != "*" && strings.Trim(im, `"`) != b.etag {
			s.fail(w, r, http.StatusPreconditionFailed, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
			return false
		}
	}
	if inm := r.Header.Get("If-None-Match"); inm != "" && b != nil {
		if inm == "*" && r.Method == http.MethodPut {
			s.fail(w, r, http.StatusConflict, "BlobAlreadyExists", "The specified blob already exists.")
			return false
		}
		if inm == "*" || strings.Trim(inm, `"`) == b.etag {
			s.fail(w, r, http.StatusPreconditionFailed, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
			return false
		}
	}
	return true
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	fault := s.fault
	s.mu.Unlock()
	if fault != nil {
		if st := fault(r); st != 0 {
			s.fail(w, r, st, "ServerBusy", "injected")
			return
		}
	}
	if !s.authorize(w, r) {
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/"+s.account+"/")
	if !ok {
		s.fail(w, r, http.StatusBadRequest, "InvalidUri", "no account in the path")
		return
	}
	cname, escName, isBlob := strings.Cut(rest, "/")
	name, err := url.PathUnescape(escName)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "InvalidUri", "bad blob name")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	blobs, ok := s.containers[cname]
	if !ok {
		s.fail(w, r, http.StatusNotFound, "ContainerNotFound", "The specified container does not exist.")
		return
	}
	q := r.URL.Query()
	if !isBlob {
		if r.Method != http.MethodGet || q.Get("restype") != "container" || q.Get("comp") != "list" {
			s.fail(w, r, http.StatusBadRequest, "UnsupportedQueryParameter", "only List Blobs here")
			return
		}
		s.list(w, q, blobs)
		return
	}
	b := blobs[name]
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if b == nil {
			s.fail(w, r, http.StatusNotFound, "BlobNotFound", "The specified blob does not exist.")
			return
		}
		if !s.condition(w, r, b) {
			return
		}
		h := w.Header()
		h.Set("Content-Length", strconv.Itoa(len(b.data)))
		h.Set("ETag", `"`+b.etag+`"`)
		h.Set("Last-Modified", b.modified.Format(http.TimeFormat))
		h.Set("Content-MD5", base64.StdEncoding.EncodeToString(b.md5))
		h.Set("Content-Type", "application/octet-stream")
		h.Set("x-ms-blob-type", "BlockBlob")
		if r.Method == http.MethodGet {
			s.gets++
			_, _ = w.Write(b.data)
		}
	case http.MethodPut:
		if r.Header.Get("x-ms-blob-type") != "BlockBlob" || q.Get("comp") != "" {
			s.fail(w, r, http.StatusBadRequest, "InvalidHeaderValue", "only Put Blob of a block blob here")
			return
		}
		data, err := io.ReadAll(r.Body)
		if err != nil || int64(len(data)) != r.ContentLength {
			s.fail(w, r, http.StatusBadRequest, "InvalidInput", "short body")
			return
		}
		sum := md5.Sum(data) //nolint:gosec // see the import
		if cm := r.Header.Get("Content-MD5"); cm != "" && cm != base64.StdEncoding.EncodeToString(sum[:]) {
			s.fail(w, r, http.StatusBadRequest, "Md5Mismatch", "The MD5 value specified in the request did not match with the MD5 value calculated by the server.")
			return
		}
		if !s.condition(w, r, b) {
			return
		}
		s.puts++
		nb := s.store(cname, name, data)
		if bm := r.Header.Get("x-ms-blob-content-md5"); bm != "" {
			nb.md5, _ = base64.StdEncoding.DecodeString(bm)
		}
		w.Header().Set("ETag", `"`+nb.etag+`"`)
		w.Header().Set("Last-Modified", nb.modified.Format(http.TimeFormat))
		w.Header().Set("Content-MD5", base64.StdEncoding.EncodeToString(sum[:]))
		w.WriteHeader(http.StatusCreated)
	case http.MethodDelete:
		if b == nil {
			s.fail(w, r, http.StatusNotFound, "BlobNotFound", "The specified blob does not exist.")
			return
		}
		if !s.condition(w, r, b) {
			return
		}
		delete(blobs, name)
		w.WriteHeader(http.StatusAccepted)
	default:
		s.fail(w, r, http.StatusMethodNotAllowed, "UnsupportedHttpVerb", r.Method)
	}
}

// list answers List Blobs: names in order, maxresults a page, the marker
// an opaque token for the first name of the next page. s.mu is held.
func (s *Server) list(w http.ResponseWriter, q url.Values, blobs map[string]*blob) {
	prefix, marker := q.Get("prefix"), q.Get("marker")
	s.lists = append(s.lists, marker)
	max := 5000
	if m, err := strconv.Atoi(q.Get("maxresults")); err == nil && m > 0 {
		max = m
	}
	start := ""
	if marker != "" {
		raw, err := base64.RawURLEncoding.DecodeString(marker)
		if err != nil {
			s.fail(w, &http.Request{}, http.StatusBadRequest, "OutOfRangeInput", "bad marker")
			return
		}
		start = string(raw)
	}
	var names []string
	for n := range blobs {
		if strings.HasPrefix(n, prefix) && n >= start {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	next := ""
	if len(names) > max {
		next = base64.RawURLEncoding.EncodeToString([]byte(names[max]))
		names = names[:max]
	}
	var b bytes.Buffer
	esc := func(v string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(v))
		return e.String()
	}
	b.WriteString("\ufeff" + `<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="` + esc(s.Endpoint()) + `/" ContainerName="c">`)
	b.WriteString("<Prefix>" + esc(prefix) + "</Prefix><Marker>" + esc(marker) + "</Marker><MaxResults>" + strconv.Itoa(max) + "</MaxResults><Blobs>")
	for _, n := range names {
		bl := blobs[n]
		// The listing gives ETags bare, the headers quoted, as the
		// service does.
		fmt.Fprintf(&b, "<Blob><Name>%s</Name><Properties><Last-Modified>%s</Last-Modified><Etag>%s</Etag><Content-Length>%d</Content-Length>"+
			"<Content-Type>application/octet-stream</Content-Type><Content-MD5>%s</Content-MD5><BlobType>BlockBlob</BlobType></Properties></Blob>",
			esc(n), bl.modified.Format(http.TimeFormat), bl.etag, len(bl.data), base64.StdEncoding.EncodeToString(bl.md5))
	}
	b.WriteString("</Blobs><NextMarker>" + esc(next) + "</NextMarker></EnumerationResults>")
	w.Header().Set("Content-Type", "application/xml")
	_, _ = w.Write(b.Bytes())
}

// SetFault installs f: asked first about every request, it may answer
// with a status (an error answer, code ServerBusy) or return 0 to let the
// server answer.
func (s *Server) SetFault(f func(r *http.Request) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}
