package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	pgserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/postgres"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/postgres"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/storetest"
)

func TestConformance(t *testing.T) {
	srv := pgserver.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := postgres.Open(context.Background(), srv.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestSandboxIndexFilledForOlderTables: a table made before the sandboxes
// index (no holds_sandbox column) gets the column filled when opened.
func TestSandboxIndexFilledForOlderTables(t *testing.T) {
	srv := pgserver.Start(t)
	url := srv.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE bulkhead_runs (id text PRIMARY KEY, tenant text NOT NULL, status text NOT NULL,
		created timestamptz NOT NULL, record jsonb NOT NULL);
	INSERT INTO bulkhead_runs VALUES
		('run-a', 'acme', 'RUN_STATUS_SUCCEEDED', '2026-01-01T00:00:00Z', '{"id":"run-a","tenant":"acme","sandbox_id":"sbx-a"}'),
		('run-b', 'acme', 'RUN_STATUS_SUCCEEDED', '2026-01-01T00:00:01Z', '{"id":"run-b","tenant":"acme","sandbox_id":"sbx-b","sandbox_gone":true}'),
		('run-c', 'acme', 'RUN_STATUS_PENDING', '2026-01-01T00:00:02Z', '{"id":"run-c","tenant":"acme"}')`)
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, err := s.SandboxRuns(ctx, "acme")
	if err != nil || len(runs) != 1 || runs[0].ID != "run-a" {
		t.Fatalf("sandbox runs of an older table: %v %v", runs, err)
	}
}
