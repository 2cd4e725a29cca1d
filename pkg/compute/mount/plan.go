package mount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Modes of mounted files. A read-only mount belongs to the daemon's
// identity (root in a sandbox) and the entry's group, with no write bit
// anywhere: the run_as account can read it and change nothing. A writable
// mount belongs to the run_as account (or root and the entry's group,
// group-writable).
const (
	roDirMode  = 0o555
	roFileMode = 0o444
	rwDirMode  = 0o755
	rwFileMode = 0o644
)

// PlanMount lists the bucket behind a mount entry (paged) and returns its
// directories and files, checked against the size and count limits before
// anything is written. The objects are read when the tar stream is written:
// small ones ahead of time with bounded concurrency, large ones streamed.
func (m *Mounter) PlanMount(ctx context.Context, req materializer.MountRequest) (*materializer.MountPlan, error) {
	e := req.Entry
	switch e.Type {
	case manifest.TypeS3Mount, manifest.TypeR2Mount, manifest.TypeGCSMount, manifest.TypeAzureBlobMount, manifest.TypeS3FilesMount:
	default:
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "%s is not a mount type", e.Type)
	}
	if e.Mount == nil {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount %s has no mount description", req.Path)
	}
	st, err := m.storeFor(ctx, req.Path, e)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	objs, dirs, err := m.list(ctx, req.Path, st)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, o := range objs {
		total += o.size
	}
	m.log.Info("mount listed", zap.String("mount", req.Path), zap.String("store", st.desc), zap.Int("objects", len(objs)),
		zap.Int64("bytes", total), zap.Duration("took", time.Since(start)))

	ro := e.Mount.IsReadOnly()
	dirMode, fileMode, user := uint32(roDirMode), uint32(roFileMode), ""
	if !ro {
		dirMode, fileMode, user = rwDirMode, rwFileMode, req.Owner
		if e.Group != "" {
			dirMode, fileMode = 0o775, 0o664
		}
	}
	plan := &materializer.MountPlan{}
	plan.Entries = append(plan.Entries, &agentclient.MaterializeEntry{Path: req.Path, Kind: agentclient.EntryDirectory,
		Mode: dirMode, User: user, Group: e.Group})
	for _, d := range dirs {
		plan.Entries = append(plan.Entries, &agentclient.MaterializeEntry{Path: path.Join(req.Path, d), Kind: agentclient.EntryDirectory,
			Mode: dirMode, User: user, Group: e.Group})
	}
	for _, o := range objs {
		plan.Entries = append(plan.Entries, &agentclient.MaterializeEntry{Path: path.Join(req.Path, o.rel), Kind: agentclient.EntryFile,
			Mode: fileMode, User: user, Group: e.Group, Size: o.size})
	}
	f := newFetcher(ctx, m, st, req.Path, objs)
	plan.Open, plan.Close = f.open, f.close
	mt := &mounted{path: req.Path, readOnly: ro, entry: e, st: st, objects: make(map[string]*objectRef, len(objs))}
	for _, o := range objs {
		mt.objects[o.rel] = o
	}
	session := req.Session
	plan.Applied = func(ctx context.Context, c *agentclient.Client, files []agentclient.MaterializedFile) error {
		return m.applied(ctx, c, session, mt, files)
	}
	return plan, nil
}

// list pages through the keys under the mount's prefix and returns the
// files (sorted) and the directories below the mount (sorted, parents
// first). Keys that cannot be a workspace path, or that are both a file
// and a directory, are left out with a warning.
func (m *Mounter) list(ctx context.Context, mountPath string, st *bucketStore) ([]*objectRef, []string, error) {
	var objs []*objectRef
	dirSet := map[string]bool{}
	var total int64
	skipped := 0
	err := st.objects.List(ctx, st.prefix, m.cfg.PageSize, func(key, version string, size int64) error {
		rel := strings.TrimPrefix(key, st.prefix)
		if rel == "" {
			return nil
		}
		if strings.HasSuffix(rel, "/") { // a directory marker
			if d := strings.TrimSuffix(rel, "/"); manifest.ValidateEntryPath(d) == nil {
				dirSet[d] = true
			}
			return nil
		}
		if err := manifest.ValidateEntryPath(rel); err != nil {
			skipped++
			m.log.Warn("mount: object left out: its key is not a usable path", zap.String("mount", mountPath), zap.String("key", key), zap.Error(err))
			return nil
		}
		total += size
		if len(objs) >= m.cfg.MaxObjects {
			return errkind.Errorf(errkind.ErrResourceExhausted, "mount %s (%s) holds more than %d objects (the limit, mount.Config.MaxObjects); nothing was written", mountPath, st.desc, m.cfg.MaxObjects)
		}
		if total > m.cfg.MaxBytes {
			return errkind.Errorf(errkind.ErrResourceExhausted, "mount %s (%s) holds more than %d bytes (the limit, mount.Config.MaxBytes); nothing was written", mountPath, st.desc, m.cfg.MaxBytes)
		}
		objs = append(objs, &objectRef{rel: rel, key: key, etag: version, size: size})
		return nil
	})
	if errors.Is(err, errkind.ErrResourceExhausted) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, st.classify(ctx, "list", st.prefix, err)
	}
	for _, o := range objs {
		for d := path.Dir(o.rel); d != "."; d = path.Dir(d) {
			dirSet[d] = true
		}
	}
	kept := objs[:0]
	for _, o := range objs {
		if dirSet[o.rel] {
			skipped++
			m.log.Warn("mount: object left out: a directory of the same name holds other objects", zap.String("mount", mountPath), zap.String("key", o.key))
			continue
		}
		kept = append(kept, o)
	}
	objs = kept
	slices.SortFunc(objs, func(a, b *objectRef) int { return strings.Compare(a.rel, b.rel) })
	dirs := make([]string, 0, len(dirSet))
	for d := range dirSet {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs) // a parent sorts before anything below it
	if skipped > 0 {
		m.log.Warn("mount: some objects were left out", zap.String("mount", mountPath), zap.Int("skipped", skipped))
	}
	return objs, dirs, nil
}

// applied records a writable mount's baseline once the daemon wrote it:
// the sha256 of each file from the daemon's report and its modification
// time from a walk, so that Sync finds what changed without reading what
// did not.
func (m *Mounter) applied(ctx context.Context, c *agentclient.Client, session string, mt *mounted, files []agentclient.MaterializedFile) error {
	if mt.readOnly {
		return nil
	}
	for _, f := range files {
		rel := strings.TrimPrefix(strings.TrimPrefix(f.Path, mt.path), "/")
		if o := mt.objects[rel]; o != nil {
			o.sha = f.SHA256
		}
	}
	local, err := walk(ctx, c, mt.path, m.cfg.MaxObjects)
	if err != nil {
		return fmt.Errorf("record the mounted files: %w", err)
	}
	for rel, fi := range local {
		o := mt.objects[rel]
		if o == nil {
			// Left from an earlier start in a kept workspace: the storage
			// no longer has it, and Sync must not take it for a new file.
			if err := c.Remove(ctx, path.Join(mt.path, rel), agentclient.RemoveOptions{}); err != nil {
				return fmt.Errorf("remove %s, no longer in the storage: %w", path.Join(mt.path, rel), err)
			}
			continue
		}
		o.mtime = fi.ModifiedAt
	}
	mt.ready = true
	m.setState(session, mt)
	m.saveBaseline(ctx, session, mt)
	return nil
}

// fetcher yields a mount's objects in plan order, downloading small ones
// ahead with bounded concurrency and memory.
type fetcher struct {
	ctx    context.Context
	cancel context.CancelFunc
	m      *Mounter
	st     *bucketStore
	mount  string
	objs   []*objectRef
	index  map[string]int // workspace path -> position
	ahead  int
	sem    chan struct{}

	mu      sync.Mutex
	started int
	results []chan fetched
}

type fetched struct {
	data []byte
	err  error
}

func newFetcher(ctx context.Context, m *Mounter, st *bucketStore, mountPath string, objs []*objectRef) *fetcher {
	ctx, cancel := context.WithCancel(ctx)
	f := &fetcher{ctx: ctx, cancel: cancel, m: m, st: st, mount: mountPath, objs: objs, index: make(map[string]int, len(objs)),
		ahead: 2 * m.cfg.Concurrency, sem: make(chan struct{}, m.cfg.Concurrency), results: make([]chan fetched, len(objs))}
	for i, o := range objs {
		f.index[path.Join(mountPath, o.rel)] = i
	}
	return f
}

func (f *fetcher) close() { f.cancel() }

// open returns the bytes of the file at workspace path p.
func (f *fetcher) open(p string) (io.ReadCloser, int64, error) {
	i, ok := f.index[p]
	if !ok {
		return nil, 0, errkind.Errorf(errkind.ErrInternal, "mount %s: %s was not planned", f.mount, p)
	}
	f.mu.Lock()
	f.startThrough(min(i+f.ahead, len(f.objs)-1))
	ch := f.results[i]
	f.results[i] = nil
	f.mu.Unlock()
	o := f.objs[i]
	if ch == nil { // large: streamed at its turn
		body, err := f.st.get(f.ctx, o)
		if err != nil {
			return nil, 0, fmt.Errorf("mount %s: %w", f.mount, err)
		}
		return body, o.size, nil
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, 0, fmt.Errorf("mount %s: %w", f.mount, r.err)
		}
		return io.NopCloser(bytes.NewReader(r.data)), int64(len(r.data)), nil
	case <-f.ctx.Done():
		return nil, 0, f.ctx.Err()
	}
}

// startThrough starts the downloads of the small objects up to index j.
// f.mu is held.
func (f *fetcher) startThrough(j int) {
	for ; f.started <= j; f.started++ {
		o := f.objs[f.started]
		if o.size > f.m.cfg.PrefetchBytes {
			continue
		}
		ch := make(chan fetched, 1)
		f.results[f.started] = ch
		go func() {
			select {
			case f.sem <- struct{}{}:
			case <-f.ctx.Done():
				ch <- fetched{err: f.ctx.Err()}
				return
			}
			defer func() { <-f.sem }()
			data, err := f.st.getAll(f.ctx, o)
			ch <- fetched{data: data, err: err}
		}()
	}
}

// get opens an object as listed, at the version listed, so that an
// object replaced since the listing is a conflict rather than bytes of
// another size.
func (st *bucketStore) get(ctx context.Context, o *objectRef) (io.ReadCloser, error) {
	body, n, err := st.objects.Get(ctx, o.key, o.etag)
	if err != nil {
		if errors.Is(err, ErrChanged) {
			return nil, errkind.MarkRetryable(errkind.Errorf(errkind.ErrConflict, "object %s changed while it was being mounted; start again", o.key))
		}
		return nil, st.classify(ctx, "read", o.key, err)
	}
	if n >= 0 && n != o.size {
		body.Close()
		return nil, errkind.MarkRetryable(errkind.Errorf(errkind.ErrConflict, "object %s changed while it was being mounted (%d -> %d bytes); start again", o.key, o.size, n))
	}
	return body, nil
}

// getAll reads a small object whole.
func (st *bucketStore) getAll(ctx context.Context, o *objectRef) ([]byte, error) {
	body, err := st.get(ctx, o)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	data := make([]byte, 0, o.size)
	buf := bytes.NewBuffer(data)
	if _, err := io.Copy(buf, io.LimitReader(body, o.size+1)); err != nil {
		return nil, st.classify(ctx, "read", o.key, err)
	}
	if int64(buf.Len()) != o.size {
		return nil, errkind.MarkRetryable(errkind.Errorf(errkind.ErrConflict, "object %s changed while it was being mounted; start again", o.key))
	}
	return buf.Bytes(), nil
}
