package e2e

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gcsserver"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
)

// TestSecretCanaryMounts is the secret-canary attack of TestSecretCanary
// with remote mounts whose credentials are canaries too: a writable
// s3_mount on a real S3 server (Versity Gateway) whose root access key id
// and secret key are canaries, and a gcs_mount on fake-gcs-server with a
// canary access token. The manifest names the secrets; their values are
// only in the harness's environment. In every mode the canary attack
// runs, the mounted files must be in the sandbox, the file the sandbox
// wrote into the S3 mount must reach the bucket (the harness signed that
// upload too), and no credential may be found by the probe, in the
// harness's output (verbose logs and stdout traces) or in its state
// directory.
func TestSecretCanaryMounts(t *testing.T) {
	// The probe looks for this prefix; every credential starts with it.
	accessKey := "bulkhead-canary-" + randomHex(t)
	secretKey := "bulkhead-canary-" + randomHex(t)
	gcsToken := "bulkhead-canary-" + randomHex(t)

	// Versity Gateway's root credentials are the canaries: it is started
	// with fresh random ones, then restarted (same directory and port)
	// with ours.
	s3srv := s3server.Start(t)
	s3srv.AccessKey, s3srv.SecretKey = accessKey, secretKey
	s3srv.Restart(t)
	gcs := gcsserver.Start(t)

	probeDir := buildProbe(t)
	for _, run := range canaryRuns() {
		t.Run(run.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			bucket := s3srv.Bucket(t)
			s3Body := "from s3 " + randomHex(t) + "\n"
			if _, err := s3srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("in/hello.txt"),
				Body: strings.NewReader(s3Body)}); err != nil {
				t.Fatal(err)
			}
			gcsBucket := gcs.Bucket(t)
			gcsBody := "from gcs " + randomHex(t) + "\n"
			if _, err := gcs.Put(ctx, gcsBucket, "in/hello.txt", []byte(gcsBody)); err != nil {
				t.Fatal(err)
			}
			// The manifest sits beside the probe (its local_file source),
			// in a directory of its own per mode.
			dir, err := os.MkdirTemp(probeDir, "run-")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(filepath.Join(probeDir, "canaryprobe"), filepath.Join(dir, "canaryprobe")); err != nil {
				t.Fatal(err)
			}
			manifestPath := filepath.Join(dir, "manifest.yaml")
			if err := os.WriteFile(manifestPath, []byte(probeManifest+`  s3data:
    type: s3_mount
    bucket: `+bucket+`
    prefix: in
    region: `+s3srv.Region+`
    endpoint: `+s3srv.Endpoint+`
    read_only: false
    credentials: {access_key_id: {secret: BH_E2E_S3_ID}, secret_access_key: {secret: BH_E2E_S3_SECRET}}
  gcsdata:
    type: gcs_mount
    bucket: `+gcsBucket+`
    prefix: in
    endpoint: `+gcs.Endpoint+`
    credentials: {access_token: {secret: BH_E2E_GCS_TOKEN}}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			res := runCanary(t, run, canaryCase{
				manifest:  manifestPath,
				before:    "cat s3data/hello.txt gcsdata/hello.txt && echo written > s3data/new.txt",
				env:       []string{"BH_E2E_S3_ID=" + accessKey, "BH_E2E_S3_SECRET=" + secretKey, "BH_E2E_GCS_TOKEN=" + gcsToken},
				secrets:   []string{accessKey, secretKey, gcsToken},
				extraArgs: []string{"--verbose", "--trace", "stdout"},
			})
			if !strings.Contains(res.probe, "\n"+s3Body+gcsBody) {
				t.Errorf("the mounted files are not in the sandbox; the command printed:\n%s", res.probe)
			}
			// The harness uploaded the sandbox's new file when the session
			// stopped: the mount was real both ways.
			obj, err := s3srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("in/new.txt")})
			if err != nil {
				t.Fatalf("the file written into the writable mount did not reach the bucket: %v\nstderr:\n%s", err, tail(res.stderr, 40))
			}
			defer obj.Body.Close()
			if b, _ := io.ReadAll(obj.Body); string(b) != "written\n" {
				t.Errorf("uploaded new.txt = %q", b)
			}
			// The checks are not vacuous: the verbose log and the traces
			// were there to search.
			if !strings.Contains(res.stderr, "s3data") {
				t.Errorf("the harness's verbose output never mentions the mount:\n%s", tail(res.stderr, 40))
			}
		})
	}
}
