package mount

// Azure Blob Storage: the parts of a client that can be checked without a
// server, kept ready for azure_blob_mount.
//
// What is tested, at the unit level only (azure_internal_test.go):
//   - Shared Key signing (azureSharedKey.sign): the string to sign built
//     from the documented canonicalization for the Blob service (version
//     2015-02-21 and later: the verb and eleven standard headers, an empty
//     Content-Length for zero, the x-ms-* headers lower-cased, sorted and
//     unfolded, then /account/encoded-path and the query parameters
//     lower-cased, sorted, values decoded and comma-joined), compared with
//     strings and HMAC-SHA256 signatures worked out by hand from that
//     documentation;
//   - List Blobs (azureLister.list): the EnumerationResults XML of each
//     page parsed (names, ETags, Content-Length, BlobPrefix entries
//     ignored), and the NextMarker followed until it is empty, against an
//     httptest handler serving recorded-by-hand pages.
//
// What is not tested, and so not offered: no Azure Blob server (Azurite is
// an npm package, and neither the Go module proxy nor Debian has an
// emulator) was reachable, so downloads, conditional uploads (If-Match an
// ETag, If-None-Match *) and deletes are not written, and PlanMount refuses
// azure_blob_mount with ErrUnimplemented.

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// azureAPIVersion is the x-ms-version the requests declare.
const azureAPIVersion = "2021-12-02"

// azureSharedKey signs Blob service requests with an account key.
type azureSharedKey struct {
	account string
	key     []byte // decoded from the base64 account key
}

// newAzureSharedKey decodes an account key. Errors never quote it.
func newAzureSharedKey(account, accountKey string) (*azureSharedKey, error) {
	key, err := base64.StdEncoding.DecodeString(accountKey)
	if err != nil || len(key) == 0 {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "the account key of storage account %s is not base64", account)
	}
	return &azureSharedKey{account: account, key: key}, nil
}

// azureSignedHeaders are the standard headers of the string to sign, in
// order.
var azureSignedHeaders = []string{"Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type", "Date",
	"If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range"}

// stringToSign is the canonical form of a request that Shared Key signs.
// The request's Content-Length is req.ContentLength when the header is
// not set.
func (k *azureSharedKey) stringToSign(req *http.Request) string {
	var b strings.Builder
	b.WriteString(req.Method)
	b.WriteByte('\n')
	for _, h := range azureSignedHeaders {
		v := req.Header.Get(h)
		switch h {
		case "Content-Length":
			if v == "" && req.ContentLength > 0 {
				v = strconv.FormatInt(req.ContentLength, 10)
			}
			if v == "0" {
				v = ""
			}
		case "Date":
			if req.Header.Get("x-ms-date") != "" {
				v = ""
			}
		}
		b.WriteString(v)
		b.WriteByte('\n')
	}
	// Canonicalized headers: x-ms-*, lower case, sorted, values unfolded.
	var names []string
	vals := map[string]string{}
	for name, vs := range req.Header {
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
	// Canonicalized resource: /account/path, then the query parameters.
	b.WriteString("/" + k.account + req.URL.EscapedPath())
	q := req.URL.Query()
	params := map[string][]string{}
	for name, vs := range q {
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

// sign sets the request's x-ms-version (if unset) and Authorization
// headers; x-ms-date must be set already (sign sets it to now if not).
func (k *azureSharedKey) sign(req *http.Request, now time.Time) {
	if req.Header.Get("x-ms-date") == "" {
		req.Header.Set("x-ms-date", now.UTC().Format(http.TimeFormat))
	}
	if req.Header.Get("x-ms-version") == "" {
		req.Header.Set("x-ms-version", azureAPIVersion)
	}
	mac := hmac.New(sha256.New, k.key)
	mac.Write([]byte(k.stringToSign(req)))
	req.Header.Set("Authorization", "SharedKey "+k.account+":"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
}

// azureListPage is one page of List Blobs.
type azureListPage struct {
	XMLName xml.Name `xml:"EnumerationResults"`
	Blobs   struct {
		Blob []struct {
			Name       string `xml:"Name"`
			Properties struct {
				ETag          string `xml:"Etag"`
				ContentLength int64  `xml:"Content-Length"`
				BlobType      string `xml:"BlobType"`
			} `xml:"Properties"`
		} `xml:"Blob"`
	} `xml:"Blobs"`
	NextMarker string `xml:"NextMarker"`
}

// azureLister lists the blobs of a container (signed with a shared key,
// or authorized by a SAS token appended to each URL).
type azureLister struct {
	hc        *http.Client
	base      string // https://ACCOUNT.blob.core.windows.net, or an emulator's URL with the account in its path
	container string
	key       *azureSharedKey // nil with a SAS token
	sas       string          // without a leading "?"
	now       func() time.Time
}

// list calls fn for every blob whose name starts with prefix, following
// NextMarker page by page.
func (l *azureLister) list(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error {
	marker := ""
	for {
		q := url.Values{"restype": {"container"}, "comp": {"list"}, "maxresults": {strconv.Itoa(int(pageSize))}}
		if prefix != "" {
			q.Set("prefix", prefix)
		}
		if marker != "" {
			q.Set("marker", marker)
		}
		u := l.base + "/" + url.PathEscape(l.container) + "?" + q.Encode()
		if l.sas != "" {
			u += "&" + strings.TrimPrefix(l.sas, "?")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		if l.key != nil {
			l.key.sign(req, l.now())
		} else {
			req.Header.Set("x-ms-version", azureAPIVersion)
		}
		resp, err := l.hc.Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			return fmt.Errorf("list blobs: HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("x-ms-error-code"), strings.TrimSpace(string(raw)))
		}
		var page azureListPage
		br := bufio.NewReader(resp.Body)
		if bom, _ := br.Peek(3); string(bom) == "\ufeff" {
			_, _ = br.Discard(3) // the service starts its XML with a byte order mark
		}
		err = xml.NewDecoder(br).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("list blobs: read the answer: %w", err)
		}
		for _, b := range page.Blobs.Blob {
			if err := fn(b.Name, b.Properties.ETag, b.Properties.ContentLength); err != nil {
				return err
			}
		}
		if page.NextMarker == "" || page.NextMarker == marker {
			return nil
		}
		marker = page.NextMarker
	}
}
