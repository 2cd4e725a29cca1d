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

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
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

// startDeleteSession starts an S3 env on st whose Mounter sends through
// rt, with the objects named (each holding its name) under a writable
// mount "w" of a started session.
func startDeleteSession(t *testing.T, st *storage, rt *deleteTransport, names ...string) (*env, *compute.Session) {
	t.Helper()
	rt.base = http.DefaultTransport
	e := newEnvOn(t, st, func(c *testConfig) { c.HTTPClient = &http.Client{Transport: rt} }, nil)
	for _, k := range names {
		e.put(t, k+".txt", k)
	}
	return e, e.started(t, map[string]*manifest.Entry{"w": e.entry(false)})
}

// deleteChangedAndPlain changes changed.txt remotely, deletes changed.txt
// and plain.txt in the sandbox and syncs: changed.txt is a conflict (the
// conflicts are wantConflicts) and kept, plain.txt is deleted. It returns
// the HEAD and DELETE requests the sync sent.
func deleteChangedAndPlain(t *testing.T, e *env, s *compute.Session, rt *deleteTransport, wantConflicts string) []string {
	t.Helper()
	e.put(t, "changed.txt", "changed remotely")
	asRunAs(t, s, "rm w/changed.txt w/plain.txt")
	rt.requests()
	stats, err := e.mounter.Sync(ctxT(t), s)
	log := rt.requests()
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != wantConflicts || stats.Deleted != 1 {
		t.Fatalf("second Sync = %+v, %v", stats, err)
	}
	if got, ok := e.get(t, "changed.txt"); !ok || got != "changed remotely" {
		t.Fatalf("changed.txt = %q (present %v): deleted despite the remote change", got, ok)
	}
	if _, ok := e.get(t, "plain.txt"); ok {
		t.Fatal("plain.txt, unchanged remotely, was not deleted")
	}
	return log
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
	st := s3Storage(t, manifest.TypeS3Mount)
	var raceErr error
	rt := &deleteTransport{afterHead: map[string]func(){"team/data/race.txt": func() {
		raceErr = st.putObject(context.Background(), "team/data/race.txt", "remote wins")
	}}}
	e, s := startDeleteSession(t, st, rt, "race", "changed", "plain", "kept")

	// The first delete: changed right after its HEAD.
	asRunAs(t, s, "rm w/race.txt")
	rt.requests()
	stats, err := e.mounter.Sync(ctxT(t), s)
	if raceErr != nil {
		t.Fatal(raceErr)
	}
	if !errors.Is(err, errkind.ErrConflict) || fmt.Sprint(stats.Conflicts) != "[w/race.txt]" || stats.Deleted != 0 {
		t.Fatalf("Sync = %+v, %v; want a conflict on w/race.txt", stats, err)
	}
	if got, ok := e.get(t, "race.txt"); !ok || got != "remote wins" {
		t.Fatalf("race.txt = %q (present %v): the remote change was deleted", got, ok)
	}

	// Now known to honour the condition: changed between the listing and
	// the delete, caught by the delete itself, with no HEAD sent.
	log := deleteChangedAndPlain(t, e, s, rt, "[w/changed.txt w/race.txt]")
	for _, k := range []string{"changed", "plain"} {
		if n := countOf(log, "HEAD team/data/"+k+".txt"); n != 0 {
			t.Fatalf("%s.txt was HEADed %d times before its conditional delete: %v", k, n, log)
		}
		if n := countOf(log, "DELETE team/data/"+k+".txt"); n != 1 {
			t.Fatalf("%s.txt: %d DELETEs, want 1: %v", k, n, log)
		}
	}
	if got, _ := e.get(t, "kept.txt"); got != "kept" {
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
	st := s3Storage(t, manifest.TypeS3Mount)
	rt := &deleteTransport{ignoreIfMatch: true, deleteAnyway: func(key string) error {
		_, err := st.s3.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: &st.bucket, Key: aws.String(key)})
		return err
	}}
	e, s := startDeleteSession(t, st, rt, "first", "changed", "plain")
	asRunAs(t, s, "rm w/first.txt")
	if stats, err := e.mounter.Sync(ctxT(t), s); err != nil || stats.Deleted != 1 {
		t.Fatalf("first Sync = %+v, %v", stats, err)
	}
	if _, ok := e.get(t, "first.txt"); ok {
		t.Fatal("first.txt was not deleted")
	}
	log := deleteChangedAndPlain(t, e, s, rt, "[w/changed.txt]")
	for _, k := range []string{"changed", "plain"} {
		if n := countOf(log, "HEAD team/data/"+k+".txt"); n != 1 {
			t.Fatalf("%s.txt: %d HEADs before deleting on a server that ignores If-Match, want 1: %v", k, n, log)
		}
	}
	if n := countOf(log, "DELETE team/data/changed.txt"); n != 0 {
		t.Fatalf("changed.txt: a DELETE was sent: %v", log)
	}
}
