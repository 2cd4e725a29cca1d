package bolt_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := bolt.Open(filepath.Join(t.TempDir(), "runs.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestSandboxIndexBuiltForOlderFiles: a file written before the sandboxes
// index existed gets it built when opened.
func TestSandboxIndexBuiltForOlderFiles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := bolt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	for i, sb := range []string{"sbx-a", "", "sbx-c"} {
		r := &store.Run{ID: fmt.Sprintf("run-%d", i), Tenant: "acme", Status: "RUN_STATUS_RUNNING", Created: now.Add(time.Duration(i) * time.Second), Updated: now, SandboxID: sb}
		if err := s.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Make it an older file: no index.
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("sandboxes")) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = bolt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, err := s.SandboxRuns(ctx, "acme")
	if err != nil || len(runs) != 2 || runs[0].ID != "run-2" || runs[1].ID != "run-0" {
		t.Fatalf("sandbox runs after reopening an older file: %v %v", runs, err)
	}
}
