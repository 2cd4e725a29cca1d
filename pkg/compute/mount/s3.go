package mount

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
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// s3Backend is an S3 (or S3-compatible: R2, MinIO, Versity) bucket
// through aws-sdk-go-v2. Versions are ETags.
type s3Backend struct {
	client *s3.Client
	bucket string
	// deletes is what the server does with a conditional delete
	// (deleteCond*), learnt at the first delete: see remove.
	deletes atomic.Int32
}

var _ backend = (*s3Backend)(nil)

// s3MaxBackoff bounds the wait between two tries of an S3 request.
const s3MaxBackoff = 5 * time.Second

// s3Store builds the store of an s3_mount or r2_mount entry. The endpoint
// is the manifest's, or for R2 the account's
// (https://ACCOUNT.r2.cloudflarestorage.com).
//
// The client is built as the snapshot store's is (internal/s3client), with
// path-style addressing for any explicit endpoint and the SDK's backoff up
// to s3MaxBackoff between tries.
func (m *Mounter) s3Store(ctx context.Context, p string, e *manifest.Entry, st *bucketStore) error {
	mt := e.Mount
	region, endpoint := mt.Region, mt.Endpoint
	scheme := "s3"
	if e.Type == manifest.TypeR2Mount {
		scheme, region = "r2", m.cfg.R2Region
		if region == "" {
			region = "auto"
		}
		if endpoint == "" {
			endpoint = "https://" + mt.Account + ".r2.cloudflarestorage.com"
		}
	}
	st.describe(scheme, mt.Endpoint)
	creds, err := m.s3Credentials(ctx, p, e, st)
	if err != nil {
		return err
	}
	client := s3client.New(s3client.Options{
		Region:       region, // "" means s3client.DefaultRegion
		Endpoint:     endpoint,
		UsePathStyle: endpoint != "",
		Credentials:  creds,
		MaxAttempts:  m.cfg.MaxAttempts,
		MaxBackoff:   s3MaxBackoff,
		HTTPClient:   m.cfg.HTTPClient,
	})
	st.be = &s3Backend{client: client, bucket: mt.Bucket}
	return nil
}

// s3Credentials returns the provider signing a mount's requests and
// records the values to redact.
func (m *Mounter) s3Credentials(ctx context.Context, p string, e *manifest.Entry, st *bucketStore) (aws.CredentialsProvider, error) {
	if len(e.Mount.Credentials) == 0 {
		if m.cfg.DefaultCredentials == nil {
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s names no credentials and the harness has no default mount credentials (mount.Config.DefaultCredentials)", p)
		}
		return m.cfg.DefaultCredentials, nil
	}
	vals, err := m.resolveCredentials(ctx, p, e, st)
	if err != nil {
		return nil, err
	}
	id, secret := vals["access_key_id"], vals["secret_access_key"]
	if id == "" || secret == "" {
		return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: credentials need both access_key_id and secret_access_key", p)
	}
	return credentials.NewStaticCredentialsProvider(id, secret, vals["session_token"]), nil
}

func (b *s3Backend) list(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error {
	p := s3.NewListObjectsV2Paginator(b.client, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: aws.String(prefix), MaxKeys: aws.Int32(pageSize)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range page.Contents {
			if err := fn(aws.ToString(o.Key), aws.ToString(o.ETag), aws.ToInt64(o.Size)); err != nil {
				return err
			}
		}
	}
	return nil
}

// get is If-Match the ETag, so that an object replaced since the listing
// is a conflict rather than bytes of another size.
func (b *s3Backend) get(ctx context.Context, key, version string) (io.ReadCloser, int64, error) {
	in := &s3.GetObjectInput{Bucket: &b.bucket, Key: aws.String(key)}
	if version != "" {
		in.IfMatch = aws.String(version)
	}
	out, err := b.client.GetObject(ctx, in)
	if err != nil {
		if s3errs.IsPreconditionFailed(err) || s3errs.IsNotFound(err) {
			return nil, 0, fmt.Errorf("%w: %w", errChanged, err)
		}
		return nil, 0, err
	}
	size := int64(-1)
	if out.ContentLength != nil {
		size = *out.ContentLength
	}
	return out.Body, size, nil
}

func (b *s3Backend) head(ctx context.Context, key string) (string, error) {
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: aws.String(key)})
	if err != nil {
		if s3errs.IsNotFound(err) {
			return "", fmt.Errorf("%w: %w", errGone, err)
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// put is If-Match the ETag (If-None-Match for a new key); a server that
// does not implement conditional writes gets a plain PUT, the caller's
// HEAD having been the check. The upload carries the bytes' SHA-256,
// which the server checks and keeps. A failed condition whose object
// holds these very bytes is a retried upload whose first answer was lost
// (the first try landed, so the retry's condition no longer holds), not
// a conflict: see ownUpload.
//
// One PutObject, never a multipart upload.
func (b *s3Backend) put(ctx context.Context, key string, body io.ReadSeeker, size int64, sum string, ifVersion string) (string, error) {
	raw, _ := hex.DecodeString(sum)
	in := &s3.PutObjectInput{Bucket: &b.bucket, Key: aws.String(key), Body: body, ContentLength: aws.Int64(size),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256, ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(raw))}
	if ifVersion != "" {
		in.IfMatch = aws.String(ifVersion)
	} else {
		in.IfNoneMatch = aws.String("*")
	}
	out, err := b.client.PutObject(ctx, in)
	if err != nil && s3errs.IsNotImplemented(err) {
		in.IfMatch, in.IfNoneMatch = nil, nil
		if _, serr := body.Seek(0, io.SeekStart); serr != nil {
			return "", serr
		}
		out, err = b.client.PutObject(ctx, in)
	}
	if err != nil {
		if s3errs.IsPreconditionFailed(err) {
			if etag, ok := b.ownUpload(ctx, key, body, size, raw); ok {
				return etag, nil
			}
			return "", fmt.Errorf("%w: %w", errChanged, err)
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
// whole object (the one put sent: AWS S3 and Versity Gateway keep it and
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
func (b *s3Backend) ownUpload(ctx context.Context, key string, body io.ReadSeeker, size int64, sha []byte) (string, bool) {
	h, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: aws.String(key), ChecksumMode: types.ChecksumModeEnabled})
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

// What an S3 server does with If-Match on DeleteObject (s3Backend.deletes).
const (
	deleteCondUnknown int32 = iota
	deleteCondHonoured
	deleteCondIgnored
)

// probeETag is an ETag no object has: a DeleteObject If-Match it that
// succeeds tells a server that ignores the condition.
const probeETag = `"bulkhead-probe-matches-no-object"`

// checksOwnDeletes marks remove as doing its own version check: Sync
// sends no HEAD before it.
func (b *s3Backend) checksOwnDeletes() {}

// remove deletes the object at key only if its ETag is still version.
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
func (b *s3Backend) remove(ctx context.Context, key, version string) error {
	if version == "" {
		return b.deleteObject(ctx, key, "")
	}
	switch b.deletes.Load() {
	case deleteCondHonoured:
		return b.deleteObject(ctx, key, version)
	case deleteCondIgnored:
		if err := b.checkVersion(ctx, key, version); err != nil {
			return err
		}
		return b.deleteObject(ctx, key, "")
	}
	if err := b.checkVersion(ctx, key, version); err != nil {
		return err
	}
	err := b.deleteObject(ctx, key, probeETag)
	switch {
	case errors.Is(err, errChanged):
		b.deletes.Store(deleteCondHonoured)
		return b.deleteObject(ctx, key, version)
	case err == nil:
		b.deletes.Store(deleteCondIgnored)
		return nil
	case s3errs.IsNotImplemented(err):
		b.deletes.Store(deleteCondIgnored)
		return b.deleteObject(ctx, key, "")
	}
	return err
}

// checkVersion HEADs an object: errGone if there is none, errChanged if
// its ETag is not version.
func (b *s3Backend) checkVersion(ctx context.Context, key, version string) error {
	cur, err := b.head(ctx, key)
	if err != nil {
		return err
	}
	if cur != version {
		return fmt.Errorf("%w: ETag %s, downloaded at %s", errChanged, cur, version)
	}
	return nil
}

// deleteObject deletes key, If-Match ifMatch when it is not "". A failed
// condition is errChanged; a missing object, errGone.
func (b *s3Backend) deleteObject(ctx context.Context, key, ifMatch string) error {
	in := &s3.DeleteObjectInput{Bucket: &b.bucket, Key: aws.String(key)}
	if ifMatch != "" {
		in.IfMatch = aws.String(ifMatch)
	}
	if _, err := b.client.DeleteObject(ctx, in); err != nil {
		switch {
		case s3errs.IsPreconditionFailed(err):
			return fmt.Errorf("%w: %w", errChanged, err)
		case s3errs.IsNotFound(err):
			return fmt.Errorf("%w: %w", errGone, err)
		}
		return err
	}
	return nil
}

func (b *s3Backend) errCode(err error) (string, int) { return s3errs.Code(err) }

// trimSlash is the key prefix of a mount: "" or ending in "/".
func trimSlash(prefix string) string {
	if pre := strings.Trim(prefix, "/"); pre != "" {
		return pre + "/"
	}
	return ""
}
