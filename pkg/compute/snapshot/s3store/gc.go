package s3store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3errs"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// GCOptions tune a garbage collection.
type GCOptions struct {
	// Grace keeps chunks younger than it whether referenced or not; zero
	// means the store's GCGrace. It protects uploads in progress, which
	// reference their chunks only once their manifest is written.
	Grace time.Duration
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
}

// GCStats reports a garbage collection.
type GCStats struct {
	Snapshots  int   // manifests read
	Chunks     int   // chunks listed
	Referenced int   // chunks some snapshot references
	Young      int   // chunks younger than the grace period, kept whatever references them
	Deleted    int   // unreferenced chunks deleted (or, for a dry run, to delete)
	Bytes      int64 // their stored size
}

// GC deletes chunks no snapshot references and that are older than the
// grace period. It lists the chunks first and the manifests after, so a
// snapshot written during the collection protects its chunks; a chunk an
// upload reuses is touched by it (see Put) and so is young; and each
// candidate is looked at again just before it is deleted, so one touched
// since the listing is kept. Memory grows with the number of old chunks.
func (s *Store) GC(ctx context.Context, opts GCOptions) (GCStats, error) {
	grace := opts.Grace
	if grace <= 0 {
		grace = s.grace
	}
	cutoff := time.Now().Add(-grace)
	var st GCStats
	type candidate struct{ size int64 }
	old := make(map[string]candidate)
	cp := s.chunkPrefix()
	err := s.listObjects(ctx, cp, func(o types.Object) error {
		st.Chunks++
		h := aws.ToString(o.Key)[strings.LastIndex(aws.ToString(o.Key), "/")+1:]
		if aws.ToTime(o.LastModified).Before(cutoff) {
			old[h] = candidate{size: aws.ToInt64(o.Size)}
		} else {
			st.Young++
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	// Every manifest is read: a chunk is garbage only if none names it.
	referenced := make(map[string]bool)
	var ids []string
	if err := s.List(ctx, func(in snapshot.Info) error { ids = append(ids, in.ID); return nil }); err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, s.conc)
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			doc, _, err := s.readManifest(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if s3errs.IsNotFound(err) {
				return // deleted since the listing
			}
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			st.Snapshots++
			for _, c := range doc.Chunks {
				referenced[c.Hash] = true
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		// A manifest that cannot be read may reference anything.
		return st, fmt.Errorf("gc: nothing deleted: %w", firstErr)
	}
	st.Referenced = len(referenced)
	for h := range old {
		if referenced[h] {
			delete(old, h)
		}
	}
	for h, c := range old {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			deleted, err := s.collect(ctx, h, cutoff, opts.DryRun)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			if deleted {
				st.Deleted++
				st.Bytes += c.size
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return st, fmt.Errorf("gc: %w", firstErr)
	}
	s.log.Info("snapshot store collected", zap.String("store", s.desc), zap.Int("snapshots", st.Snapshots),
		zap.Int("chunks", st.Chunks), zap.Int("deleted", st.Deleted), zap.Int64("bytes", st.Bytes), zap.Bool("dry_run", opts.DryRun))
	return st, nil
}

// collect deletes chunk h if it is still older than cutoff.
func (s *Store) collect(ctx context.Context, h string, cutoff time.Time, dryRun bool) (bool, error) {
	key := s.chunkKey(h)
	mod, err := s.statObject(ctx, key)
	if s3errs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, s.classify(ctx, "look up chunk", h, err)
	}
	if !mod.Before(cutoff) {
		return false, nil // an upload touched it since the listing
	}
	if dryRun {
		return true, nil
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil && !s3errs.IsNotFound(err) {
		return false, s.classify(ctx, "delete chunk", h, err)
	}
	return true, nil
}
