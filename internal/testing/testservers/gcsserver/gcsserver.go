// Package gcsserver starts a real Google Cloud Storage JSON API server for
// tests: fake-gcs-server (github.com/fsouza/fake-gcs-server) in its HTTP
// mode with its filesystem backend, listening on loopback. It accepts any
// bearer token.
//
// The binary is built from the Go module proxy once per machine, into the
// user cache directory, under a file lock (as internal/testing/testservers/s3server
// builds Versity Gateway). A test that cannot have the server skips
// through internal/testing/testenv (and so fails under CI=true).
package gcsserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gotool"
)

// Version is the fake-gcs-server release the tests run.
const Version = "v1.56.1"

// pkg is what `go install` builds.
const pkg = "github.com/fsouza/fake-gcs-server"

// buildTimeout bounds a cold build (module download and compile: about
// two and a half minutes on 2 cores).
const buildTimeout = 20 * time.Minute

// Server is a running fake-gcs-server.
type Server struct {
	// Endpoint is the base URL (http://127.0.0.1:PORT), the endpoint of
	// a gcs_mount entry.
	Endpoint string
	// Dir holds the objects (the filesystem backend: unlike the memory
	// one, its reads and writes do not slow down as a bucket grows).
	Dir string

	bin  string
	seed string
	addr string
	proc *gotool.Process
	logw io.Writer
	hc   *http.Client
}

// program is fake-gcs-server as gotool builds it.
var program = gotool.Program{Name: "fake-gcs-server", Package: pkg, Version: Version, Timeout: buildTimeout}

// Binary returns the path of the fake-gcs-server binary, building it first
// if needed (gotool: once per machine, under the user cache directory).
func Binary(ctx context.Context) (string, error) { return program.Install(ctx) }

func tail(b []byte) string { return gotool.Tail(b) }

// Start builds (once) and starts a server on a free loopback port; it
// stops when the test ends. Without the binary the test is skipped
// through testenv (failed under CI=true).
func Start(t testing.TB) *Server {
	t.Helper()
	return StartSeeded(t, "")
}

// StartSeeded is Start with buckets loaded at start from seed (when not
// ""): each directory in seed is a bucket, each file below it an object
// named by its slash-separated relative path. Much faster than uploading
// many objects one by one.
func StartSeeded(t testing.TB, seed string) *Server {
	t.Helper()
	return gotool.StartTest(t, program, "no fake-gcs-server", func(ctx context.Context, logw io.Writer) (*Server, error) {
		return run(ctx, MemoryDir(t), seed, logw)
	})
}

// MemoryDir returns a fresh directory for a test's objects, removed when
// the test ends: on /dev/shm when it has room (the filesystem backend
// syncs every object it writes, which on a disk costs milliseconds each),
// else the test's temporary directory.
func MemoryDir(t testing.TB) string {
	t.Helper()
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && int64(st.Bavail)*int64(st.Bsize) >= 1<<30 {
		if dir, err := os.MkdirTemp("/dev/shm", "bulkhead-gcs-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

// Run builds (once) and starts a server on a free loopback port over dir
// (created if needed), its output going to logw. The caller stops it.
func Run(ctx context.Context, dir string, logw io.Writer) (*Server, error) {
	return run(ctx, dir, "", logw)
}

func run(ctx context.Context, dir, seed string, logw io.Writer) (*Server, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fake-gcs-server: %w", err)
	}
	addr, err := gotool.LoopbackAddr()
	if err != nil {
		return nil, fmt.Errorf("fake-gcs-server: %w", err)
	}
	s := &Server{bin: bin, addr: addr, Endpoint: "http://" + addr, Dir: dir, seed: seed, logw: logw, hc: &http.Client{Timeout: time.Minute}}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// start runs the server and waits until it answers.
func (s *Server) start() error {
	host, port, _ := net.SplitHostPort(s.addr)
	args := []string{"-scheme", "http", "-host", host, "-port", port, "-backend", "filesystem", "-filesystem-root", s.Dir,
		"-public-host", s.addr, "-external-url", s.Endpoint, "-log-level", "warn"}
	if s.seed != "" {
		args = append(args, "-data", s.seed)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = os.TempDir()
	cmd.Stdout, cmd.Stderr = s.logw, s.logw
	var err error
	s.proc, err = gotool.Launch("fake-gcs-server", cmd, 30*time.Second, gotool.Answers(s.Endpoint+"/storage/v1/b", http.StatusOK)) // lists its buckets
	return err
}

// Stop kills the server at once.
// Stopping twice is fine.
func (s *Server) Stop() { s.proc.Stop() }

// Bucket creates a bucket with a fresh name and returns the name.
func (s *Server) Bucket(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, err := s.CreateBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// CreateBucket creates a bucket with a fresh name and returns the name.
func (s *Server) CreateBucket(ctx context.Context) (string, error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "b-" + hex.EncodeToString(b)
	body, _ := json.Marshal(map[string]string{"name": name})
	if _, err := s.call(ctx, http.MethodPost, s.Endpoint+"/storage/v1/b", "application/json", strings.NewReader(string(body))); err != nil {
		return "", fmt.Errorf("create bucket %s: %w", name, err)
	}
	return name, nil
}

// Put writes an object and returns its new generation.
func (s *Server) Put(ctx context.Context, bucket, name string, data []byte) (string, error) {
	q := url.Values{"uploadType": {"media"}, "name": {name}}
	raw, err := s.call(ctx, http.MethodPost, s.Endpoint+"/upload/storage/v1/b/"+url.PathEscape(bucket)+"/o?"+q.Encode(), "application/octet-stream", strings.NewReader(string(data)))
	if err != nil {
		return "", fmt.Errorf("put %s: %w", name, err)
	}
	var o struct {
		Generation string `json:"generation"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("put %s: %w", name, err)
	}
	return o.Generation, nil
}

// Get reads an object; found is false when there is none.
func (s *Server) Get(ctx context.Context, bucket, name string) (data []byte, found bool, err error) {
	raw, err := s.call(ctx, http.MethodGet, s.objectURL(bucket, name)+"?alt=media", "", nil)
	var se *statusError
	if errors.As(err, &se) && se.status == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get %s: %w", name, err)
	}
	return raw, true, nil
}

// Generation returns an object's generation ("" when there is none).
func (s *Server) Generation(ctx context.Context, bucket, name string) (string, error) {
	raw, err := s.call(ctx, http.MethodGet, s.objectURL(bucket, name), "", nil)
	var se *statusError
	if errors.As(err, &se) && se.status == http.StatusNotFound {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var o struct {
		Generation string `json:"generation"`
	}
	err = json.Unmarshal(raw, &o)
	return o.Generation, err
}

func (s *Server) objectURL(bucket, name string) string {
	return s.Endpoint + "/storage/v1/b/" + url.PathEscape(bucket) + "/o/" + url.PathEscape(name)
}

type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string { return "HTTP " + strconv.Itoa(e.status) + ": " + e.body }

func (s *Server) call(ctx context.Context, method, u, contentType string, body io.Reader) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer test")
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, &statusError{status: resp.StatusCode, body: tail(raw)}
	}
	return raw, nil
}
