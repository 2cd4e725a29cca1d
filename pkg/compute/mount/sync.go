package mount

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// maxConflictsNamed bounds the paths a conflict error lists.
const maxConflictsNamed = 20

// SyncStats counts what a Sync did.
type SyncStats struct {
	Uploaded, Deleted, Unchanged int
	// Conflicts are the workspace paths not uploaded (or not deleted)
	// because their object changed remotely since the download.
	Conflicts []string
}

// PreStop is a compute.PreStopHook: it syncs the session's writable
// mounts (see Sync) and then forgets the session. Register it on every
// session with compute.ClientOptions.PreStopHooks, or on one with
// Session.OnPreStop.
func (m *Mounter) PreStop(ctx context.Context, s *compute.Session) error {
	defer m.Forget(s.ID())
	_, err := m.Sync(ctx, s)
	if m.cfg.Baselines != nil {
		// The sandbox goes away with this Close: a later Resume makes a
		// replacement, whose mounts are downloaded afresh.
		if derr := m.cfg.Baselines.DeleteBaselines(ctx, s.ID()); derr != nil {
			m.log.Warn("mount: could not delete the saved baselines", zap.String("session", s.ID()), zap.Error(derr))
		}
	}
	return err
}

var _ compute.PreStopHook = (*Mounter)(nil).PreStop

// Sync uploads what changed in the session's writable mounts: new and
// changed files are put (If-Match the ETag downloaded, or If-None-Match
// for new keys, after a HEAD that compares the ETag for servers that
// ignore conditional headers), deleted files are deleted when their object
// is unchanged remotely (a conditional delete; a HEAD first where the
// server may ignore the condition, see s3Backend.remove). An object changed remotely is never overwritten:
// its path is reported in an ErrConflict error and left for the caller
// (the remote copy wins until the conflict is resolved). The rest is
// still synced. Read-only mounts are skipped. A writable mount that this
// Mounter did not materialize (a session reattached by another harness
// process) is synced from the baseline in Config.Baselines, or refused
// with ErrFailedPrecondition when there is none.
func (m *Mounter) Sync(ctx context.Context, s *compute.Session) (SyncStats, error) {
	var stats SyncStats
	man := s.Manifest()
	if man == nil {
		return stats, nil
	}
	var errs []error
	for _, p := range man.MountPaths() {
		e := man.Lookup(p)
		if e == nil || e.Mount == nil || e.Mount.IsReadOnly() {
			continue
		}
		switch e.Type {
		case manifest.TypeS3Mount, manifest.TypeR2Mount, manifest.TypeGCSMount, manifest.TypeAzureBlobMount, manifest.TypeS3FilesMount:
		default:
			continue
		}
		mt := m.state(s.ID(), p)
		if mt == nil {
			var err error
			if mt, err = m.loadBaseline(ctx, s.ID(), p, e); err != nil {
				errs = append(errs, fmt.Errorf("mount %s: load the saved baseline: %w", p, err))
				continue
			}
		}
		if mt == nil || !mt.ready {
			errs = append(errs, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: this Mounter did not materialize session %s (it never started here, or it was reattached from another harness process with no shared mount.Config.Baselines), so its changes cannot be told from remote ones; nothing was uploaded", p, s.ID()))
			continue
		}
		if err := m.syncMount(ctx, s.ID(), s.Agent(), mt, &stats); err != nil {
			errs = append(errs, err)
		}
	}
	if len(stats.Conflicts) > 0 {
		slices.Sort(stats.Conflicts)
		named := stats.Conflicts
		more := ""
		if len(named) > maxConflictsNamed {
			more = fmt.Sprintf(" and %d more", len(named)-maxConflictsNamed)
			named = named[:maxConflictsNamed]
		}
		errs = append(errs, errkind.Errorf(errkind.ErrConflict, "mount sync: %d path(s) changed remotely since they were mounted and were not overwritten: %s%s",
			len(stats.Conflicts), strings.Join(named, ", "), more))
	}
	return stats, errors.Join(errs...)
}

// change is one file to upload or delete.
type change struct {
	o      *objectRef // nil for a new file
	rel    string
	info   *agentclient.FileInfo // nil for a deletion
	delete bool
}

// syncMount syncs one writable mount.
func (m *Mounter) syncMount(ctx context.Context, session string, c *agentclient.Client, mt *mounted, stats *SyncStats) error {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	start := time.Now()
	local, err := walk(ctx, c, mt.path, m.cfg.MaxObjects)
	if err != nil {
		return fmt.Errorf("mount %s: sync: %w", mt.path, err)
	}
	var work []change
	for rel, fi := range local {
		o := mt.objects[rel]
		if o != nil && o.size == fi.Size && o.mtime.Equal(fi.ModifiedAt) {
			stats.Unchanged++
			continue
		}
		work = append(work, change{o: o, rel: rel, info: fi})
	}
	for rel, o := range mt.objects {
		if _, ok := local[rel]; !ok {
			work = append(work, change{o: o, rel: rel, delete: true})
		}
	}
	slices.SortFunc(work, func(a, b change) int { return strings.Compare(a.rel, b.rel) })

	var (
		mu        sync.Mutex
		wg        sync.WaitGroup
		errs      []error
		conflicts []string
		sem       = make(chan struct{}, m.cfg.Concurrency)
	)
	for _, w := range work {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			outcome, o, err := m.syncOne(ctx, c, mt, w)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case outcome == "conflict":
				conflicts = append(conflicts, path.Join(mt.path, w.rel))
			case outcome == "unchanged":
				stats.Unchanged++
			case outcome == "uploaded":
				stats.Uploaded++
			case outcome == "deleted":
				stats.Deleted++
			}
			switch {
			case err != nil || outcome == "conflict":
			case o == nil:
				delete(mt.objects, w.rel)
			default:
				mt.objects[w.rel] = o
			}
		}()
	}
	wg.Wait()
	if len(work) > 0 {
		m.saveBaseline(ctx, session, mt)
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("mount %s: sync: %w", mt.path, errkind.ClassifyFS(err)))
	}
	stats.Conflicts = append(stats.Conflicts, conflicts...)
	m.log.Info("mount synced", zap.String("mount", mt.path), zap.String("store", mt.st.desc), zap.Int("changed", len(work)),
		zap.Int("conflicts", len(conflicts)), zap.Int("errors", len(errs)), zap.Duration("took", time.Since(start)))
	return errors.Join(errs...)
}

// syncOne uploads or deletes one file. It returns what happened and the
// object's new baseline (nil when it is gone).
func (m *Mounter) syncOne(ctx context.Context, c *agentclient.Client, mt *mounted, w change) (string, *objectRef, error) {
	st := mt.st
	if w.delete {
		// A backend whose remove checks the version itself (S3's
		// conditional delete) needs no HEAD first; for the others the HEAD
		// is the check for a server that would ignore the condition.
		if own, ok := st.objects.(SelfCheckingRemover); !ok || !own.RemoveChecksVersion() {
			cur, err := st.head(ctx, w.o.key)
			switch {
			case errors.Is(err, ErrGone):
				return "deleted", nil, nil // gone already
			case err != nil:
				return "", nil, err
			case cur != w.o.etag:
				return "conflict", nil, nil
			}
		}
		err := st.objects.Remove(ctx, w.o.key, w.o.etag)
		switch {
		case errors.Is(err, ErrChanged):
			return "conflict", nil, nil
		case err != nil && !errors.Is(err, ErrGone):
			return "", nil, st.classify(ctx, "delete", w.o.key, err)
		}
		return "deleted", nil, nil
	}
	wp := path.Join(mt.path, w.rel)
	body, sum, fi, err := m.spool(ctx, c, wp)
	if err != nil {
		return "", nil, err
	}
	defer body.Close()
	mtime := fi.ModifiedAt
	if w.o != nil && w.o.sha == sum && w.o.size == fi.Size {
		o := *w.o
		o.mtime = mtime
		return "unchanged", &o, nil
	}
	key := st.prefix + w.rel
	// Look first: a server that ignores conditional writes still cannot
	// make us overwrite a remote change (a narrow race remains there; the
	// conditional write closes it where supported).
	cur, err := st.head(ctx, key)
	switch {
	case err != nil && !errors.Is(err, ErrGone):
		return "", nil, err
	case w.o == nil && err == nil, w.o != nil && (err != nil || cur != w.o.etag):
		return "conflict", nil, nil
	}
	ifVersion := ""
	if w.o != nil {
		ifVersion = w.o.etag
	}
	version, err := st.objects.Put(ctx, key, body, fi.Size, sum, ifVersion)
	if err != nil {
		if errors.Is(err, ErrChanged) {
			return "conflict", nil, nil
		}
		return "", nil, st.classify(ctx, "upload", key, err)
	}
	return "uploaded", &objectRef{rel: w.rel, key: key, etag: version, size: fi.Size, sha: sum, mtime: mtime}, nil
}

// head returns an object's version; ErrGone (unclassified) when there is
// none.
func (st *bucketStore) head(ctx context.Context, key string) (string, error) {
	v, err := st.objects.Head(ctx, key)
	if err != nil {
		if errors.Is(err, ErrGone) {
			return "", err
		}
		return "", st.classify(ctx, "look up", key, err)
	}
	return v, nil
}

// spoolMemBytes is the largest file spooled in memory; larger ones go to a
// temporary file, so memory stays bounded whatever the file's size.
const spoolMemBytes = 1 << 20

// spool reads a sandbox file into memory or a temporary file (a
// seekable body for a signed, retryable PUT) and hashes it.
func (m *Mounter) spool(ctx context.Context, c *agentclient.Client, wp string) (readSeekCloser, string, *agentclient.FileInfo, error) {
	h := sha256.New()
	var mem bytes.Buffer
	var tmp *os.File
	w := &spoolWriter{mem: &mem, limit: spoolMemBytes, spill: func() (io.Writer, error) {
		var err error
		tmp, err = os.CreateTemp("", "bulkhead-mount-")
		if err != nil {
			return nil, err
		}
		_ = os.Remove(tmp.Name()) // unlinked: gone when closed
		return tmp, nil
	}}
	fi, err := c.ReadFile(ctx, wp, agentclient.ReadFileOptions{}, io.MultiWriter(h, w))
	if err == nil && w.err != nil {
		err = w.err
	}
	if err != nil {
		if tmp != nil {
			tmp.Close()
		}
		return nil, "", nil, fmt.Errorf("read %s from the sandbox: %w", wp, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	n := w.n
	if fi == nil || fi.Size != n {
		// Shrunk while read, or cut by a daemon's read limit: never
		// upload part of a file.
		if tmp != nil {
			tmp.Close()
		}
		return nil, "", nil, errkind.MarkRetryable(errkind.Errorf(errkind.ErrConflict, "%s changed while it was read for upload (%d bytes read); sync again", wp, n))
	}
	if tmp == nil {
		return nopSeekCloser{bytes.NewReader(mem.Bytes())}, sum, fi, nil
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		tmp.Close()
		return nil, "", nil, fmt.Errorf("spool %s: %w", wp, err)
	}
	return tmp, sum, fi, nil
}

type readSeekCloser interface {
	io.ReadSeeker
	io.Closer
}

type nopSeekCloser struct{ *bytes.Reader }

func (nopSeekCloser) Close() error { return nil }

// spoolWriter keeps up to limit bytes in memory, then moves to spill.
type spoolWriter struct {
	mem   *bytes.Buffer
	limit int
	spill func() (io.Writer, error)
	out   io.Writer
	n     int64
	err   error
}

func (s *spoolWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	s.n += int64(len(p))
	if s.out == nil && s.mem.Len()+len(p) <= s.limit {
		return s.mem.Write(p)
	}
	if s.out == nil {
		if s.out, s.err = s.spill(); s.err != nil {
			return 0, s.err
		}
		if _, s.err = s.out.Write(s.mem.Bytes()); s.err != nil {
			return 0, s.err
		}
		s.mem.Reset()
	}
	n, err := s.out.Write(p)
	s.err = err
	return n, err
}

// walk lists the regular files below dir in the sandbox (as the daemon's
// identity), by path relative to dir. Symbolic links and other special
// files are not followed or uploaded. More than limit files is an error.
func walk(ctx context.Context, c *agentclient.Client, dir string, limit int) (map[string]*agentclient.FileInfo, error) {
	out := map[string]*agentclient.FileInfo{}
	queue := []string{""}
	for len(queue) > 0 {
		rel := queue[0]
		queue = queue[1:]
		token := ""
		for {
			resp, err := c.ListDir(ctx, path.Join(dir, rel), agentclient.ListDirOptions{PageToken: token})
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", path.Join(dir, rel), err)
			}
			for _, fi := range resp.Entries {
				if len(fi.RawName) > 0 {
					continue // not UTF-8: no key for it
				}
				r := path.Join(rel, fi.Name)
				switch fi.Type {
				case agentclient.FileDirectory:
					queue = append(queue, r)
				case agentclient.FileRegular:
					if len(out) >= limit {
						return nil, errkind.Errorf(errkind.ErrResourceExhausted, "%s holds more than %d files (mount.Config.MaxObjects)", dir, limit)
					}
					out[r] = &fi
				}
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
	}
	return out, nil
}
