package s3mount

import (
	"context"
	"crypto/md5" //nolint:gosec // S3's single-part ETag, recognising an upload of ours, not a security measure
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3client"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3errs"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Config configures the S3 backend.
type Config struct {
	// DefaultCredentials sign the requests of mounts that name no
	// credentials (an IAM role, the harness's environment); nil refuses
	// such mounts. aws.AnonymousCredentials{} reads public buckets.
	DefaultCredentials aws.CredentialsProvider
	// R2Region is the signing region of r2_mount entries; "" means
	// "auto", Cloudflare's. (An S3-compatible stand-in for R2 may want
	// its own.)
	R2Region string
	// FileSystems says, per S3 Files file system id (fs-...), which
	// bucket and prefix keep its data: s3_files_mount entries are read
	// through that bucket (see FileSystem). A file system not listed is
	// refused.
	FileSystems map[string]FileSystem
}

// Backend is the mount.Backend of s3_mount, r2_mount and s3_files_mount
// entries. It is safe for concurrent use.
type Backend struct {
	cfg Config
}

var _ mount.Backend = (*Backend)(nil)

// New returns the backend.
func New(cfg Config) *Backend { return &Backend{cfg: cfg} }

// Types returns s3_mount, r2_mount and s3_files_mount.
func (b *Backend) Types() []manifest.EntryType {
	return []manifest.EntryType{manifest.TypeS3Mount, manifest.TypeR2Mount, manifest.TypeS3FilesMount}
}

// Open returns the storage of an s3_mount, r2_mount or s3_files_mount
// entry.
func (b *Backend) Open(ctx context.Context, req *mount.Request) (*mount.Storage, error) {
	if req.Entry.Type == manifest.TypeS3FilesMount {
		return b.openFiles(ctx, req)
	}
	return b.openBucket(ctx, req)
}

// s3MaxBackoff bounds the wait between two tries of an S3 request.
const s3MaxBackoff = 5 * time.Second

// openBucket opens the storage of an s3_mount or r2_mount entry. The
// endpoint is the manifest's, or for R2 the account's
// (https://ACCOUNT.r2.cloudflarestorage.com).
func (b *Backend) openBucket(ctx context.Context, req *mount.Request) (*mount.Storage, error) {
	mt := req.Entry.Mount
	region, endpoint := mt.Region, mt.Endpoint
	scheme := "s3"
	if req.Entry.Type == manifest.TypeR2Mount {
		scheme, region = "r2", b.cfg.R2Region
		if region == "" {
			region = "auto"
		}
		if endpoint == "" {
			endpoint = "https://" + mt.Account + ".r2.cloudflarestorage.com"
		}
	}
	objs, err := b.bucketObjects(ctx, req, mt.Bucket, region, endpoint, mt.Credentials)
	if err != nil {
		return nil, err
	}
	prefix := mount.KeyPrefix(mt.Prefix)
	desc := scheme + "://" + mt.Bucket + "/" + prefix
	if mt.Endpoint != "" {
		desc += " at " + mt.Endpoint
	}
	return &mount.Storage{Objects: objs, Bucket: mt.Bucket, Prefix: prefix, Description: desc}, nil
}

// objects is an S3 (or S3-compatible: R2, MinIO, Versity) bucket
// through aws-sdk-go-v2. Versions are ETags.
type objects struct {
	client *s3.Client
	bucket string
	// deletes is what the server does with a conditional delete
	// (deleteCond*), learnt at the first delete: see Remove.
	deletes atomic.Int32
}

var (
	_ mount.Objects             = (*objects)(nil)
	_ mount.SelfCheckingRemover = (*objects)(nil)
)

// bucketObjects makes the client of a bucket, signed with the credentials refs
// name (none: Config.DefaultCredentials). The client is built as the
// snapshot store's is (internal/s3client), with path-style addressing for
// any explicit endpoint and the SDK's backoff up to s3MaxBackoff between
// tries.
func (b *Backend) bucketObjects(ctx context.Context, req *mount.Request, bucket, region, endpoint string, refs map[string]manifest.SecretRef) (*objects, error) {
	creds, err := b.credentials(ctx, req, refs)
	if err != nil {
		return nil, err
	}
	client := s3client.New(s3client.Options{
		Region:       region, // "" means s3client.DefaultRegion
		Endpoint:     endpoint,
		UsePathStyle: endpoint != "",
		Credentials:  creds,
		MaxAttempts:  req.MaxAttempts,
		MaxBackoff:   s3MaxBackoff,
		HTTPClient:   req.HTTPClient,
	})
	return &objects{client: client, bucket: bucket}, nil
}

// credentials returns the provider signing a mount's requests; the
// request records the values to redact.
func (b *Backend) credentials(ctx context.Context, req *mount.Request, refs map[string]manifest.SecretRef) (aws.CredentialsProvider, error) {
	if len(refs) == 0 {
		if b.cfg.DefaultCredentials == nil {
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s names no credentials and the harness has no default mount credentials (s3mount.Config.DefaultCredentials)", req.Path)
		}
		return b.cfg.DefaultCredentials, nil
	}
	vals, err := req.Credentials(ctx, refs)
	if err != nil {
		return nil, err
	}
	id, secret := vals["access_key_id"], vals["secret_access_key"]
	if id == "" || secret == "" {
		return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: credentials need both access_key_id and secret_access_key", req.Path)
	}
	return credentials.NewStaticCredentialsProvider(id, secret, vals["session_token"]), nil
}

// List pages through the keys under prefix.
func (o *objects) List(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error {
	p := s3.NewListObjectsV2Paginator(o.client, &s3.ListObjectsV2Input{Bucket: &o.bucket, Prefix: aws.String(prefix), MaxKeys: aws.Int32(pageSize)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, obj := range page.Contents {
			if err := fn(aws.ToString(obj.Key), aws.ToString(obj.ETag), aws.ToInt64(obj.Size)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Get is If-Match the ETag, so that an object replaced since the listing
// is a conflict rather than bytes of another size.
func (o *objects) Get(ctx context.Context, key, version string) (io.ReadCloser, int64, error) {
	in := &s3.GetObjectInput{Bucket: &o.bucket, Key: aws.String(key)}
	if version != "" {
		in.IfMatch = aws.String(version)
	}
	out, err := o.client.GetObject(ctx, in)
	if err != nil {
		if s3errs.IsPreconditionFailed(err) || s3errs.IsNotFound(err) {
			return nil, 0, fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return nil, 0, err
	}
	size := int64(-1)
	if out.ContentLength != nil {
		size = *out.ContentLength
	}
	return out.Body, size, nil
}

func (o *objects) Head(ctx context.Context, key string) (string, error) {
	out, err := o.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &o.bucket, Key: aws.String(key)})
	if err != nil {
		if s3errs.IsNotFound(err) {
			return "", fmt.Errorf("%w: %w", mount.ErrGone, err)
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// Put is If-Match the ETag (If-None-Match for a new key); a server that
// does not implement conditional writes gets a plain PUT, the caller's
// HEAD having been the check. The upload carries the bytes' SHA-256,
// which the server checks and keeps. A failed condition whose object
// holds these very bytes is a retried upload whose first answer was lost
// (the first try landed, so the retry's condition no longer holds), not
// a conflict: see ownUpload.
//
// One PutObject, never a multipart upload.
func (o *objects) Put(ctx context.Context, key string, body io.ReadSeeker, size int64, sum string, ifVersion string) (string, error) {
	raw, _ := hex.DecodeString(sum)
	in := &s3.PutObjectInput{Bucket: &o.bucket, Key: aws.String(key), Body: body, ContentLength: aws.Int64(size),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256, ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(raw))}
	if ifVersion != "" {
		in.IfMatch = aws.String(ifVersion)
	} else {
		in.IfNoneMatch = aws.String("*")
	}
	out, err := o.client.PutObject(ctx, in)
	if err != nil && s3errs.IsNotImplemented(err) {
		in.IfMatch, in.IfNoneMatch = nil, nil
		if _, serr := body.Seek(0, io.SeekStart); serr != nil {
			return "", serr
		}
		out, err = o.client.PutObject(ctx, in)
	}
	if err != nil {
		if s3errs.IsPreconditionFailed(err) {
			if etag, ok := o.ownUpload(ctx, key, body, size, raw); ok {
				return etag, nil
			}
			return "", fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// ownUpload tells whether the object at key holds the size bytes of body
// (whose SHA-256 is sha), and returns its ETag if so: after a failed
// condition, an upload of ours that landed although its answer was lost.
//
// It HEADs the object asking for its checksums. A SHA-256 kept for the
// whole object (the one Put sent: AWS S3 and Versity Gateway keep it and
// show it) decides. Without one (a server keeping no checksums or only
// composite ones, as R2's documentation lists for SHA-256, or an object
// another writer uploaded without one), the object is ours if its ETag
// is the MD5 of body, as a single-part upload's is. A multipart upload's
// ETag ("MD5-of-the-parts'-MD5s-N") never matches, and neither does the
// ETag of an object encrypted with SSE-KMS or SSE-C (not an MD5 of the
// bytes): such an object without a SHA-256 stays a conflict, as before
// this check, never wrongly ours. Both compare the size first.
//
// Another writer that uploaded exactly these bytes is indistinguishable
// from our own lost answer, and counts as ours: the object then holds
// what the sandbox wrote, and its ETag becomes the baseline, so nothing
// is lost.
func (o *objects) ownUpload(ctx context.Context, key string, body io.ReadSeeker, size int64, sha []byte) (string, bool) {
	h, err := o.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &o.bucket, Key: aws.String(key), ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		return "", false
	}
	etag := aws.ToString(h.ETag)
	if etag == "" || aws.ToInt64(h.ContentLength) != size {
		return "", false
	}
	// A composite checksum (of the parts) ends in "-N", which base64 never
	// holds.
	if kept := aws.ToString(h.ChecksumSHA256); kept != "" && h.ChecksumType != types.ChecksumTypeComposite && !strings.Contains(kept, "-") {
		if len(sha) != sha256.Size || kept != base64.StdEncoding.EncodeToString(sha) {
			return "", false
		}
		return etag, true
	}
	m := md5.New() //nolint:gosec // see the import
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return "", false
	}
	if n, err := io.Copy(m, io.LimitReader(body, size)); err != nil || n != size {
		return "", false
	}
	if !strings.EqualFold(strings.Trim(etag, `"`), hex.EncodeToString(m.Sum(nil))) {
		return "", false
	}
	return etag, true
}

// What an S3 server does with If-Match on DeleteObject (objects.deletes).
const (
	deleteCondUnknown int32 = iota
	deleteCondHonoured
	deleteCondIgnored
)

// probeETag is an ETag no object has: a DeleteObject If-Match it that
// succeeds tells a server that ignores the condition.
const probeETag = `"bulkhead-probe-matches-no-object"`

// RemoveChecksVersion says that Remove does its own version check: Sync
// sends no HEAD before it.
func (o *objects) RemoveChecksVersion() bool { return true }

// Remove deletes the object at key only if its ETag is still version.
//
// S3 (since 2025) and Versity Gateway honour If-Match on DeleteObject,
// which closes the race of a check followed by a delete: a replaced object
// answers 412 and is kept. Not every S3-compatible server does, and one
// that ignores the header deletes whatever is there. So the first delete
// of a store learns which kind of server it talks to, safely: it HEADs the
// object (a changed one is a conflict, as before), then sends a delete
// If-Match an ETag no object has (probeETag). A 412 means the condition
// is honoured: the real delete goes out If-Match the ETag, and later
// deletes skip the HEAD. A success means the header was ignored (the
// object is gone, which was the intent, and the HEAD was the check); a
// NotImplemented means it is refused: later deletes keep the HEAD and
// delete unconditionally, leaving the narrow race between the two that
// such a server cannot close.
func (o *objects) Remove(ctx context.Context, key, version string) error {
	if version == "" {
		return o.deleteObject(ctx, key, "")
	}
	switch o.deletes.Load() {
	case deleteCondHonoured:
		return o.deleteObject(ctx, key, version)
	case deleteCondIgnored:
		if err := o.checkVersion(ctx, key, version); err != nil {
			return err
		}
		return o.deleteObject(ctx, key, "")
	}
	if err := o.checkVersion(ctx, key, version); err != nil {
		return err
	}
	err := o.deleteObject(ctx, key, probeETag)
	switch {
	case errors.Is(err, mount.ErrChanged):
		o.deletes.Store(deleteCondHonoured)
		return o.deleteObject(ctx, key, version)
	case err == nil:
		o.deletes.Store(deleteCondIgnored)
		return nil
	case s3errs.IsNotImplemented(err):
		o.deletes.Store(deleteCondIgnored)
		return o.deleteObject(ctx, key, "")
	}
	return err
}

// checkVersion HEADs an object: mount.ErrGone if there is none, mount.ErrChanged if
// its ETag is not version.
func (o *objects) checkVersion(ctx context.Context, key, version string) error {
	cur, err := o.Head(ctx, key)
	if err != nil {
		return err
	}
	if cur != version {
		return fmt.Errorf("%w: ETag %s, downloaded at %s", mount.ErrChanged, cur, version)
	}
	return nil
}

// deleteObject deletes key, If-Match ifMatch when it is not "". A failed
// condition is mount.ErrChanged; a missing object, mount.ErrGone.
func (o *objects) deleteObject(ctx context.Context, key, ifMatch string) error {
	in := &s3.DeleteObjectInput{Bucket: &o.bucket, Key: aws.String(key)}
	if ifMatch != "" {
		in.IfMatch = aws.String(ifMatch)
	}
	if _, err := o.client.DeleteObject(ctx, in); err != nil {
		switch {
		case s3errs.IsPreconditionFailed(err):
			return fmt.Errorf("%w: %w", mount.ErrChanged, err)
		case s3errs.IsNotFound(err):
			return fmt.Errorf("%w: %w", mount.ErrGone, err)
		}
		return err
	}
	return nil
}

// Inspect reads an error of the AWS SDK (internal/s3errs).
func (o *objects) Inspect(err error) mount.ErrorInfo {
	code, status := s3errs.Code(err)
	return mount.ErrorInfo{Code: code, Status: status, NoBucket: code == "NoSuchBucket", NotFound: s3errs.IsNotFound(err),
		Unauthenticated: s3errs.IsAuthCode(code), PermissionDenied: code == "AccessDenied", Unavailable: s3errs.IsUnavailable(err)}
}
