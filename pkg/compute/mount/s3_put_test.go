package mount_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// s3PutTransport loses the answer of the next PUT (once lose is set),
// after running remote (another writer's upload, landing between the lost
// answer and the retry) if set. With noChecksums it removes the
// x-amz-checksum-* headers from every HEAD answer, as a server keeping no
// checksums would answer; with composite it shows the SHA-256 as a
// composite checksum of one part, as a server keeping only those would.
type s3PutTransport struct {
	base        http.RoundTripper
	noChecksums bool
	composite   bool
	remote      func() error
	lose        atomic.Bool
	dropped     atomic.Int32
	remoteErr   error // remote's, set on the syncing goroutine, read after Sync
}

func (rt *s3PutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	switch {
	case req.Method == http.MethodHead && rt.noChecksums:
		for k := range resp.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-amz-checksum-") {
				delete(resp.Header, k)
			}
		}
	case req.Method == http.MethodHead && rt.composite:
		if sum := resp.Header.Get("X-Amz-Checksum-Sha256"); sum != "" {
			resp.Header.Set("X-Amz-Checksum-Sha256", sum+"-1")
			resp.Header.Set("X-Amz-Checksum-Type", "COMPOSITE")
		}
	case req.Method == http.MethodPut && resp.StatusCode/100 == 2 && rt.lose.Swap(false):
		resp.Body.Close()
		rt.dropped.Add(1)
		if rt.remote != nil {
			rt.remoteErr = rt.remote()
		}
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Header: http.Header{},
			Body: http.NoBody, Request: req}, nil
	}
	return resp, nil
}

// TestS3LostUploadAnswer: after a lost answer, the retried upload's failed
// condition is ours only if the object holds our bytes, told by the
// SHA-256 the server kept or, on a server keeping no checksums or only a
// composite one, by the ETag being the bytes' MD5. Another writer's different bytes landing
// before the retry stay a conflict, and are kept; another writer's
// identical bytes cannot be told from ours and count as uploaded.
func TestS3LostUploadAnswer(t *testing.T) {
	testenv.Require(t, testenv.Root)
	for _, tc := range []struct {
		name        string
		noChecksums bool
		composite   bool
		// remote is what another writer uploads before the retry ("":
		// nothing), as long as v2 so that only a checksum tells them
		// apart.
		remote   string
		conflict bool
	}{
		{name: "ours_by_sha256"},
		{name: "ours_by_md5_etag", noChecksums: true},
		{name: "ours_by_md5_etag_beside_composite", composite: true},
		{name: "other_by_sha256", remote: "r2", conflict: true},
		{name: "other_by_md5_etag", noChecksums: true, remote: "r2", conflict: true},
		{name: "same_bytes_by_another", noChecksums: true, remote: "v2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := s3Storage(t, manifest.TypeS3Mount)
			rt := &s3PutTransport{base: http.DefaultTransport, noChecksums: tc.noChecksums, composite: tc.composite}
			if tc.remote != "" {
				// With its SHA-256, which the server keeps and HEAD
				// shows (unless noChecksums).
				rt.remote = func() error {
					_, err := st.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &st.bucket, Key: aws.String(st.root + "f.txt"),
						Body: strings.NewReader(tc.remote), ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
					return err
				}
			}
			e := newEnvOn(t, st, func(c *testConfig) { c.HTTPClient = &http.Client{Transport: rt} }, nil)
			e.put(t, "f.txt", "v1")
			s := e.started(t, map[string]*manifest.Entry{"w": e.entry(false)})
			asRunAs(t, s, "printf v2 > w/f.txt")
			rt.lose.Store(true)
			ctx := ctxT(t)
			stats, err := e.mounter.Sync(ctx, s)
			if rt.dropped.Load() != 1 || rt.remoteErr != nil {
				t.Fatalf("answers dropped %d, remote write %v", rt.dropped.Load(), rt.remoteErr)
			}
			want, wantBody := "{Uploaded:1 Deleted:0 Unchanged:0 Conflicts:[]}", "v2"
			if tc.conflict {
				want, wantBody = "{Uploaded:0 Deleted:0 Unchanged:0 Conflicts:[w/f.txt]}", tc.remote
			}
			if got := fmt.Sprintf("%+v", stats); got != want || tc.conflict != errors.Is(err, errkind.ErrConflict) || !tc.conflict && err != nil {
				t.Fatalf("Sync = %s, %v; want %s", got, err, want)
			}
			if got, _ := e.get(t, "f.txt"); got != wantBody {
				t.Fatalf("f.txt = %q, want %q", got, wantBody)
			}
			if tc.conflict {
				return
			}
			// The baseline is the landed object: nothing to do, then a
			// further change uploads without a conflict.
			if stats, err := e.mounter.Sync(ctx, s); err != nil || stats.Uploaded != 0 || len(stats.Conflicts) != 0 {
				t.Fatalf("Sync after = %+v, %v", stats, err)
			}
			asRunAs(t, s, "printf v3 > w/f.txt")
			if stats, err := e.mounter.Sync(ctx, s); err != nil || stats.Uploaded != 1 || len(stats.Conflicts) != 0 {
				t.Fatalf("Sync of v3 = %+v, %v", stats, err)
			}
		})
	}
}
