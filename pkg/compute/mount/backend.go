package mount

import (
	"context"
	"errors"
	"io"
)

// backend is one kind of object storage as a mount sees it: a flat key
// space under a bucket, each object with an opaque version (an S3 ETag, a
// GCS generation) that changes whenever the object is replaced.
//
// Methods return errGone and errChanged (possibly wrapped) for the two
// outcomes the callers act on; any other error is the backend's own, read
// by errCode and worded by bucketStore.classify.
type backend interface {
	// list calls fn for every object whose key starts with prefix, a
	// page of at most pageSize keys per request.
	list(ctx context.Context, prefix string, pageSize int32, fn func(key, version string, size int64) error) error
	// get opens the object at key as it was at version. size is the
	// length the server announced, -1 when it did not. An object replaced
	// or removed since is errChanged.
	get(ctx context.Context, key, version string) (body io.ReadCloser, size int64, err error)
	// head returns the current version of the object at key; errGone if
	// there is none.
	head(ctx context.Context, key string) (string, error)
	// put uploads size bytes of body (sha256 is their hex digest) to
	// key, only if the object is still at ifVersion, or, when ifVersion
	// is "", only if there is no object at key. A failed condition is
	// errChanged. It returns the new version. body may be read more than
	// once (it is rewound before each attempt).
	put(ctx context.Context, key string, body io.ReadSeeker, size int64, sha256 string, ifVersion string) (string, error)
	// remove deletes the object at key if it is still at version: one
	// replaced since is errChanged, one gone already is errGone.
	remove(ctx context.Context, key, version string) error
	// errCode reads a backend error: the storage's error code (S3 style;
	// "NoSuchBucket" for a missing bucket) and HTTP status, if any.
	errCode(err error) (code string, status int)
}

var (
	// errGone: there is no object at the key.
	errGone = errors.New("no such object")
	// errChanged: the object is not at the version expected.
	errChanged = errors.New("object changed")
)
