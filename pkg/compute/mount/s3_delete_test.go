package mount_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// deleteTransport logs the HEAD and DELETE requests the Mounter sends (as
// "HEAD key" / "DELETE key"), can run a remote write right after a HEAD of
// one key returned (the window between a check and a delete), and can play
// a server that ignores If-Match on DeleteObject.
type deleteTransport struct {
	base http.RoundTripper

	mu        sync.Mutex
	log       []string
	afterHead map[string]func() // key -> write, run once
	// ignoreIfMatch: a DELETE carrying If-Match is not forwarded; the
	// object is deleted unconditionally by deleteAnyway and a 204 is
	// answered, as a server that ignores the header would.
	ignoreIfMatch bool
	deleteAnyway  func(key string) error
}

func (rt *deleteTransport) keyOf(req *http.Request) string {
	// Path-style: /bucket/key.
	p := strings.TrimPrefix(req.URL.Path, "/")
	if i := strings.IndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return ""
}

func (rt *deleteTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := rt.keyOf(req)
	if req.Method == http.MethodHead || req.Method == http.MethodDelete {
		rt.mu.Lock()
		rt.log = append(rt.log, req.Method+" "+key)
		rt.mu.Unlock()
	}
	if req.Method == http.MethodDelete && req.Header.Get("If-Match") != "" && rt.ignoreIfMatch {
		if err := rt.deleteAnyway(key); err != nil {
			return nil, err
		}
		return &http.Response{StatusCode: http.StatusNoContent, Status: "204 No Content", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
	}
	resp, err := rt.base.RoundTrip(req)
	if err == nil && req.Method == http.MethodHead {
		rt.mu.Lock()
		write := rt.afterHead[key]
		delete(rt.afterHead, key)
		rt.mu.Unlock()
		if write != nil {
			write()
		}
	}
	return resp, err
}

// requests returns and clears the log.
func (rt *deleteTransport) requests() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := rt.log
	rt.log = nil
	return out
}

func countOf(log []string, entry string) int {
	n := 0
	for _, l := range log {
		if l == entry {
			n++
		}
	}
	return n
}

// TestWritableMountConditionalDelete: Versity Gateway honours If-Match on
// DeleteObject, so a file deleted in the sandbox whose object changed
// remotely is reported as a conflict and kept, even when the change lands
// after the HEAD that used to be the only check (the race a plain delete
// lost). Once the server is known to honour the condition, deletes send no
// HEAD at all: the conditional delete alone catches a change, and an
// unchanged object is deleted.
func TestWritableMountConditionalDelete(t *testing.T) {
	testenv.Require(t, testenv.Root)
	var e *env
	rt := &deleteTransport{base: http.DefaultTransport, afterHead: map[string]func(){}}
	var raceErr error
	rt.afterHead["team/data/race.txt"] = func() {
		_, raceErr = e.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &e.bucket, Key: aws.String("team/data/race.txt"), Body: strings.NewReader("remote wins")})
	}
	e = newEnv(t, func(c *mount.Config) { c.HTTPClient = &http.Client{Transport: rt} })
	for _, k := range []string{"race", "changed", "plain", "kept"} {
		e.put(t, "team/data/"+k+".txt", k)
	}
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(manifest.TypeS3Mount, false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runAs := s.Manifest().RunAs

	// The first delete: changed right after its HEAD.
	if out, code := sh(t, s, runAs, "rm w/race.txt"); code != 0 {
		t.Fatal(out)
	}
	rt.requests()
	stats, err := e.mounter.Sync(ctx, s)
	if raceErr != nil {
		t.Fatal(raceErr)
	}
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/race.txt]" || stats.Deleted != 0 {
		t.Fatalf("Sync = %+v, %v; want a conflict on w/race.txt", stats, err)
	}
	if got, ok := e.get(t, "team/data/race.txt"); !ok || got != "remote wins" {
		t.Fatalf("race.txt = %q (present %v): the remote change was deleted", got, ok)
	}

	// Now known to honour the condition: changed between the listing and
	// the delete, caught by the delete itself, with no HEAD sent.
	e.put(t, "team/data/changed.txt", "changed remotely")
	if out, code := sh(t, s, runAs, "rm w/changed.txt w/plain.txt"); code != 0 {
		t.Fatal(out)
	}
	rt.requests()
	stats, err = e.mounter.Sync(ctx, s)
	log := rt.requests()
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/changed.txt w/race.txt]" || stats.Deleted != 1 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
	if got, ok := e.get(t, "team/data/changed.txt"); !ok || got != "changed remotely" {
		t.Fatalf("changed.txt = %q (present %v): deleted despite the remote change", got, ok)
	}
	if _, ok := e.get(t, "team/data/plain.txt"); ok {
		t.Fatal("plain.txt, unchanged remotely, was not deleted")
	}
	for _, k := range []string{"changed", "plain"} {
		if n := countOf(log, "HEAD team/data/"+k+".txt"); n != 0 {
			t.Fatalf("%s.txt was HEADed %d times before its conditional delete: %v", k, n, log)
		}
		if n := countOf(log, "DELETE team/data/"+k+".txt"); n != 1 {
			t.Fatalf("%s.txt: %d DELETEs, want 1: %v", k, n, log)
		}
	}
	if got, _ := e.get(t, "team/data/kept.txt"); got != "kept" {
		t.Fatalf("kept.txt = %q", got)
	}
}

// TestWritableMountDeleteOnServerIgnoringIfMatch: a server that ignores
// If-Match on DeleteObject (played by the transport) is detected at the
// first delete, and from then on every delete is checked with a HEAD
// first: an object changed remotely is a conflict and kept, an unchanged
// one is deleted.
func TestWritableMountDeleteOnServerIgnoringIfMatch(t *testing.T) {
	testenv.Require(t, testenv.Root)
	var e *env
	rt := &deleteTransport{base: http.DefaultTransport, ignoreIfMatch: true}
	rt.deleteAnyway = func(key string) error {
		_, err := e.s3.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: &e.bucket, Key: aws.String(key)})
		return err
	}
	e = newEnv(t, func(c *mount.Config) { c.HTTPClient = &http.Client{Transport: rt} })
	for _, k := range []string{"first", "changed", "plain"} {
		e.put(t, "team/data/"+k+".txt", k)
	}
	s := e.session(t, map[string]*manifest.Entry{"w": e.mountEntry(manifest.TypeS3Mount, false)})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runAs := s.Manifest().RunAs
	if out, code := sh(t, s, runAs, "rm w/first.txt"); code != 0 {
		t.Fatal(out)
	}
	if stats, err := e.mounter.Sync(ctx, s); err != nil || stats.Deleted != 1 {
		t.Fatalf("first Sync = %+v, %v", stats, err)
	}
	if _, ok := e.get(t, "team/data/first.txt"); ok {
		t.Fatal("first.txt was not deleted")
	}
	e.put(t, "team/data/changed.txt", "changed remotely")
	if out, code := sh(t, s, runAs, "rm w/changed.txt w/plain.txt"); code != 0 {
		t.Fatal(out)
	}
	rt.requests()
	stats, err := e.mounter.Sync(ctx, s)
	log := rt.requests()
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/changed.txt]" || stats.Deleted != 1 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
	if got, ok := e.get(t, "team/data/changed.txt"); !ok || got != "changed remotely" {
		t.Fatalf("changed.txt = %q (present %v): deleted despite the remote change", got, ok)
	}
	if _, ok := e.get(t, "team/data/plain.txt"); ok {
		t.Fatal("plain.txt was not deleted")
	}
	for _, k := range []string{"changed", "plain"} {
		if n := countOf(log, "HEAD team/data/"+k+".txt"); n != 1 {
			t.Fatalf("%s.txt: %d HEADs before deleting on a server that ignores If-Match, want 1: %v", k, n, log)
		}
	}
	if n := countOf(log, "DELETE team/data/changed.txt"); n != 0 {
		t.Fatalf("changed.txt: a DELETE was sent: %v", log)
	}
}
