package azureserver

import (
	"net/http"
	"strings"
	"testing"
)

// TestSharedKeyVerifier: the in-test server's Shared Key verifier
// (StringToSign) reproduces strings to sign and signatures worked
// out by hand from Microsoft's documented canonicalization, so that the
// server checks the SDK's signatures against the documentation, not
// against the SDK's own code.
func TestSharedKeyVerifier(t *testing.T) {
	const date = "Tue, 03 Nov 2026 10:00:00 GMT"
	key := []byte("test-key-for-bulkhead-signing")
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
			toSign:  "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:" + date + "\nx-ms-version:2021-12-02\n/myaccount/mycontainer\ncomp:list\nmarker:abc\nmaxresults:2\nprefix:team/data/\nrestype:container",
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
			toSign:  "PUT\n\n\n11\n\ntext/plain\n\n\n\"0x8DB1\"\n\n\n\nx-ms-blob-type:BlockBlob\nx-ms-date:" + date + "\nx-ms-meta-note:a b c\nx-ms-version:2021-12-02\n/myaccount/mycontainer/dir/a%20b.txt",
			authSig: "D5d/f+ZtKJjrE5xRSJOIV6ueXSskB2EvFwivJZt+evQ=",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req()
			r.Header.Set("x-ms-date", date)
			r.Header.Set("x-ms-version", "2021-12-02")
			got := StringToSign("myaccount", r)
			if got != tc.toSign {
				t.Fatalf("string to sign:\n%q\nwant:\n%q", got, tc.toSign)
			}
			if sig := Signature(key, got); sig != tc.authSig {
				t.Fatalf("signature = %q, want %q", sig, tc.authSig)
			}
		})
	}
}
