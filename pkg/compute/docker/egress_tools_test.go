package docker

import (
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/egresstest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// TestEgressHTTPClients: the images' HTTP clients reach an allowed name
// through the egress proxy (HTTP_PROXY/HTTPS_PROXY, plain HTTP and a
// CONNECT tunnel) and fail on a refused one showing the proxy's 403 and
// reason: wget in bulkhead/sandbox:dev (GNU wget: busybox's applet died of
// SIGSEGV on -T and cannot tunnel https), wget and curl in
// bulkhead/sandbox-full:dev.
func TestEgressHTTPClients(t *testing.T) {
	for _, c := range []struct {
		image   string
		clients []string
	}{
		{DefaultImage, []string{"wget"}},
		{"bulkhead/sandbox-full:dev", []string{"wget", "curl"}},
	} {
		t.Run(c.image, func(t *testing.T) {
			needDocker(t)
			if c.image != DefaultImage {
				needFullImage(t)
			}
			srv := egresstest.StartServers(t)
			p := newProvider(t, func(cfg *Config) { cfg.Image, cfg.Egress = c.image, srv.Options() })
			ac := launch(t, p, compute.LaunchSpec{}).Agent()
			ctx := testCtx(t)
			srv.CheckHTTPClients(t, func(cmd string) (string, int) {
				t.Helper()
				// Argv through /bin/sh -c: a shell finds the clients the way a
				// script does (busybox's shell prefers its own applets).
				res, err := ac.Exec(ctx, compute.ProcessSpec{Argv: []string{"/bin/sh", "-c", cmd}}, compute.ExecOptions{}, nil)
				if err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
				return string(res.Stdout) + string(res.Stderr), res.Exit.ExitCode
			}, c.clients...)
		})
	}
}
