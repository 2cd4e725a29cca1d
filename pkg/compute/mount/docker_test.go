package mount_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/gcsserver"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// TestMountsDocker: the same mounts in a Docker sandbox (the daemon only
// receives bytes, so nothing is provider-specific): a read-only mount
// with exact bytes that run_as cannot change, a writable one uploaded back
// at Close, and no credential in the container.
func TestMountsDocker(t *testing.T) {
	testenv.Require(t, testenv.Docker)
	api, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	if _, err := api.ImageInspect(ctxT(t), docker.DefaultImage); err != nil {
		testenv.Skip(t, "the sandbox image "+docker.DefaultImage+" is not built (make image-sandbox): "+err.Error())
	}
	e := newEnvWith(t, nil, func(opts compute.ClientOptions) (*compute.Client, error) {
		p, err := docker.New(docker.Config{StateDir: testenv.SearchableTempDir(t), Labels: map[string]string{"test.bulkhead.mount": "1"}},
			zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = p.Close() })
		return compute.NewClient(p, opts), nil
	})
	e.put(t, "team/data/readme.md", "# hello\n")
	e.put(t, "team/data/sub/edit.txt", "before")
	s := e.session(t, map[string]*manifest.Entry{
		"ro": e.mountEntry(manifest.TypeS3Mount, true),
		"rw": e.mountEntry(manifest.TypeS3Mount, false),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, s, "ro/sub/edit.txt"); got != "before" {
		t.Fatalf("ro/sub/edit.txt = %q", got)
	}
	runAs := s.Manifest().RunAs
	if out, code := sh(t, s, runAs, "echo x >> ro/readme.md"); code == 0 {
		t.Fatalf("run_as %q wrote a read-only mount: %s", runAs, out)
	}
	if out, code := sh(t, s, runAs, "printf after > rw/sub/edit.txt && printf new > rw/new.txt"); code != 0 {
		t.Fatalf("run_as %q could not write the writable mount: %s", runAs, out)
	}
	if out, _ := sh(t, s, runAs, "env; grep -r -F -l -- '"+e.srv.SecretKey+"' . ; true"); strings.Contains(out, e.srv.SecretKey) {
		t.Fatalf("the secret reached the container:\n%s", out)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"team/data/sub/edit.txt": "after", "team/data/new.txt": "new", "team/data/readme.md": "# hello\n"} {
		if got, _ := e.get(t, key); got != want {
			t.Fatalf("%s = %q, want %q", key, got, want)
		}
	}
}

// TestGCSMountDocker: a gcs_mount in a Docker sandbox: exact bytes that
// run_as cannot change in a read-only mount, a writable one uploaded back
// at Close, no token in the container.
func TestGCSMountDocker(t *testing.T) {
	testenv.Require(t, testenv.Docker)
	api, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	if _, err := api.ImageInspect(ctxT(t), docker.DefaultImage); err != nil {
		testenv.Skip(t, "the sandbox image "+docker.DefaultImage+" is not built (make image-sandbox): "+err.Error())
	}
	srv := gcsserver.Start(t)
	e := newGCSEnvWith(t, &gcsEnv{srv: srv, bucket: srv.Bucket(t), newClient: func(opts compute.ClientOptions) (*compute.Client, error) {
		p, err := docker.New(docker.Config{StateDir: testenv.SearchableTempDir(t), Labels: map[string]string{"test.bulkhead.mount": "1"}},
			zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = p.Close() })
		return compute.NewClient(p, opts), nil
	}}, nil)
	e.put(t, "team/data/readme.md", "# hello\n")
	e.put(t, "team/data/sub/edit.txt", "before")
	s := e.session(t, map[string]*manifest.Entry{"ro": e.mountEntry(true), "rw": e.mountEntry(false)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, s, "ro/sub/edit.txt"); got != "before" {
		t.Fatalf("ro/sub/edit.txt = %q", got)
	}
	runAs := s.Manifest().RunAs
	if out, code := sh(t, s, runAs, "echo x >> ro/readme.md"); code == 0 {
		t.Fatalf("run_as %q wrote a read-only mount: %s", runAs, out)
	}
	if out, code := sh(t, s, runAs, "printf after > rw/sub/edit.txt && printf new > rw/new.txt"); code != 0 {
		t.Fatalf("run_as %q could not write the writable mount: %s", runAs, out)
	}
	if out, _ := sh(t, s, runAs, "env; grep -r -F -l -- '"+gcsTestToken+"' . ; true"); strings.Contains(out, gcsTestToken) {
		t.Fatalf("the token reached the container:\n%s", out)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"team/data/sub/edit.txt": "after", "team/data/new.txt": "new", "team/data/readme.md": "# hello\n"} {
		if got, _ := e.get(t, key); got != want {
			t.Fatalf("%s = %q, want %q", key, got, want)
		}
	}
}
