package docker

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/computetest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// TestProviderConformance runs the suite every provider passes, with
// clients over one state directory standing for successive harness
// processes.
func TestProviderConformance(t *testing.T) {
	for name, image := range map[string]string{"small": "", "full": "bulkhead/sandbox-full:dev"} {
		t.Run(name, func(t *testing.T) {
			needDocker(t)
			if image != "" {
				needFullImage(t)
			}
			stateDir := t.TempDir()
			var api *Provider
			computetest.Run(t, computetest.Env{
				NewClient: func(t *testing.T, store snapshot.Store) *compute.Client {
					p, err := New(Config{StateDir: stateDir, Image: image, Labels: map[string]string{runLabelKey: testEnv.runLabel}},
						zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = p.Close() })
					api = p
					return compute.NewClient(p, compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
				},
				Users: true,
				Leaked: func(t *testing.T, sessionID string) []string {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					f := make(client.Filters).Add("label", LabelSession+"="+sessionID)
					var left []string
					if cs, err := api.API().ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err == nil {
						for _, c := range cs.Items {
							left = append(left, "container "+c.ID[:12])
						}
					}
					if vs, err := api.API().VolumeList(ctx, client.VolumeListOptions{Filters: f}); err == nil {
						for _, v := range vs.Items {
							left = append(left, "volume "+v.Name)
						}
					}
					return left
				},
			})
		})
	}
}
