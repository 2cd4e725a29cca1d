package mount

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// BaselineStore keeps, on the harness side, what each writable mount of a
// session downloaded: every object's key, version (ETag or generation),
// size, and the sha256 and modification time of its file in the sandbox.
// With one configured (Config.Baselines), a Mounter saves a mount's
// baseline when the daemon wrote it and after each Sync, and a Mounter in
// another harness process that shares the store can sync a session it
// reattached to (compute.Client.Resume) instead of refusing. It holds no
// credential and no file contents. Save replaces; Load of a baseline that
// was never saved is an error matching errkind.ErrNotFound.
type BaselineStore interface {
	SaveBaseline(ctx context.Context, session, mountPath string, data []byte) error
	LoadBaseline(ctx context.Context, session, mountPath string) ([]byte, error)
	DeleteBaselines(ctx context.Context, session string) error
}

// DirBaselines is a BaselineStore in a directory of the harness's (created
// when first written): a subdirectory per session, a file per mount,
// written atomically.
func DirBaselines(dir string) BaselineStore { return dirBaselines(dir) }

type dirBaselines string

// Names are hashed: session ids and mount paths never become path
// elements.
func (d dirBaselines) sessionDir(session string) string {
	h := sha256.Sum256([]byte(session))
	return filepath.Join(string(d), hex.EncodeToString(h[:16]))
}

func (d dirBaselines) file(session, mountPath string) string {
	h := sha256.Sum256([]byte(mountPath))
	return filepath.Join(d.sessionDir(session), hex.EncodeToString(h[:16])+".json")
}

func (d dirBaselines) SaveBaseline(_ context.Context, session, mountPath string, data []byte) error {
	dir := d.sessionDir(session)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mount baselines: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("mount baselines: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("mount baselines: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("mount baselines: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("mount baselines: %w", err)
	}
	if err := os.Rename(tmp.Name(), d.file(session, mountPath)); err != nil {
		return fmt.Errorf("mount baselines: %w", err)
	}
	return nil
}

func (d dirBaselines) LoadBaseline(_ context.Context, session, mountPath string) ([]byte, error) {
	b, err := os.ReadFile(d.file(session, mountPath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errkind.Errorf(errkind.ErrNotFound, "no saved baseline for mount %s of session %s", mountPath, session)
	}
	if err != nil {
		return nil, fmt.Errorf("mount baselines: %w", err)
	}
	return b, nil
}

func (d dirBaselines) DeleteBaselines(_ context.Context, session string) error {
	if err := os.RemoveAll(d.sessionDir(session)); err != nil {
		return fmt.Errorf("mount baselines: %w", err)
	}
	return nil
}

// baselineVersion is the version of the saved form.
const baselineVersion = 1

// baselineFile is a saved baseline. Type, Bucket, Prefix and Endpoint name
// the storage it was taken from: a baseline of another declaration is not
// used.
type baselineFile struct {
	Version  int              `json:"version"`
	Type     string           `json:"type"`
	Bucket   string           `json:"bucket"`
	Prefix   string           `json:"prefix"`
	Endpoint string           `json:"endpoint,omitempty"`
	Objects  []baselineObject `json:"objects"`
}

type baselineObject struct {
	Rel     string    `json:"rel"`
	Key     string    `json:"key"`
	Version string    `json:"version"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	MTime   time.Time `json:"mtime"`
}

func baselineHeader(e *manifest.Entry) baselineFile {
	bf := baselineFile{Version: baselineVersion, Type: string(e.Type), Bucket: e.Mount.Bucket, Prefix: KeyPrefix(e.Mount.Prefix), Endpoint: e.Mount.Endpoint}
	switch e.Type {
	case manifest.TypeAzureBlobMount: // no bucket: an account's container
		bf.Bucket = e.Mount.Account + "/" + e.Mount.Container
	case manifest.TypeS3FilesMount: // a file system's directory (the bucket is the harness's configuration)
		bf.Bucket = e.Mount.FileSystemID + "/" + e.Mount.AccessPoint
		bf.Prefix = e.Mount.Subpath
	}
	return bf
}

// saveBaseline saves a writable mount's baseline, if there is a store. A
// failure is logged, not returned: without the saved copy another process
// refuses to sync (or reports conflicts), it never overwrites.
func (m *Mounter) saveBaseline(ctx context.Context, session string, mt *mounted) {
	if m.cfg.Baselines == nil || mt.readOnly || mt.entry == nil {
		return
	}
	bf := baselineHeader(mt.entry)
	bf.Objects = make([]baselineObject, 0, len(mt.objects))
	for _, o := range mt.objects {
		bf.Objects = append(bf.Objects, baselineObject{Rel: o.rel, Key: o.key, Version: o.etag, Size: o.size, SHA256: o.sha, MTime: o.mtime})
	}
	data, err := json.Marshal(bf)
	if err == nil {
		err = m.cfg.Baselines.SaveBaseline(ctx, session, mt.path, data)
	}
	if err != nil {
		m.log.Warn("mount: could not save the baseline; another harness process will not sync this mount", zap.String("mount", mt.path), zap.Error(err))
	}
}

// loadBaseline rebuilds a writable mount's state from the store: nil when
// there is no store or no usable baseline.
func (m *Mounter) loadBaseline(ctx context.Context, session, p string, e *manifest.Entry) (*mounted, error) {
	if m.cfg.Baselines == nil {
		return nil, nil
	}
	data, err := m.cfg.Baselines.LoadBaseline(ctx, session, p)
	if errors.Is(err, errkind.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var bf baselineFile
	if err := json.Unmarshal(data, &bf); err != nil {
		return nil, fmt.Errorf("mount %s: saved baseline: %w", p, err)
	}
	want := baselineHeader(e)
	if bf.Version != want.Version || bf.Type != want.Type || bf.Bucket != want.Bucket || bf.Prefix != want.Prefix || bf.Endpoint != want.Endpoint {
		m.log.Warn("mount: the saved baseline is of another declaration; not used", zap.String("mount", p))
		return nil, nil
	}
	st, err := m.storeFor(ctx, p, e)
	if err != nil {
		return nil, err
	}
	mt := &mounted{path: p, entry: e, st: st, objects: make(map[string]*objectRef, len(bf.Objects)), ready: true}
	for _, o := range bf.Objects {
		mt.objects[o.Rel] = &objectRef{rel: o.Rel, key: o.Key, etag: o.Version, size: o.Size, sha: o.SHA256, mtime: o.MTime}
	}
	m.setState(session, mt)
	return mt, nil
}
