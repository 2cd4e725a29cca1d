package cli

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/azureserver"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
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

// TestSandboxAzureAndS3FilesMountsFromTheCLI: `harness sandbox create`
// with an azure_blob_mount (account key from the harness's environment,
// checked by the in-test Blob server's own Shared Key verifier) and an
// s3_files_mount (its file system's bucket given by --s3-file-system)
// brings both in, with no credential in the sandbox; an unknown file
// system is refused with nothing made.
func TestSandboxAzureAndS3FilesMountsFromTheCLI(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	ctx := t.Context()
	if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("fsroot/shared/f.txt"), Body: strings.NewReader("from the file system\n")}); err != nil {
		t.Fatal(err)
	}
	az := azureserver.Start(t, "bhcli", "box", false)
	az.Put("box", "in/blob.txt", "from azure\n")
	t.Setenv("BH_TEST_MOUNT_ID", srv.AccessKey)
	t.Setenv("BH_TEST_MOUNT_SECRET", srv.SecretKey)
	t.Setenv("BH_TEST_AZURE_KEY", az.KeyB64)
	dir := t.TempDir()
	m := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(m, []byte(`version: 1
entries:
  blobs:
    type: azure_blob_mount
    account: bhcli
    container: box
    prefix: in
    endpoint: `+az.Endpoint()+`
    credentials: {account_key: {secret: BH_TEST_AZURE_KEY}}
  fs:
    type: s3_files_mount
    file_system_id: fs-0123456789abcdef0
    region: `+srv.Region+`
    subpath: /shared
    mount_target_ip: 10.1.2.3
`), 0o644); err != nil {
		t.Fatal(err)
	}
	state := testenv.SearchableTempDir(t)
	run := newCLIRun(ctx, state, agentdtest.Binaries(t).Agentd)
	t.Cleanup(func() { newCLIRun(context.Background(), state, agentdtest.Binaries(t).Agentd)("sandbox", "rm", "azfs") })
	if code, _, errOut := run("sandbox", "create", "--id", "nofs", "--manifest", m); code == 0 || !strings.Contains(errOut, "fs-0123456789abcdef0") {
		t.Fatalf("an unconfigured file system: exit %d, stderr %q", code, errOut)
	}
	if out := mustRun(t, run, "sandbox", "ls"); strings.Contains(out, "nofs") {
		t.Fatalf("the refused sandbox was left behind:\n%s", out)
	}
	fsFlag := "fs-0123456789abcdef0=s3://" + bucket + "/fsroot?endpoint=" + url.QueryEscape(srv.Endpoint) + "&region=" + srv.Region +
		"&access_key_id=BH_TEST_MOUNT_ID&secret_access_key=BH_TEST_MOUNT_SECRET"
	mustRun(t, run, "--s3-file-system", fsFlag, "sandbox", "create", "--id", "azfs", "--manifest", m)
	out := mustRun(t, run, "sandbox", "exec", "azfs", "--", "sh", "-c", "cat blobs/blob.txt fs/f.txt; env")
	if !strings.HasPrefix(out, "from azure\nfrom the file system\n") {
		t.Fatalf("the mounts' files:\n%s", out)
	}
	for _, secret := range []string{srv.SecretKey, srv.AccessKey, az.KeyB64} {
		if strings.Contains(out, secret) {
			t.Fatalf("a mount credential reached the sandbox:\n%s", out)
		}
	}
	if verified, refused, _, _, _ := az.Stats(); verified == 0 || refused != 0 {
		t.Fatalf("azure server: %d verified, %d refused", verified, refused)
	}
}

// TestS3FileSystemFlag: --s3-file-system values become the Mounter's
// file system table; malformed ones are usage errors.
func TestS3FileSystemFlag(t *testing.T) {
	fss, err := parseS3FileSystems([]string{"fs-0123456789abcdef0=s3://bkt/a/b/?region=eu-west-1&endpoint=http%3A%2F%2F127.0.0.1%3A9000&access_key_id=ID&secret_access_key=SK&access_point=fsap-0123456789abcdef0:/teams/a"})
	if err != nil {
		t.Fatal(err)
	}
	fs := fss["fs-0123456789abcdef0"]
	if fs.Bucket != "bkt" || fs.Prefix != "a/b" || fs.Region != "eu-west-1" || fs.Endpoint != "http://127.0.0.1:9000" ||
		fs.Credentials["access_key_id"].Name != "ID" || fs.Credentials["secret_access_key"].Name != "SK" || fs.AccessPoints["fsap-0123456789abcdef0"] != "/teams/a" {
		t.Fatalf("parsed %+v", fs)
	}
	for _, bad := range []string{"bkt", "fs-1=bkt/x", "fs-1=gs://b", "fs-1=s3://b?colour=red", "fs-1=s3://b?access_point=fsap-1", "fs-1=s3://b?region="} {
		if _, err := parseS3FileSystems([]string{bad}); !errors.Is(err, compute.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
