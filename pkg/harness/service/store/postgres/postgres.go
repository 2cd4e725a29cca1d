// Package postgres keeps the runs of `harness serve` in PostgreSQL (pgx),
// for services whose operators run a database, or several replicas.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// schema is applied on Open (idempotent).
const schema = `
CREATE TABLE IF NOT EXISTS bulkhead_runs (
	id      text PRIMARY KEY,
	tenant  text NOT NULL,
	status  text NOT NULL,
	created timestamptz NOT NULL,
	record  jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS bulkhead_runs_tenant ON bulkhead_runs (tenant, created DESC, id DESC);
CREATE INDEX IF NOT EXISTS bulkhead_runs_status ON bulkhead_runs (status);
-- holds_sandbox mirrors store.Run.HoldsSandbox for the sandboxes index;
-- a table from before it is filled in once, when the column is added.
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'bulkhead_runs' AND column_name = 'holds_sandbox') THEN
		ALTER TABLE bulkhead_runs ADD COLUMN IF NOT EXISTS holds_sandbox boolean NOT NULL DEFAULT false;
		UPDATE bulkhead_runs SET holds_sandbox = true
			WHERE record->>'sandbox_id' <> '' AND NOT COALESCE((record->>'sandbox_gone')::boolean, false);
	END IF;
END $$;
CREATE INDEX IF NOT EXISTS bulkhead_runs_sandboxes ON bulkhead_runs (tenant, created DESC, id DESC) WHERE holds_sandbox;
CREATE TABLE IF NOT EXISTS bulkhead_run_events (
	run_id text NOT NULL,
	seq    bigint NOT NULL,
	data   bytea NOT NULL,
	PRIMARY KEY (run_id, seq)
);
-- The sandboxes made through the API (store.Sandbox); gone mirrors its Gone.
CREATE TABLE IF NOT EXISTS bulkhead_sandboxes (
	id      text PRIMARY KEY,
	tenant  text NOT NULL,
	created timestamptz NOT NULL,
	gone    boolean NOT NULL DEFAULT false,
	record  jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS bulkhead_sandboxes_live ON bulkhead_sandboxes (created, id) WHERE NOT gone;`

// Store is a store.Store in PostgreSQL.
type Store struct {
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url (postgres://...) and creates the
// tables when missing.
func Open(ctx context.Context, url string) (*Store, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("postgres run store: %w", err)
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres run store: create tables: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Close closes the pool.
func (s *Store) Close() error { s.pool.Close(); return nil }

// CreateRun implements store.Store.
func (s *Store) CreateRun(ctx context.Context, r *store.Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO bulkhead_runs (id, tenant, status, created, record, holds_sandbox) VALUES ($1, $2, $3, $4, $5, $6)`,
		r.ID, r.Tenant, r.Status, r.Created, data, r.HoldsSandbox())
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return fmt.Errorf("run %s: %w", r.ID, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, err)
	}
	return nil
}

// UpdateRun implements store.Store.
func (s *Store) UpdateRun(ctx context.Context, r *store.Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE bulkhead_runs SET status = $2, record = $3, holds_sandbox = $5 WHERE id = $1 AND tenant = $4`,
		r.ID, r.Status, data, r.Tenant, r.HoldsSandbox())
	if err != nil {
		return fmt.Errorf("update run %s: %w", r.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("run %s: %w", r.ID, store.ErrNotFound)
	}
	return nil
}

func scanRuns(rows pgx.Rows) ([]*store.Run, error) {
	defer rows.Close()
	var out []*store.Run
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var r store.Run
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("stored run record: %w", err)
		}
		out = append(out, &r)
	}
	return out, rows.Err()
}

// GetRun implements store.Store.
func (s *Store) GetRun(ctx context.Context, tenant, id string) (*store.Run, error) {
	rows, err := s.pool.Query(ctx, `SELECT record FROM bulkhead_runs WHERE id = $1 AND tenant = $2`, id, tenant)
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
	}
	return runs[0], nil
}

// SandboxRuns implements store.Store (through the partial index
// bulkhead_runs_sandboxes).
func (s *Store) SandboxRuns(ctx context.Context, tenant string) ([]*store.Run, error) {
	rows, err := s.pool.Query(ctx, `SELECT record FROM bulkhead_runs WHERE tenant = $1 AND holds_sandbox ORDER BY created DESC, id DESC`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list sandbox runs: %w", err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, fmt.Errorf("list sandbox runs: %w", err)
	}
	return runs, nil
}

// HeldSandboxes implements store.Store (through the partial index
// bulkhead_runs_sandboxes).
func (s *Store) HeldSandboxes(ctx context.Context) ([]*store.Run, error) {
	rows, err := s.pool.Query(ctx, `SELECT record FROM bulkhead_runs WHERE holds_sandbox ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("list held sandboxes: %w", err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, fmt.Errorf("list held sandboxes: %w", err)
	}
	return runs, nil
}

// cursor encodes a page position: the last run's creation time (in
// microseconds, PostgreSQL's precision) and id.
func cursor(r *store.Run) string {
	return strconv.FormatInt(r.Created.UnixMicro(), 10) + "." + r.ID
}

// ListRuns implements store.Store.
func (s *Store) ListRuns(ctx context.Context, tenant string, opts store.ListOptions) ([]*store.Run, string, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = store.DefaultLimit
	}
	q := `SELECT record FROM bulkhead_runs WHERE tenant = $1 AND ($2 = '' OR status = $2)`
	args := []any{tenant, opts.Status}
	if opts.After != "" {
		ns, id, ok := strings.Cut(opts.After, ".")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			return nil, "", errors.New("page token: malformed")
		}
		q += ` AND (created, id) < ($3, $4)`
		args = append(args, time.UnixMicro(n).UTC(), id)
	}
	q += fmt.Sprintf(` ORDER BY created DESC, id DESC LIMIT %d`, limit+1)
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list runs: %w", err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, "", fmt.Errorf("list runs: %w", err)
	}
	next := ""
	if len(runs) > limit {
		runs = runs[:limit]
		next = cursor(runs[limit-1])
	}
	return runs, next, nil
}

// ActiveRuns implements store.Store.
func (s *Store) ActiveRuns(ctx context.Context, statuses ...string) ([]*store.Run, error) {
	rows, err := s.pool.Query(ctx, `SELECT record FROM bulkhead_runs WHERE status = ANY($1) ORDER BY created, id`, statuses)
	if err != nil {
		return nil, fmt.Errorf("active runs: %w", err)
	}
	return scanRuns(rows)
}

// AppendEvents implements store.Store.
func (s *Store) AppendEvents(ctx context.Context, runID string, evs []store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var last uint64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM bulkhead_run_events WHERE run_id = $1`, runID).Scan(&last); err != nil {
			return fmt.Errorf("append events of %s: %w", runID, err)
		}
		b := &pgx.Batch{}
		for _, ev := range evs {
			if ev.Seq != last+1 {
				return fmt.Errorf("run %s: event %d after %d: %w", runID, ev.Seq, last, store.ErrSequence)
			}
			b.Queue(`INSERT INTO bulkhead_run_events (run_id, seq, data) VALUES ($1, $2, $3)`, runID, int64(ev.Seq), ev.Data)
			last = ev.Seq
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" {
				return fmt.Errorf("run %s: %w", runID, store.ErrSequence)
			}
			return fmt.Errorf("append events of %s: %w", runID, err)
		}
		return nil
	})
}

// Events implements store.Store.
func (s *Store) Events(ctx context.Context, runID string, after uint64, limit int) ([]store.Event, error) {
	q := `SELECT seq, data FROM bulkhead_run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	rows, err := s.pool.Query(ctx, q, runID, int64(after))
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []store.Event
	for rows.Next() {
		var seq int64
		var data []byte
		if err := rows.Scan(&seq, &data); err != nil {
			return nil, fmt.Errorf("events of %s: %w", runID, err)
		}
		out = append(out, store.Event{Seq: uint64(seq), Data: data})
	}
	return out, rows.Err()
}

// LastSequence implements store.Store.
func (s *Store) LastSequence(ctx context.Context, runID string) (uint64, error) {
	var last int64
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM bulkhead_run_events WHERE run_id = $1`, runID).Scan(&last); err != nil {
		return 0, fmt.Errorf("last event of %s: %w", runID, err)
	}
	return uint64(last), nil
}

// The sandboxes made through the API.

func scanSandboxes(rows pgx.Rows) ([]*store.Sandbox, error) {
	defer rows.Close()
	var out []*store.Sandbox
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var sb store.Sandbox
		if err := json.Unmarshal(data, &sb); err != nil {
			return nil, fmt.Errorf("stored sandbox record: %w", err)
		}
		out = append(out, &sb)
	}
	return out, rows.Err()
}

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO bulkhead_sandboxes (id, tenant, created, gone, record) VALUES ($1, $2, $3, $4, $5)`,
		sb.ID, sb.Tenant, sb.Created, sb.Gone, data)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return fmt.Errorf("sandbox %s: %w", sb.ID, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	// The tenant (and the created column) stay: an update through
	// another tenant finds nothing.
	tag, err := s.pool.Exec(ctx, `UPDATE bulkhead_sandboxes SET gone = $3, record = $4 WHERE id = $1 AND tenant = $2`,
		sb.ID, sb.Tenant, sb.Gone, data)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("sandbox %s: %w", sb.ID, store.ErrNotFound)
	}
	return nil
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, tenant, id string) (*store.Sandbox, error) {
	rows, err := s.pool.Query(ctx, `SELECT record FROM bulkhead_sandboxes WHERE id = $1 AND tenant = $2`, id, tenant)
	if err != nil {
		return nil, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	sbs, err := scanSandboxes(rows)
	if err != nil {
		return nil, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	if len(sbs) == 0 {
		return nil, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	return sbs[0], nil
}

// LiveSandboxes implements store.Store (through the partial index
// bulkhead_sandboxes_live).
func (s *Store) LiveSandboxes(ctx context.Context) ([]*store.Sandbox, error) {
	rows, err := s.pool.Query(ctx, `SELECT record FROM bulkhead_sandboxes WHERE NOT gone ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("list live sandboxes: %w", err)
	}
	sbs, err := scanSandboxes(rows)
	if err != nil {
		return nil, fmt.Errorf("list live sandboxes: %w", err)
	}
	return sbs, nil
}
