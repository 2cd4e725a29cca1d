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
// S3 and R2 go through aws-sdk-go-v2; GCS through a small hand-written
// JSON API client (gcs.go) with OAuth bearer tokens, tested against
// fake-gcs-server; Azure Blob through the Azure SDK's azblob (azure.go),
// tested at the unit level against an in-test server that checks its
// Shared Key signatures. s3_files_mount reads the S3 bucket that backs
// the S3 Files file system (s3files.go, Config.S3FileSystems), with no
// NFS mount in the sandbox.
//
// Wiring:
//
//	m, _ := mount.New(mount.Config{Secrets: mount.EnvSecrets(), Log: log})
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
// mount naming none uses Config.DefaultCredentials (S3, S3 Files),
// Config.GCSTokens (GCS) or Config.AzureCredential (Azure). Resolved values
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
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/aws/aws-sdk-go-v2/aws"
	"go.uber.org/zap"
	"golang.org/x/oauth2"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Config configures a Mounter.
type Config struct {
	// Secrets resolves the secret names of mount credentials that the
	// manifest holds unresolved; nil means only resolved values are used.
	Secrets manifest.SecretResolver
	// DefaultCredentials sign the requests of mounts that name no
	// credentials (an IAM role, the harness's environment); nil refuses
	// such mounts. aws.AnonymousCredentials{} reads public buckets.
	DefaultCredentials aws.CredentialsProvider
	// Baselines, when set, keeps the baseline of every writable mount
	// (see BaselineStore) so that another harness process sharing it can
	// sync a session it reattached to; nil keeps them in memory only.
	Baselines BaselineStore
	// GCSTokens authorize the requests of gcs_mount entries that name no
	// credentials (for example a workload identity's tokens); nil refuses
	// such mounts.
	GCSTokens oauth2.TokenSource
	// AzureCredential authorizes the requests of azure_blob_mount entries
	// that name no credentials (an Entra ID identity of the harness, for
	// example azidentity's managed identity or workload identity); nil
	// refuses such mounts.
	AzureCredential azcore.TokenCredential
	// S3FileSystems says, per S3 Files file system id (fs-...), which
	// bucket and prefix keep its data: s3_files_mount entries are read
	// through that bucket (see s3files.go). A file system not listed is
	// refused.
	S3FileSystems map[string]S3FileSystem
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
	// R2Region is the signing region of r2_mount entries; "" means
	// "auto", Cloudflare's. (An S3-compatible stand-in for R2 may want
	// its own.)
	R2Region string
	// MaxAttempts bounds the tries of one request; zero means 5.
	MaxAttempts int
	// HTTPClient, when set, sends the requests.
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
	cfg Config
	log *zap.Logger

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
	return &Mounter{cfg: cfg, log: log, sessions: map[string]map[string]*mounted{}}, nil
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

// bucketStore is one mount's storage: a backend, the key prefix and the
// credential values to redact from errors.
type bucketStore struct {
	be      backend
	bucket  string // the bucket (or container) name, for messages
	prefix  string // "" or ending in "/"
	desc    string // scheme://bucket/prefix, no credentials
	secrets []string
}

// describe sets the store's description.
func (st *bucketStore) describe(scheme, endpoint string) {
	st.desc = scheme + "://" + st.bucket + "/" + st.prefix
	if endpoint != "" {
		st.desc += " at " + endpoint
	}
}

// storeFor builds the store of a mount entry.
func (m *Mounter) storeFor(ctx context.Context, p string, e *manifest.Entry) (*bucketStore, error) {
	st := &bucketStore{bucket: e.Mount.Bucket, prefix: trimSlash(e.Mount.Prefix)}
	var err error
	switch e.Type {
	case manifest.TypeS3Mount, manifest.TypeR2Mount:
		err = m.s3Store(ctx, p, e, st)
	case manifest.TypeGCSMount:
		err = m.gcsStore(ctx, p, e, st)
	case manifest.TypeAzureBlobMount:
		err = m.azureStore(ctx, p, e, st)
	case manifest.TypeS3FilesMount:
		err = m.s3FilesStore(ctx, p, e, st)
	default:
		err = errkind.Errorf(errkind.ErrUnimplemented, "%s mounts are not supported", e.Type)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// resolveCredentials resolves the secrets a mount names and records the
// values to redact.
func (m *Mounter) resolveCredentials(ctx context.Context, p string, e *manifest.Entry, st *bucketStore) (map[string]string, error) {
	vals := map[string]string{}
	for k, ref := range e.Mount.Credentials {
		v, ok := ref.Value()
		if !ok {
			if m.cfg.Secrets == nil {
				return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: credential %s (%s) is not resolved and the harness has no secret resolver (mount.Config.Secrets)", p, k, ref.String())
			}
			var err error
			if v, err = m.cfg.Secrets.ResolveSecret(ctx, ref.Name); err != nil {
				return nil, fmt.Errorf("mount %s: credential %s (%s): %w", p, k, ref.String(), err)
			}
		}
		vals[k] = v
		if len(v) >= 4 {
			st.secrets = append(st.secrets, v)
		}
	}
	return vals, nil
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
