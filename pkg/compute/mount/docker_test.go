package mount_test

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// TestMountsDocker: the same mounts in a Docker sandbox, for each backend
// (the daemon only receives bytes, so nothing is provider-specific): a
// read-only mount with exact bytes that run_as cannot change, a writable
// one uploaded back at Close, and no credential in the container.
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
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			e := newEnvOn(t, b.start(t), nil, func(opts compute.ClientOptions) (*compute.Client, error) {
				p, err := docker.New(docker.Config{StateDir: testenv.SearchableTempDir(t), Labels: map[string]string{"test.bulkhead.mount": "1"}},
					zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
				if err != nil {
					return nil, err
				}
				t.Cleanup(func() { _ = p.Close() })
				return compute.NewClient(p, opts), nil
			})
			e.put(t, "readme.md", "# hello\n")
			e.put(t, "sub/edit.txt", "before")
			s := e.session(t, map[string]*manifest.Entry{"ro": e.entry(true), "rw": e.entry(false)})
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
			asRunAs(t, s, "printf after > rw/sub/edit.txt && printf new > rw/new.txt")
			assertNoSecret(t, e, s)
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			wantObjects(t, e, map[string]string{"sub/edit.txt": "after", "new.txt": "new", "readme.md": "# hello\n"})
		})
	}
}
