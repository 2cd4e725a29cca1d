// Package s3server starts a real S3-compatible server for tests: Versity
// Gateway (versitygw) over a POSIX directory, listening on loopback.
//
// The binary is built from the Go module proxy once per machine, into the
// user cache directory, under a file lock so that test binaries running in
// parallel wait for one build instead of racing. A test that cannot have
// the server skips through internal/testing/testenv (and so fails under CI=true).
package s3server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gotool"
)

// Version is the versitygw release the tests run.
const Version = "v1.8.0"

// pkg is what `go install` builds.
const pkg = "github.com/versity/versitygw/cmd/versitygw"

// buildTimeout bounds a cold build (module download and compile).
const buildTimeout = 20 * time.Minute

// Server is a running versitygw.
type Server struct {
	// Endpoint is the base URL (http://127.0.0.1:PORT).
	Endpoint string
	// AccessKey and SecretKey are the root user's credentials.
	AccessKey, SecretKey string
	// Region is the region the server signs with.
	Region string
	// Dir is the POSIX directory holding the buckets.
	Dir string

	bin  string
	addr string
	proc *gotool.Process
	logw io.Writer
}

// program is Versity Gateway as gotool builds it.
var program = gotool.Program{Name: "versitygw", Package: pkg, Version: Version, Timeout: buildTimeout}

// Binary returns the path of the versitygw binary, building it first if
// needed (gotool: once per machine, under the user cache directory).
func Binary(ctx context.Context) (string, error) { return program.Install(ctx) }

// Start builds (once) and starts a server on a free loopback port over a
// fresh directory; it stops when the test ends. Without the binary the
// test is skipped through testenv (failed under CI=true).
func Start(t testing.TB) *Server {
	t.Helper()
	return gotool.StartTest(t, program, "no versitygw S3 server", func(ctx context.Context, logw io.Writer) (*Server, error) {
		return Run(ctx, t.TempDir(), logw)
	})
}

// Run builds (once) and starts a server on a free loopback port over dir
// (created if needed),
// with fresh random root credentials, its output going to logw. The caller
// stops it.
func Run(ctx context.Context, dir string, logw io.Writer) (*Server, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("versitygw: %w", err)
	}
	s := &Server{bin: bin, Dir: dir, Region: "us-east-1", AccessKey: "bulkhead" + randHex(6), SecretKey: randHex(20), logw: logw}
	if s.addr, err = gotool.LoopbackAddr(); err != nil {
		return nil, fmt.Errorf("versitygw: %w", err)
	}
	s.Endpoint = "http://" + s.addr
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// start runs the server and waits until it answers.
func (s *Server) start() error {
	cmd := exec.Command(s.bin, "--port", s.addr, "--quiet", "posix", s.Dir)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKey, "ROOT_SECRET_KEY="+s.SecretKey, "VGW_REGION="+s.Region)
	cmd.Stdout, cmd.Stderr = s.logw, s.logw
	var err error
	s.proc, err = gotool.Launch("versitygw", cmd, 30*time.Second, gotool.Answers(s.Endpoint+"/", 0)) // any answer
	return err
}

// Stop kills the server at once (as a crash would); a stopped server
// refuses connections. Stopping twice is fine.
func (s *Server) Stop() { s.proc.Stop() }

// Restart starts a stopped server again on the same address and directory.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// Client returns an SDK client with the root credentials.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{Region: s.Region, BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, "")})
}

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
	name := "b-" + randHex(6)
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name}); err != nil {
		return "", fmt.Errorf("create bucket %s: %w", name, err)
	}
	return name, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
