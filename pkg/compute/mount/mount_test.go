package mount_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/gcsmount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/s3mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// The S3 mount's own tests; what every backend does is in suite_test.go.

// TestMountManyObjects: 1,000 small objects listed 37 keys a page arrive
// whole, and a change to one of them syncs only that one.
func TestMountManyObjects(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnv(t, func(c *testConfig) { c.PageSize = 37; c.Concurrency = 4 })
	ctx := ctxT(t)
	const n = 1000
	name := func(i int) string { return fmt.Sprintf("d%02d/f%04d.txt", i%10, i) }
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- e.putObject(ctx, e.root+name(i), fmt.Sprintf("object %d\n", i))
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s := e.started(t, map[string]*manifest.Entry{"bulk": e.entry(false)})
	var files int
	for _, f := range s.Materialized().Files {
		if strings.HasPrefix(f.Path, "bulk/") {
			files++
		}
	}
	if files != n {
		t.Fatalf("materialized %d files, want %d", files, n)
	}
	assertBulk(t, e, s, n, name)
}

// TestOtherMountTypesRefused: an azure_blob_mount naming no credentials
// without a default Azure credential, an s3_files_mount of a file system
// the harness has no bucket for (see s3files_test.go) and a gcs_mount
// without credentials are each refused with a clear error before a
// sandbox is touched.
func TestOtherMountTypesRefused(t *testing.T) {
	m, err := mount.New(withAll(mount.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeAzureBlobMount,
		Mount: &manifest.Mount{Account: "a", Container: "c"}}})
	if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "azuremount.Config.Credential") {
		t.Fatalf("azure_blob_mount: %v", err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeS3FilesMount,
		Mount: &manifest.Mount{FileSystemID: "fs-0123456789abcdef0", Region: "us-east-1"}}})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fs-0123456789abcdef0") {
		t.Fatalf("s3_files_mount: %v", err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeGCSMount,
		Mount: &manifest.Mount{Bucket: "b"}}})
	if !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "gcsmount.Config.Tokens") {
		t.Fatalf("gcs_mount without credentials: %v", err)
	}
}

// TestBackendsChooseTheMountTypes: a Mounter serves the mount types of
// the backends it was given and refuses the others (Unimplemented, naming
// the type) before a sandbox is touched; two backends for one type are a
// configuration error.
func TestBackendsChooseTheMountTypes(t *testing.T) {
	m, err := mount.New(mount.Config{Backends: []mount.Backend{gcsmount.New(gcsmount.Config{})}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeS3Mount,
		Mount: &manifest.Mount{Bucket: "b"}}})
	if !errors.Is(err, errkind.ErrUnimplemented) || !strings.Contains(err.Error(), "s3_mount") || !strings.Contains(err.Error(), "mount.Config.Backends") {
		t.Fatalf("s3_mount without its backend: %v", err)
	}
	_, err = m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: &manifest.Entry{Type: manifest.TypeGCSMount,
		Mount: &manifest.Mount{Bucket: "b"}}})
	if !errors.Is(err, errkind.ErrFailedPrecondition) { // served: refused for its missing credentials
		t.Fatalf("gcs_mount: %v", err)
	}
	if _, err := mount.New(mount.Config{Backends: []mount.Backend{s3mount.New(s3mount.Config{}), s3mount.New(s3mount.Config{})}}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("two backends for s3_mount: %v", err)
	}
	if _, err := mount.New(mount.Config{Backends: []mount.Backend{nil}}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("a nil backend: %v", err)
	}
}

// TestMountCredentialsRedacted: a mount whose credentials the storage
// refuses fails with Unauthenticated, and its error never carries the
// secret.
func TestMountCredentialsRedacted(t *testing.T) {
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	const wrong = "wrong-secret-value-0123456789"
	m, err := mount.New(withAll(mount.Config{MaxAttempts: 1, Secrets: manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
		if name == "ID" {
			return srv.AccessKey, nil
		}
		return wrong, nil
	})}))
	if err != nil {
		t.Fatal(err)
	}
	e := &manifest.Entry{Type: manifest.TypeS3Mount, Mount: &manifest.Mount{Bucket: bucket, Endpoint: srv.Endpoint,
		Credentials: map[string]manifest.SecretRef{"access_key_id": manifest.Secret("ID"), "secret_access_key": manifest.Secret("SK")}}}
	_, err = m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: e})
	if !errors.Is(err, errkind.ErrUnauthenticated) || strings.Contains(err.Error(), wrong) {
		t.Fatalf("PlanMount = %v", err)
	}
	// No credentials named and no default: refused up front.
	e.Mount.Credentials = nil
	if _, err := m.PlanMount(ctxT(t), materializer.MountRequest{Path: "data", Entry: e}); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("PlanMount without credentials = %v", err)
	}
}
