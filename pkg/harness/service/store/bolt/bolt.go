// Package bolt is the default run store of `harness serve`: one bbolt file
// (pure Go, no server, crash-safe through its copy-on-write B+tree).
package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

var (
	bucketRuns   = []byte("runs")    // id -> JSON record
	bucketIndex  = []byte("tenants") // tenant 0 inverted-created id -> nil
	bucketEvents = []byte("events")  // id -> bucket of seq -> data
	// bucketSandboxes indexes the runs that hold a sandbox
	// (store.Run.HoldsSandbox) like bucketIndex: tenant 0 inverted-created id -> nil.
	bucketSandboxes = []byte("sandboxes")
	// bucketAPISandboxes holds the sandboxes made through the API (id ->
	// JSON record); bucketAPIIndex indexes those not gone (LiveSandboxes)
	// like bucketIndex: tenant 0 inverted-created id -> nil.
	bucketAPISandboxes = []byte("api_sandboxes")
	bucketAPIIndex     = []byte("api_sandbox_index")
)

// Store is a store.Store in a bbolt file.
type Store struct {
	db *bbolt.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (or creates) the store at path.
func Open(path string) (*Store, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open run store %s: %w", path, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketRuns, bucketIndex, bucketEvents, bucketAPISandboxes, bucketAPIIndex} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if tx.Bucket(bucketSandboxes) != nil {
			return nil
		}
		// A file from before the index: build it once.
		sb, err := tx.CreateBucket(bucketSandboxes)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			r, err := decode(string(k), v)
			if err != nil || !r.HoldsSandbox() {
				return err
			}
			return sb.Put(indexKey(r), nil)
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open run store %s: %w", path, err)
	}
	// A short window: a lone run's event waits at most this long for
	// company before its commit.
	db.MaxBatchDelay = time.Millisecond
	return &Store{db: db}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// indexKey orders a tenant's runs newest first.
func indexKey(r *store.Run) []byte { return tenantKey(r.Tenant, r.Created, r.ID) }

// tenantKey orders a tenant's records newest first.
func tenantKey(tenant string, created time.Time, id string) []byte {
	k := append([]byte(tenant), 0)
	k = binary.BigEndian.AppendUint64(k, math.MaxUint64-uint64(created.UnixNano()))
	return append(k, id...)
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// CreateRun implements store.Store.
func (s *Store) CreateRun(_ context.Context, r *store.Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// Batch: records and events of concurrent runs share one transaction
	// and one fsync (group commit). fn may run again alone after a peer
	// failed; it only checks and puts, so that is safe.
	return s.db.Batch(func(tx *bbolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		if runs.Get([]byte(r.ID)) != nil {
			return fmt.Errorf("run %s: %w", r.ID, store.ErrExists)
		}
		if err := runs.Put([]byte(r.ID), data); err != nil {
			return err
		}
		if err := tx.Bucket(bucketIndex).Put(indexKey(r), nil); err != nil {
			return err
		}
		return indexSandbox(tx, r)
	})
}

// UpdateRun implements store.Store.
func (s *Store) UpdateRun(_ context.Context, r *store.Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bbolt.Tx) error { // group commit, as CreateRun
		runs := tx.Bucket(bucketRuns)
		old := runs.Get([]byte(r.ID))
		if old == nil {
			return fmt.Errorf("run %s: %w", r.ID, store.ErrNotFound)
		}
		var prev store.Run
		if err := json.Unmarshal(old, &prev); err != nil {
			return fmt.Errorf("run %s: stored record: %w", r.ID, err)
		}
		if prev.Tenant != r.Tenant || !prev.Created.Equal(r.Created) {
			return fmt.Errorf("run %s: tenant and creation time cannot change", r.ID)
		}
		if err := runs.Put([]byte(r.ID), data); err != nil {
			return err
		}
		return indexSandbox(tx, r)
	})
}

// indexSandbox keeps r's entry in bucketSandboxes as r.HoldsSandbox says.
func indexSandbox(tx *bbolt.Tx, r *store.Run) error {
	b := tx.Bucket(bucketSandboxes)
	if r.HoldsSandbox() {
		return b.Put(indexKey(r), nil)
	}
	return b.Delete(indexKey(r))
}

// SandboxRuns implements store.Store.
func (s *Store) SandboxRuns(_ context.Context, tenant string) ([]*store.Run, error) {
	prefix := append([]byte(tenant), 0)
	var out []*store.Run
	err := s.db.View(func(tx *bbolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		c := tx.Bucket(bucketSandboxes).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			id := string(k[len(prefix)+8:])
			data := runs.Get([]byte(id))
			if data == nil {
				continue
			}
			r, err := decode(id, data)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// HeldSandboxes implements store.Store.
func (s *Store) HeldSandboxes(_ context.Context) ([]*store.Run, error) {
	var out []*store.Run
	err := s.db.View(func(tx *bbolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		return tx.Bucket(bucketSandboxes).ForEach(func(k, _ []byte) error {
			i := bytes.IndexByte(k, 0)
			if i < 0 || len(k) < i+1+8 {
				return nil
			}
			id := string(k[i+1+8:])
			data := runs.Get([]byte(id))
			if data == nil {
				return nil
			}
			r, err := decode(id, data)
			if err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

func decode(id string, data []byte) (*store.Run, error) {
	var r store.Run
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("run %s: stored record: %w", id, err)
	}
	return &r, nil
}

// GetRun implements store.Store.
func (s *Store) GetRun(_ context.Context, tenant, id string) (*store.Run, error) {
	var out *store.Run
	err := s.db.View(func(tx *bbolt.Tx) error {
		data := tx.Bucket(bucketRuns).Get([]byte(id))
		if data == nil {
			return fmt.Errorf("run %s: %w", id, store.ErrNotFound)
		}
		r, err := decode(id, data)
		if err != nil {
			return err
		}
		if r.Tenant != tenant {
			return fmt.Errorf("run %s: %w", id, store.ErrNotFound)
		}
		out = r
		return nil
	})
	return out, err
}

// ListRuns implements store.Store.
func (s *Store) ListRuns(_ context.Context, tenant string, opts store.ListOptions) ([]*store.Run, string, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = store.DefaultLimit
	}
	prefix := append([]byte(tenant), 0)
	start := prefix
	if opts.After != "" {
		after, err := hex.DecodeString(opts.After)
		if err != nil {
			return nil, "", fmt.Errorf("page token: %w", err)
		}
		start = append(slices.Clone(prefix), after...)
	}
	var out []*store.Run
	next := ""
	err := s.db.View(func(tx *bbolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		c := tx.Bucket(bucketIndex).Cursor()
		k, _ := c.Seek(start)
		if opts.After != "" && bytes.Equal(k, start) {
			k, _ = c.Next()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			id := string(k[len(prefix)+8:])
			data := runs.Get([]byte(id))
			if data == nil {
				continue
			}
			r, err := decode(id, data)
			if err != nil {
				return err
			}
			if opts.Status != "" && r.Status != opts.Status {
				continue
			}
			if len(out) == limit {
				next = hex.EncodeToString(indexKey(out[len(out)-1])[len(prefix):])
				return nil
			}
			out = append(out, r)
		}
		return nil
	})
	return out, next, err
}

// ActiveRuns implements store.Store.
func (s *Store) ActiveRuns(_ context.Context, statuses ...string) ([]*store.Run, error) {
	var out []*store.Run
	err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			r, err := decode(string(k), v)
			if err != nil {
				return err
			}
			if slices.Contains(statuses, r.Status) {
				out = append(out, r)
			}
			return nil
		})
	})
	slices.SortFunc(out, func(a, b *store.Run) int { return a.Created.Compare(b.Created) })
	return out, err
}

// AppendEvents implements store.Store.
func (s *Store) AppendEvents(_ context.Context, runID string, evs []store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	// Batch coalesces the appends of concurrent runs into one transaction
	// and one fsync (group commit); fn may run again alone after a peer
	// failed, which the sequence check makes safe.
	return s.db.Batch(func(tx *bbolt.Tx) error {
		b, err := tx.Bucket(bucketEvents).CreateBucketIfNotExists([]byte(runID))
		if err != nil {
			return err
		}
		var last uint64
		if k, _ := b.Cursor().Last(); k != nil {
			last = binary.BigEndian.Uint64(k)
		}
		for _, ev := range evs {
			if ev.Seq != last+1 {
				return fmt.Errorf("run %s: event %d after %d: %w", runID, ev.Seq, last, store.ErrSequence)
			}
			if err := b.Put(seqKey(ev.Seq), ev.Data); err != nil {
				return err
			}
			last = ev.Seq
		}
		return nil
	})
}

// Events implements store.Store.
func (s *Store) Events(_ context.Context, runID string, after uint64, limit int) ([]store.Event, error) {
	var out []store.Event
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketEvents).Bucket([]byte(runID))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil && (limit <= 0 || len(out) < limit); k, v = c.Next() {
			out = append(out, store.Event{Seq: binary.BigEndian.Uint64(k), Data: slices.Clone(v)})
		}
		return nil
	})
	return out, err
}

// LastSequence implements store.Store.
func (s *Store) LastSequence(_ context.Context, runID string) (uint64, error) {
	var last uint64
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketEvents).Bucket([]byte(runID))
		if b == nil {
			return nil
		}
		if k, _ := b.Cursor().Last(); k != nil {
			last = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return 0, err
	}
	return last, nil
}

// The sandboxes made through the API.

func sandboxKey(sb *store.Sandbox) []byte { return tenantKey(sb.Tenant, sb.Created, sb.ID) }

func decodeSandbox(id string, data []byte) (*store.Sandbox, error) {
	var sb store.Sandbox
	if err := json.Unmarshal(data, &sb); err != nil {
		return nil, fmt.Errorf("sandbox %s: stored record: %w", id, err)
	}
	return &sb, nil
}

// putSandbox stores sb and keeps its index entry as sb.Gone says.
func putSandbox(tx *bbolt.Tx, sb *store.Sandbox, data []byte) error {
	if err := tx.Bucket(bucketAPISandboxes).Put([]byte(sb.ID), data); err != nil {
		return err
	}
	idx := tx.Bucket(bucketAPIIndex)
	if sb.Gone {
		return idx.Delete(sandboxKey(sb))
	}
	return idx.Put(sandboxKey(sb), nil)
}

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(_ context.Context, sb *store.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bbolt.Tx) error { // group commit, as CreateRun
		if tx.Bucket(bucketAPISandboxes).Get([]byte(sb.ID)) != nil {
			return fmt.Errorf("sandbox %s: %w", sb.ID, store.ErrExists)
		}
		return putSandbox(tx, sb, data)
	})
}

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(_ context.Context, sb *store.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bbolt.Tx) error {
		old := tx.Bucket(bucketAPISandboxes).Get([]byte(sb.ID))
		if old == nil {
			return fmt.Errorf("sandbox %s: %w", sb.ID, store.ErrNotFound)
		}
		prev, err := decodeSandbox(sb.ID, old)
		if err != nil {
			return err
		}
		if prev.Tenant != sb.Tenant || !prev.Created.Equal(sb.Created) {
			return fmt.Errorf("sandbox %s: tenant and creation time cannot change", sb.ID)
		}
		return putSandbox(tx, sb, data)
	})
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(_ context.Context, tenant, id string) (*store.Sandbox, error) {
	var out *store.Sandbox
	err := s.db.View(func(tx *bbolt.Tx) error {
		data := tx.Bucket(bucketAPISandboxes).Get([]byte(id))
		if data == nil {
			return fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
		}
		sb, err := decodeSandbox(id, data)
		if err != nil {
			return err
		}
		if sb.Tenant != tenant {
			return fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
		}
		out = sb
		return nil
	})
	return out, err
}

// LiveSandboxes implements store.Store.
func (s *Store) LiveSandboxes(_ context.Context) ([]*store.Sandbox, error) {
	var out []*store.Sandbox
	err := s.db.View(func(tx *bbolt.Tx) error {
		sbs := tx.Bucket(bucketAPISandboxes)
		return tx.Bucket(bucketAPIIndex).ForEach(func(k, _ []byte) error {
			i := bytes.IndexByte(k, 0)
			if i < 0 || len(k) < i+1+8 {
				return nil
			}
			id := string(k[i+1+8:])
			data := sbs.Get([]byte(id))
			if data == nil {
				return nil
			}
			sb, err := decodeSandbox(id, data)
			if err != nil {
				return err
			}
			out = append(out, sb)
			return nil
		})
	})
	return out, err
}
