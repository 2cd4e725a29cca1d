package azuremount

import (
	"bytes"
	"context"
	"crypto/md5" //nolint:gosec // the Blob service's integrity check of an upload, not a security measure
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/storeerr"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// MaxPutBlobBytes is the largest file a writable azure_blob_mount
// uploads: one Put Blob request (the service's limit for a single Put
// Blob, 5000 MiB). A larger file is an error naming it, never a partial
// upload.
const MaxPutBlobBytes = 5000 << 20

// Config configures the Azure Blob backend.
type Config struct {
	// Credential authorizes the requests of azure_blob_mount entries that
	// name no credentials (an Entra ID identity of the harness, for
	// example azidentity's managed identity or workload identity); nil
	// refuses such mounts.
	Credential azcore.TokenCredential
}

// Backend is the mount.Backend of azure_blob_mount entries. It is safe
// for concurrent use.
type Backend struct {
	cfg Config
}

var _ mount.Backend = (*Backend)(nil)

// New returns the backend.
func New(cfg Config) *Backend { return &Backend{cfg: cfg} }

// Types returns azure_blob_mount.
func (b *Backend) Types() []manifest.EntryType {
	return []manifest.EntryType{manifest.TypeAzureBlobMount}
}

// objects is an Azure Blob Storage container.
type objects struct {
	cc *container.Client
}

var _ mount.Objects = (*objects)(nil)

// Open returns the storage of an azure_blob_mount entry. The container
// is at ENDPOINT/CONTAINER, where ENDPOINT is the manifest's (an emulator
// or sovereign cloud, path-style: http://host:port/ACCOUNT) or
// https://ACCOUNT.blob.core.windows.net.
//
// Credentials (see manifest.CredentialKeys): account_key, the storage
// account's base64 key, signed with Shared Key; or sas_token, a shared
// access signature ("sv=...&sig=...", with or without "?") appended to
// every request. A mount naming none uses Config.Credential (an Entra ID
// identity of the harness: the manifest has no field to choose one, so
// the harness does).
func (b *Backend) Open(ctx context.Context, req *mount.Request) (*mount.Storage, error) {
	p, mt := req.Path, req.Entry.Mount
	endpoint := strings.TrimRight(mt.Endpoint, "/")
	if endpoint == "" {
		endpoint = "https://" + mt.Account + ".blob.core.windows.net"
	}
	prefix := mount.KeyPrefix(mt.Prefix)
	desc := "azblob://" + mt.Account + "/" + mt.Container + "/" + prefix
	if mt.Endpoint != "" {
		desc += " at " + mt.Endpoint
	}
	u := endpoint + "/" + mt.Container
	hc := req.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	opts := &container.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport: hc,
		Retry: policy.RetryOptions{
			MaxRetries:    int32(req.MaxAttempts - 1),
			RetryDelay:    100 * time.Millisecond,
			MaxRetryDelay: 5 * time.Second,
		},
		Telemetry: policy.TelemetryOptions{Disabled: true},
	}}
	if opts.Retry.MaxRetries == 0 {
		opts.Retry.MaxRetries = -1 // the SDK reads 0 as its default (3)
	}
	var (
		cc  *container.Client
		err error
	)
	if len(mt.Credentials) == 0 {
		if b.cfg.Credential == nil {
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s names no credentials and the harness has no default Azure credential (azuremount.Config.Credential)", p)
		}
		cc, err = container.NewClient(u, b.cfg.Credential, opts)
	} else {
		vals, rerr := req.Credentials(ctx, mt.Credentials)
		if rerr != nil {
			return nil, rerr
		}
		switch key, sas := vals["account_key"], strings.TrimPrefix(vals["sas_token"], "?"); {
		case key != "" && sas != "":
			return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount %s: credentials name both account_key and sas_token; name one", p)
		case key != "":
			cred, kerr := container.NewSharedKeyCredential(mt.Account, key)
			if kerr != nil {
				// The SDK's text may quote the key: never pass it on.
				return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount %s: credential account_key (%s) is not a base64 storage account key", p, mt.Credentials["account_key"].String())
			}
			cc, err = container.NewClientWithSharedKeyCredential(u, cred, opts)
		case sas != "":
			cc, err = container.NewClientWithNoCredential(u+"?"+sas, opts)
		default:
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: credentials need an account_key or a sas_token", p)
		}
	}
	if err != nil {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount %s: Azure client for %s: %s", p, desc, req.Redacted(err.Error()))
	}
	return &mount.Storage{Objects: &objects{cc: cc}, Bucket: mt.Container, Prefix: prefix, Description: desc}, nil
}

// azureError is an error answer of the Blob service, worded short (the
// SDK's own text spans lines and repeats the answer's body).
type azureError struct {
	status int
	code   string
	cause  error
}

func (e *azureError) Error() string {
	s := fmt.Sprintf("HTTP %d", e.status)
	if e.code != "" {
		s += " " + e.code
	}
	return s
}

func (e *azureError) Unwrap() error { return e.cause }

// azureErr wraps an SDK error: an answer of the service becomes an
// *azureError; anything else (a broken connection, a canceled context) is
// returned as is.
func azureErr(err error) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return &azureError{status: re.StatusCode, code: re.ErrorCode, cause: err}
	}
	return err
}

// Inspect reads the Blob service's codes: a missing container is
// NoBucket (its code shown as "NoSuchBucket"); a refused signature or
// token (the service answers 403 AuthenticationFailed) counts as a 401;
// a refused permission is PermissionDenied (shown as "AccessDenied"). A
// broken connection is Unavailable.
func (b *objects) Inspect(err error) mount.ErrorInfo {
	var ae *azureError
	if !errors.As(err, &ae) {
		return mount.ErrorInfo{Unavailable: storeerr.Transient(err)}
	}
	in := mount.ErrorInfo{Code: ae.code, Status: ae.status, Unavailable: storeerr.Transient(err)}
	switch bloberror.Code(ae.code) {
	case bloberror.ContainerNotFound:
		in.Code, in.NoBucket = "NoSuchBucket", true
	case bloberror.AuthenticationFailed, bloberror.InvalidAuthenticationInfo, bloberror.NoAuthenticationInformation:
		in.Status = http.StatusUnauthorized
	case bloberror.AuthorizationFailure, bloberror.AuthorizationPermissionMismatch, bloberror.InsufficientAccountPermissions:
		in.Code, in.PermissionDenied = "AccessDenied", true
	}
	return in
}

// quoteETag and unquoteETag: the listing gives ETags bare (0x8D...), the
// headers quoted ("0x8D..."). Versions are kept bare so that they compare
// equal whichever answer they came from, and sent quoted.
func quoteETag(v string) *azcore.ETag {
	e := azcore.ETag(`"` + unquoteETag(v) + `"`)
	return &e
}

func unquoteETag(v string) string { return strings.Trim(v, `"`) }

func etagOf(e *azcore.ETag) string {
	if e == nil {
		return ""
	}
	return unquoteETag(string(*e))
}

// List pages through the blobs under prefix.
func (b *objects) List(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error {
	opts := &container.ListBlobsFlatOptions{MaxResults: &pageSize}
	if prefix != "" {
		opts.Prefix = &prefix
	}
	pager := b.cc.NewListBlobsFlatPager(opts)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return azureErr(err)
		}
		if page.Segment == nil {
			continue
		}
		for _, it := range page.Segment.BlobItems {
			if it == nil || it.Name == nil || it.Properties == nil {
				continue
			}
			size := int64(0)
			if it.Properties.ContentLength != nil {
				size = *it.Properties.ContentLength
			}
			if err := fn(*it.Name, etagOf(it.Properties.ETag), size); err != nil {
				return err
			}
		}
	}
	return nil
}

// Get is If-Match the listed ETag: a blob replaced (412) or removed (404)
// since the listing is mount.ErrChanged.
func (b *objects) Get(ctx context.Context, key, version string) (io.ReadCloser, int64, error) {
	opts := &blob.DownloadStreamOptions{}
	if version != "" {
		opts.AccessConditions = &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: quoteETag(version)}}
	}
	resp, err := b.cc.NewBlobClient(key).DownloadStream(ctx, opts)
	if err != nil {
		err = azureErr(err)
		if st := statusOf(err); st == http.StatusPreconditionFailed || st == http.StatusNotFound && !bloberror.HasCode(err, bloberror.ContainerNotFound) {
			return nil, 0, fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return nil, 0, err
	}
	size := int64(-1)
	if resp.ContentLength != nil {
		size = *resp.ContentLength
	}
	return resp.Body, size, nil
}

// statusOf is the HTTP status of an answer of the service, or 0.
func statusOf(err error) int {
	var ae *azureError
	if errors.As(err, &ae) {
		return ae.status
	}
	return 0
}

// Head returns the blob's current ETag.
func (b *objects) Head(ctx context.Context, key string) (string, error) {
	props, err := b.cc.NewBlobClient(key).GetProperties(ctx, nil)
	if err != nil {
		err = azureErr(err)
		if statusOf(err) == http.StatusNotFound && !bloberror.HasCode(err, bloberror.ContainerNotFound) {
			return "", fmt.Errorf("%w: %w", mount.ErrGone, err)
		}
		return "", err
	}
	v := etagOf(props.ETag)
	if v == "" {
		return "", fmt.Errorf("blob %s: no ETag in the answer", key)
	}
	return v, nil
}

// Put is one Put Blob carrying the bytes' MD5 (which the service checks,
// and keeps as the blob's Content-MD5), If-Match the ETag downloaded, or
// If-None-Match * for a new blob. A failed condition whose blob holds
// these very bytes is a retried upload whose first answer was lost, not a
// conflict.
func (b *objects) Put(ctx context.Context, key string, body io.ReadSeeker, size int64, _ string, ifVersion string) (string, error) {
	if size > MaxPutBlobBytes {
		return "", errkind.Errorf(errkind.ErrResourceExhausted, "%d bytes is more than one Put Blob takes (%d); not uploaded", size, int64(MaxPutBlobBytes))
	}
	h := md5.New() //nolint:gosec // see the import
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := io.Copy(h, io.LimitReader(body, size)); err != nil {
		return "", fmt.Errorf("hash the upload: %w", err)
	}
	sum := h.Sum(nil)
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	cond := &blob.ModifiedAccessConditions{}
	if ifVersion != "" {
		cond.IfMatch = quoteETag(ifVersion)
	} else {
		anyETag := azcore.ETagAny
		cond.IfNoneMatch = &anyETag
	}
	bc := b.cc.NewBlockBlobClient(key)
	resp, err := bc.Upload(ctx, streaming.NopCloser(body), &blockblob.UploadOptions{
		HTTPHeaders:             &blob.HTTPHeaders{BlobContentMD5: sum},
		TransactionalValidation: blob.TransferValidationTypeMD5(sum),
		AccessConditions:        &blob.AccessConditions{ModifiedAccessConditions: cond},
	})
	if err != nil {
		err = azureErr(err)
		if st := statusOf(err); st == http.StatusPreconditionFailed || st == http.StatusConflict && bloberror.HasCode(err, bloberror.BlobAlreadyExists) {
			props, perr := bc.GetProperties(ctx, nil)
			if perr == nil && bytes.Equal(props.ContentMD5, sum) && etagOf(props.ETag) != "" {
				return etagOf(props.ETag), nil
			}
			return "", fmt.Errorf("%w: %w", mount.ErrChanged, err)
		}
		return "", err
	}
	v := etagOf(resp.ETag)
	if v == "" {
		return "", fmt.Errorf("upload %s: no ETag in the answer", key)
	}
	return v, nil
}

// Remove is a Delete Blob If-Match the ETag downloaded (and its snapshots
// with it): a blob replaced since is mount.ErrChanged, one gone already mount.ErrGone.
func (b *objects) Remove(ctx context.Context, key, version string) error {
	include := blob.DeleteSnapshotsOptionTypeInclude
	opts := &blob.DeleteOptions{DeleteSnapshots: &include}
	if version != "" {
		opts.AccessConditions = &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: quoteETag(version)}}
	}
	if _, err := b.cc.NewBlobClient(key).Delete(ctx, opts); err != nil {
		err = azureErr(err)
		switch st := statusOf(err); {
		case st == http.StatusPreconditionFailed:
			return fmt.Errorf("%w: %w", mount.ErrChanged, err)
		case st == http.StatusNotFound && !bloberror.HasCode(err, bloberror.ContainerNotFound):
			return fmt.Errorf("%w: %w", mount.ErrGone, err)
		}
		return err
	}
	return nil
}
