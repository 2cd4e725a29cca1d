package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/s3server"
)

// TestSandboxMountFromTheCLI: `harness sandbox create` with a manifest
// holding an s3_mount brings the bucket prefix in, with the credentials
// the manifest names read from the harness's environment (never the
// sandbox's); --mount-max-bytes refuses a larger prefix with nothing made.
func TestSandboxMountFromTheCLI(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	ctx := t.Context()
	for key, body := range map[string]string{"data/a.csv": "q,v\n1,2\n", "data/sub/b.txt": "beta\n", "other/c.txt": "no"} {
		if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(body)}); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("BH_TEST_MOUNT_ID", srv.AccessKey)
	t.Setenv("BH_TEST_MOUNT_SECRET", srv.SecretKey)
	dir := t.TempDir()
	m := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(m, []byte(`version: 1
entries:
  data:
    type: s3_mount
    bucket: `+bucket+`
    prefix: data
    endpoint: `+srv.Endpoint+`
    credentials: {access_key_id: {secret: BH_TEST_MOUNT_ID}, secret_access_key: {secret: BH_TEST_MOUNT_SECRET}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	state := testenv.SearchableTempDir(t)
	run := newCLIRun(ctx, state, agentdtest.Binaries(t).Agentd)
	t.Cleanup(func() { newCLIRun(context.Background(), state, agentdtest.Binaries(t).Agentd)("sandbox", "rm", "mt") })

	if code, _, errOut := run("--mount-max-bytes", "5", "sandbox", "create", "--id", "big", "--manifest", m); code == 0 ||
		!strings.Contains(errOut, "resource exhausted") && !strings.Contains(errOut, "limit") {
		t.Fatalf("a prefix over --mount-max-bytes: exit %d, stderr %q", code, errOut)
	}
	if out := mustRun(t, run, "sandbox", "ls"); strings.Contains(out, "big") {
		t.Fatalf("the refused sandbox was left behind:\n%s", out)
	}
	mustRun(t, run, "sandbox", "create", "--id", "mt", "--manifest", m)
	out := mustRun(t, run, "sandbox", "exec", "mt", "--", "sh", "-c", "cat data/a.csv data/sub/b.txt; ls data; env")
	if !strings.Contains(out, "q,v\n1,2\nbeta\n") || strings.Contains(out, "c.txt") {
		t.Fatalf("the mount's files:\n%s", out)
	}
	if strings.Contains(out, srv.SecretKey) || strings.Contains(out, srv.AccessKey) {
		t.Fatalf("the mount's credentials reached the sandbox:\n%s", out)
	}
	st, err := os.ReadFile(filepath.Join(state, "sessions", "mt.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(st), srv.SecretKey) {
		t.Fatal("the session state holds the secret key")
	}
}
