// Package mount makes the remote-storage mount entries of a manifest
// (s3_mount, r2_mount, gcs_mount, azure_blob_mount, s3_files_mount) work
// on every provider without putting a credential in the sandbox: the
// harness lists the bucket with its own credentials and streams the
// objects into the mount path through the daemon's Materialize call (a copy, not a live file system). Writable
// mounts are uploaded back by Sync (on demand) and PreStop (when the
// session closes), with every object's version (S3 ETag, GCS generation)
// remembered at download so that a change made remotely in the meantime
// is reported as a conflict, never overwritten.
//
// The storages are backends (see Backend), each a package of its own so
// that a program links the SDKs of the storages it uses and no other:
// s3mount (s3_mount and r2_mount through aws-sdk-go-v2, and s3_files_mount
// through the S3 bucket backing an S3 Files file system, with no NFS mount
// in the sandbox), gcsmount (gcs_mount through a small hand-written JSON
// API client with OAuth bearer tokens, tested against fake-gcs-server) and
// azuremount (azure_blob_mount through the Azure SDK's azblob, tested at
// the unit level against an in-test server that checks its Shared Key
// signatures). This package links none of them: Config.Backends names the
// ones a Mounter uses, and an entry of a type none serves is refused.
//
// Wiring:
//
//	m, _ := mount.New(mount.Config{Secrets: mount.EnvSecrets(), Log: log,
//		Backends: []mount.Backend{s3mount.New(s3mount.Config{}), gcsmount.New(gcsmount.Config{})}})
//	c := compute.NewClient(p, compute.ClientOptions{
//		Materializer: materializer.Options{Mounts: m},
//		PreStopHooks: []compute.PreStopHook{m.PreStop},
//	})
//
// Credentials: a mount's `credentials` name secrets (see
// manifest.CredentialKeys: access_key_id, secret_access_key, session_token
// for S3; access_token or service_account_key for GCS; account_key or
// sas_token for Azure), resolved here through Config.Secrets unless the
// manifest copy holds them resolved already (manifest.ResolveSecrets); a
// mount naming none uses its backend's default credentials
// (s3mount.Config.DefaultCredentials, gcsmount.Config.Tokens,
// azuremount.Config.Credential). Resolved values
// live in memory only: state and snapshots carry the secret names, and
// errors and logs are redacted.
//
// Deleted files of a writable mount are deleted remotely only when the
// object is still the one that was downloaded (its version); otherwise the
// deletion is a conflict. Empty directories are not kept remotely (object
// stores have none). The versions live in this Mounter's memory and, with
// Config.Baselines, in a harness-side store: a session reattached by
// another harness process sharing that store syncs as if it had started
// there; without one, Sync refuses its writable mounts rather than guess.
package mount

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Config configures a Mounter.
type Config struct {
	// Backends serve the mount entries (s3mount.New, gcsmount.New,
	// azuremount.New, or one of the program's own). An entry of a type
	// none of them serves is refused (Unimplemented) before anything is
	// written; two serving one type is an error of New.
	Backends []Backend
	// Secrets resolves the secret names of mount credentials that the
	// manifest holds unresolved; nil means only resolved values are used.
	Secrets manifest.SecretResolver
	// Baselines, when set, keeps the baseline of every writable mount
	// (see BaselineStore) so that another harness process sharing it can
	// sync a session it reattached to; nil keeps them in memory only.
	Baselines BaselineStore
	// MaxBytes bounds the total size of one mount's objects; zero means
	// 10 GiB. A larger mount fails with ErrResourceExhausted before
	// anything is written.
	MaxBytes int64
	// MaxObjects bounds the number of objects of one mount (and the files
	// Sync walks); zero means 100,000.
	MaxObjects int
	// Concurrency bounds the transfers of one mount running at once; zero
	// means 8.
	Concurrency int
	// PageSize is how many keys one listing request asks for; zero means
	// 1000 (the most S3 returns).
	PageSize int32
	// PrefetchBytes: objects at most this large are downloaded ahead, in
	// memory (at most 2*Concurrency of them at once); larger ones stream
	// straight from the server. Zero means 1 MiB.
	PrefetchBytes int64
	// MaxAttempts bounds the tries of one request; zero means 5.
	MaxAttempts int
	// HTTPClient, when set, sends the storage requests.
	HTTPClient *http.Client
	// Log receives a line per mount listed and synced; nil means none.
	Log *zap.Logger
}

// Defaults of Config.
const (
	DefaultMaxBytes      = 10 << 30
	DefaultMaxObjects    = 100_000
	DefaultConcurrency   = 8
	DefaultPageSize      = 1000
	DefaultPrefetchBytes = 1 << 20
	defaultMaxAttempts   = 5
)

// Mounter expands mount entries for the materializer and uploads writable
// mounts back. It keeps, per session, the objects each mount downloaded.
// It is safe for concurrent use.
type Mounter struct {
	cfg      Config
	log      *zap.Logger
	backends map[manifest.EntryType]Backend

	mu       sync.Mutex
	sessions map[string]map[string]*mounted // session id -> mount path -> state
}

var _ materializer.Mounter = (*Mounter)(nil)

// New returns a Mounter.
func New(cfg Config) (*Mounter, error) {
	if cfg.MaxBytes < 0 || cfg.MaxObjects < 0 || cfg.Concurrency < 0 || cfg.PageSize < 0 || cfg.PrefetchBytes < 0 {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount: negative limit in config")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxObjects == 0 {
		cfg.MaxObjects = DefaultMaxObjects
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.PageSize == 0 || cfg.PageSize > 1000 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.PrefetchBytes == 0 {
		cfg.PrefetchBytes = DefaultPrefetchBytes
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = defaultMaxAttempts
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	backends := map[manifest.EntryType]Backend{}
	for i, b := range cfg.Backends {
		if b == nil {
			return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount: backend %d is nil", i)
		}
		for _, t := range b.Types() {
			if !t.IsMount() {
				return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount: backend %d serves %q, which is not a mount type", i, t)
			}
			if _, dup := backends[t]; dup {
				return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount: two backends serve %s", t)
			}
			backends[t] = b
		}
	}
	return &Mounter{cfg: cfg, log: log, backends: backends, sessions: map[string]map[string]*mounted{}}, nil
}

// EnvSecrets resolves secret names from the harness's environment: the
// secret "R2_SECRET" is the variable R2_SECRET. An unset variable is an
// error naming the variable.
func EnvSecrets() manifest.SecretResolver {
	return manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			return "", errkind.Errorf(errkind.ErrFailedPrecondition, "environment variable %s is not set", name)
		}
		return v, nil
	})
}

// bucketStore is one mount's storage: its objects, the key prefix and the
// credential values to redact.
type bucketStore struct {
	objects Objects
	bucket  string // the bucket (or container) name, for messages
	prefix  string // "" or ending in "/"
	desc    string // scheme://bucket/prefix, no credentials
	secrets []string
}

// storeFor opens the storage of a mount entry through the backend serving
// its type.
func (m *Mounter) storeFor(ctx context.Context, p string, e *manifest.Entry) (*bucketStore, error) {
	b, ok := m.backends[e.Type]
	if !ok {
		return nil, errkind.Errorf(errkind.ErrUnimplemented, "mount %s: %s mounts are not supported: this harness has no backend for them (mount.Config.Backends)", p, e.Type)
	}
	req := &Request{Path: p, Entry: e, HTTPClient: m.cfg.HTTPClient, MaxAttempts: m.cfg.MaxAttempts, Log: m.log, resolver: m.cfg.Secrets}
	sto, err := b.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	if sto == nil || sto.Objects == nil {
		return nil, errkind.Errorf(errkind.ErrInternal, "mount %s: the %s backend opened no storage", p, e.Type)
	}
	if sto.Prefix != "" && !strings.HasSuffix(sto.Prefix, "/") {
		return nil, errkind.Errorf(errkind.ErrInternal, "mount %s: the %s backend gave the key prefix %q, which does not end in /", p, e.Type, sto.Prefix)
	}
	return &bucketStore{objects: sto.Objects, bucket: sto.Bucket, prefix: sto.Prefix, desc: sto.Description, secrets: req.secrets}, nil
}

// mounted is what one mount of one session downloaded.
type mounted struct {
	path     string // workspace-relative mount path
	readOnly bool
	entry    *manifest.Entry
	st       *bucketStore

	mu      sync.Mutex            // one Sync at a time
	objects map[string]*objectRef // by path relative to the mount
	ready   bool                  // the daemon wrote it (Applied ran)
}

// objectRef is one object as downloaded (and later uploaded).
type objectRef struct {
	rel   string // path relative to the mount
	key   string
	etag  string // the version: an S3 ETag, a GCS generation
	size  int64
	sha   string    // hex sha256 of the bytes in the sandbox (after Applied)
	mtime time.Time // the sandbox file's modification time (after Applied)
}

// state returns the session's mount at p, or nil.
func (m *Mounter) state(session, p string) *mounted {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[session][p]
}

func (m *Mounter) setState(session string, mt *mounted) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[session] == nil {
		m.sessions[session] = map[string]*mounted{}
	}
	m.sessions[session][mt.path] = mt
}

// Forget drops what the Mounter remembers of a session's mounts.
func (m *Mounter) Forget(session string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.sessions, session)
}
