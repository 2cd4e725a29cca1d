package compute_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// TestArchiveLimitsBoundTheRestore: a snapshot with more members than the
// session's limit is refused when it is restored, and nothing is restored.
func TestArchiveLimitsBoundTheRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := compute.NewClient(agentdtest.NewProvider(t, nil), compute.ClientOptions{Snapshots: store})
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{}}
	for _, n := range []string{"a", "b", "c", "d"} {
		m.Entries[n+".txt"] = &manifest.Entry{Type: manifest.TypeFile, Content: []byte(n)}
	}
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: m, Limits: compute.Limits{MaterializeConcurrency: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	tight, err := c.Resume(ctx, st, compute.WithLimits(compute.Limits{Archive: compute.ArchiveLimits{MaxMembers: 2}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := tight.Start(ctx); !errors.Is(err, compute.ErrResourceExhausted) {
		t.Fatalf("restore over the member limit: %v", err)
	}
	if _, err := tight.Stat(ctx, "a.txt", compute.StatOptions{}); !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("a refused restore left files: %v", err)
	}
	if err := c.Delete(ctx, tight); err != nil {
		t.Fatal(err)
	}
	loose, err := c.Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Delete(ctx, loose)
	if err := loose.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := loose.Stat(ctx, "d.txt", compute.StatOptions{}); err != nil {
		t.Fatal(err)
	}
}
