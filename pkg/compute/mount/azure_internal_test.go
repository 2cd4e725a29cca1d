package mount

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The vectors below were worked out by hand from the documented Shared
// Key canonicalization for the Blob service, with the signature computed
// separately (HMAC-SHA256 of the string under the decoded key, base64).
const (
	azureTestAccount = "myaccount"
	azureTestKey     = "dGVzdC1rZXktZm9yLWJ1bGtoZWFkLXNpZ25pbmc=" // base64("test-key-for-bulkhead-signing")
	azureTestDate    = "Tue, 03 Nov 2026 10:00:00 GMT"
)

// TestAzureSharedKeyVectors: the string to sign and the Authorization
// header of a List Blobs request (query parameters lower-cased, sorted,
// values decoded; no body, so an empty Content-Length) and of a Put Blob
// (Content-Length, Content-Type and If-Match in their places, an x-ms-*
// header's folded value unfolded, the path kept encoded).
func TestAzureSharedKeyVectors(t *testing.T) {
	k, err := newAzureSharedKey(azureTestAccount, azureTestKey)
	if err != nil {
		t.Fatal(err)
	}
	date, _ := time.Parse(http.TimeFormat, azureTestDate)
	for _, tc := range []struct {
		name    string
		req     func() *http.Request
		toSign  string
		authSig string
	}{
		{
			name: "list blobs",
			req: func() *http.Request {
				r, _ := http.NewRequest(http.MethodGet, "https://myaccount.blob.core.windows.net/mycontainer?restype=container&comp=list&prefix=team%2Fdata%2F&MaxResults=2&marker=abc", nil)
				return r
			},
			toSign:  "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:" + azureTestDate + "\nx-ms-version:2021-12-02\n/myaccount/mycontainer\ncomp:list\nmarker:abc\nmaxresults:2\nprefix:team/data/\nrestype:container",
			authSig: "RFZ/Jk5f9jCmYKLkuDwjYegsUWxL9J5vbJxdLTjUaK0=",
		},
		{
			name: "put blob",
			req: func() *http.Request {
				r, _ := http.NewRequest(http.MethodPut, "https://myaccount.blob.core.windows.net/mycontainer/dir/a%20b.txt", strings.NewReader("hello world"))
				r.Header.Set("Content-Type", "text/plain")
				r.Header.Set("If-Match", `"0x8DB1"`)
				r.Header.Set("x-ms-blob-type", "BlockBlob")
				r.Header.Set("X-Ms-Meta-Note", "  a   b c ")
				return r
			},
			toSign:  "PUT\n\n\n11\n\ntext/plain\n\n\n\"0x8DB1\"\n\n\n\nx-ms-blob-type:BlockBlob\nx-ms-date:" + azureTestDate + "\nx-ms-meta-note:a b c\nx-ms-version:2021-12-02\n/myaccount/mycontainer/dir/a%20b.txt",
			authSig: "D5d/f+ZtKJjrE5xRSJOIV6ueXSskB2EvFwivJZt+evQ=",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req()
			k.sign(r, date)
			if got := k.stringToSign(r); got != tc.toSign {
				t.Fatalf("string to sign:\n%q\nwant:\n%q", got, tc.toSign)
			}
			if got, want := r.Header.Get("Authorization"), "SharedKey myaccount:"+tc.authSig; got != want {
				t.Fatalf("Authorization = %q, want %q", got, want)
			}
		})
	}
	if _, err := newAzureSharedKey("acct", "not base64!"); err == nil || strings.Contains(err.Error(), "not base64!") {
		t.Fatalf("bad key: %v", err)
	}
}

// TestAzureListBlobsPages: List Blobs pages (the first with a byte order
// mark, as the service sends it) are parsed and NextMarker followed; each
// request is signed and carries the marker of the page before.
func TestAzureListBlobsPages(t *testing.T) {
	pages := map[string]string{
		"": "\ufeff" + `<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="https://myaccount.blob.core.windows.net/" ContainerName="c">
  <Prefix>team/</Prefix><MaxResults>2</MaxResults>
  <Blobs>
    <Blob><Name>team/a.txt</Name><Properties><Last-Modified>Tue, 03 Nov 2026 09:00:00 GMT</Last-Modified><Etag>0x8DB1</Etag><Content-Length>5</Content-Length><BlobType>BlockBlob</BlobType></Properties></Blob>
    <BlobPrefix><Name>team/sub/</Name></BlobPrefix>
    <Blob><Name>team/b &amp; c.txt</Name><Properties><Etag>"0x8DB2"</Etag><Content-Length>0</Content-Length></Properties></Blob>
  </Blobs>
  <NextMarker>2!72!bWFya2Vy</NextMarker>
</EnumerationResults>`,
		"2!72!bWFya2Vy": `<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ContainerName="c"><Marker>2!72!bWFya2Vy</Marker><Blobs>
    <Blob><Name>team/z.bin</Name><Properties><Etag>0x8DB3</Etag><Content-Length>1048576</Content-Length></Properties></Blob>
  </Blobs><NextMarker /></EnumerationResults>`,
	}
	var markers []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("restype") != "container" || q.Get("comp") != "list" || q.Get("prefix") != "team/" || q.Get("maxresults") != "2" ||
			!strings.HasPrefix(r.Header.Get("Authorization"), "SharedKey myaccount:") || r.URL.Path != "/myaccount/c" {
			http.Error(w, "bad request "+r.URL.String(), http.StatusBadRequest)
			return
		}
		markers = append(markers, q.Get("marker"))
		fmt.Fprint(w, pages[q.Get("marker")])
	}))
	defer srv.Close()
	k, _ := newAzureSharedKey(azureTestAccount, azureTestKey)
	l := &azureLister{hc: srv.Client(), base: srv.URL + "/myaccount", container: "c", key: k, now: time.Now}
	var got []string
	err := l.list(context.Background(), "team/", 2, func(key, version string, size int64) error {
		got = append(got, fmt.Sprintf("%s %s %d", key, version, size))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"team/a.txt 0x8DB1 5", `team/b & c.txt "0x8DB2" 0`, "team/z.bin 0x8DB3 1048576"}
	if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(markers) != "[ 2!72!bWFya2Vy]" {
		t.Fatalf("blobs %q (markers %q), want %q", got, markers, want)
	}
}
