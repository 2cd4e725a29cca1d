package mount

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/storeerr"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Backend opens the storage of the mount entries of some types: package
// s3mount serves s3_mount, r2_mount and s3_files_mount, gcsmount
// gcs_mount, azuremount azure_blob_mount. Config.Backends lists those a
// Mounter uses, so that a program links the SDK of the storages it passes
// and no other. A Backend must be safe for concurrent use.
type Backend interface {
	// Types are the manifest entry types the backend serves.
	Types() []manifest.EntryType
	// Open returns the storage of one mount entry, or an error saying
	// what is wrong with the entry or the configuration (an errkind
	// class: FailedPrecondition for missing configuration,
	// InvalidArgument for a bad entry). Open need not contact the storage:
	// the listing reports a wrong bucket or refused credentials.
	Open(ctx context.Context, req *Request) (*Storage, error)
}

// Request is one mount entry for Backend.Open, with the Mounter's
// settings for storage requests and its secret resolver.
type Request struct {
	// Path is the mount's workspace path, for messages.
	Path string
	// Entry is the mount entry; Entry.Mount is set.
	Entry *manifest.Entry
	// HTTPClient sends the storage requests; nil means the backend's
	// default (http.DefaultClient, or its SDK's).
	HTTPClient *http.Client
	// MaxAttempts bounds the tries of one storage request (at least 1).
	MaxAttempts int
	// Log is the Mounter's logger (never nil).
	Log *zap.Logger

	resolver manifest.SecretResolver
	secrets  []string // values errors of the mount never show
}

// Credentials resolves the secret references of a mount's credentials
// (the entry's Mount.Credentials, or ones of a backend's own
// configuration) through Config.Secrets, unless they hold their values
// already. The values are recorded: no error of the mount shows them.
func (r *Request) Credentials(ctx context.Context, refs map[string]manifest.SecretRef) (map[string]string, error) {
	vals := map[string]string{}
	for k, ref := range refs {
		v, ok := ref.Value()
		if !ok {
			if r.resolver == nil {
				return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: credential %s (%s) is not resolved and the harness has no secret resolver (mount.Config.Secrets)", r.Path, k, ref.String())
			}
			var err error
			if v, err = r.resolver.ResolveSecret(ctx, ref.Name); err != nil {
				return nil, fmt.Errorf("mount %s: credential %s (%s): %w", r.Path, k, ref.String(), err)
			}
		}
		vals[k] = v
		if len(v) >= 4 {
			r.secrets = append(r.secrets, v)
		}
	}
	return vals, nil
}

// Redact records one more value that no error of the mount may show (a
// private key found inside a resolved credential, say).
func (r *Request) Redact(secret string) {
	if secret != "" {
		r.secrets = append(r.secrets, secret)
	}
}

// Redacted returns text without the values recorded so far.
func (r *Request) Redacted(text string) string { return storeerr.Redact(text, r.secrets) }

// Storage is one mount's storage, as Backend.Open made it.
type Storage struct {
	// Objects reads and writes the objects.
	Objects Objects
	// Bucket names the bucket (or container), for messages.
	Bucket string
	// Prefix is the key prefix the mount's root maps to: "" or ending in
	// "/"; KeyPrefix(Entry.Mount.Prefix) unless the backend maps the
	// entry elsewhere.
	Prefix string
	// Description names the storage in logs and errors, without
	// credentials: "s3://bucket/prefix/ at endpoint".
	Description string
}

// KeyPrefix is the key prefix of a mount's prefix: "" or ending in "/".
func KeyPrefix(prefix string) string {
	if pre := strings.Trim(prefix, "/"); pre != "" {
		return pre + "/"
	}
	return ""
}

// Objects is one kind of object storage as a mount sees it: a flat key
// space under a bucket, each object with an opaque version (an S3 ETag, a
// GCS generation) that changes whenever the object is replaced.
//
// Methods return ErrGone and ErrChanged (possibly wrapped) for the two
// outcomes the Mounter acts on; any other error is the backend's own,
// read by Inspect.
type Objects interface {
	// List calls fn for every object whose key starts with prefix, a
	// page of at most pageSize keys per request.
	List(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error
	// Get opens the object at key as it was at version. size is the
	// length the server announced, -1 when it did not. An object replaced
	// or removed since is ErrChanged.
	Get(ctx context.Context, key, version string) (body io.ReadCloser, size int64, err error)
	// Head returns the current version of the object at key; ErrGone if
	// there is none.
	Head(ctx context.Context, key string) (string, error)
	// Put uploads size bytes of body (sha256 is their hex digest) to
	// key, only if the object is still at ifVersion, or, when ifVersion
	// is "", only if there is no object at key. A failed condition is
	// ErrChanged. It returns the new version. body may be read more than
	// once (it is rewound before each attempt).
	Put(ctx context.Context, key string, body io.ReadSeeker, size int64, sha256 string, ifVersion string) (string, error)
	// Remove deletes the object at key if it is still at version: one
	// replaced since is ErrChanged, one gone already is ErrGone.
	Remove(ctx context.Context, key, version string) error
	// Inspect reads one of the backend's errors, for the Mounter to say
	// what failed and whether retrying can help.
	Inspect(err error) ErrorInfo
}

// SelfCheckingRemover is implemented by Objects whose Remove checks the
// version itself, whatever the server (S3's conditional delete, probed
// once per store): Sync then sends no Head before a delete. For the
// others the Head is the check against a server that would ignore the
// condition.
type SelfCheckingRemover interface {
	RemoveChecksVersion() bool
}

// ErrorInfo is what a backend reads in one of its errors. The HTTP status
// counts too: 404 is NotFound, 401 Unauthenticated, 403
// PermissionDenied, 429 and a 5xx other than 501 Unavailable.
type ErrorInfo struct {
	// Code is the storage's error code, if any (shown in messages).
	Code string
	// Status is the HTTP status of the answer, 0 when there was none.
	Status int
	// NoBucket: the bucket (or container) does not exist.
	NoBucket bool
	// NotFound: there is no such object.
	NotFound bool
	// Unauthenticated: the storage refused the credentials.
	Unauthenticated bool
	// PermissionDenied: the credentials may not do this.
	PermissionDenied bool
	// Unavailable: retrying later can help (throttling, an outage, a
	// broken connection).
	Unavailable bool
}

var (
	// ErrGone is what Objects methods return when there is no object at
	// the key.
	ErrGone = errors.New("no such object")
	// ErrChanged is what Objects methods return when the object is not at
	// the version expected.
	ErrChanged = errors.New("object changed")
)
