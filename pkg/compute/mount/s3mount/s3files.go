package s3mount

// s3_files_mount through its backing bucket.
//
// An Amazon S3 Files file system keeps its data in an S3 bucket: the
// files of the file system are objects under a prefix of that bucket. An
// NFS mount inside the sandbox would need network access to a mount
// target and mount privileges that a sandbox deliberately lacks, so this
// strategy reads (and, for a writable mount, writes back) the backing
// bucket through the S3 API from the harness, like s3_mount: the daemon
// only receives bytes, and no credential enters the sandbox.
//
// Which bucket backs a file system is configuration
// (Config.FileSystems), not a lookup: asking AWS's control plane
// (describing the file system) cannot be tested without AWS, and a
// harness usually knows its file systems. An unknown file_system_id is
// refused before anything is written.
//
// The manifest's NFS-only fields: mount_target_ip (which mount target to
// reach) is ignored, as no NFS connection is made. access_point confines
// an NFS client to a directory of the file system; it is honoured only
// when the configuration says which directory that is
// (FileSystem.AccessPoints), and refused otherwise (ignoring it would
// widen the mount). extra_options are NFS mount options: "ro" or "rw"
// contradicting read_only is refused, others are ignored (logged).
//
// Changes made through NFS by other clients show in the bucket after the
// file system exports them, and objects written to the bucket show in the
// file system after it imports them: a copy made here sees the bucket, so
// it may lag behind NFS clients by that export delay.

import (
	"context"
	"path"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// FileSystem is where an S3 Files file system keeps its data, for
// s3_files_mount entries naming it.
type FileSystem struct {
	// Bucket is the backing bucket (required).
	Bucket string
	// Prefix is the key prefix of the file system's root in the bucket;
	// "" means the bucket's root.
	Prefix string
	// Region signs the requests; "" means the entry's region.
	Region string
	// Endpoint is an S3-compatible endpoint; "" means AWS's.
	Endpoint string
	// Credentials name the secrets signing the requests (the keys of an
	// s3_mount: access_key_id, secret_access_key, session_token),
	// resolved through mount.Config.Secrets; none means
	// Config.DefaultCredentials.
	Credentials map[string]manifest.SecretRef
	// AccessPoints maps the file system's access points (fsap-...) to
	// their root directories ("/team/a"); an entry naming an access point
	// not listed here is refused.
	AccessPoints map[string]string
}

// openFiles opens the storage of an s3_files_mount entry: an s3_mount
// on the backing bucket, at the configured prefix joined with the access
// point's root directory and the entry's subpath.
func (b *Backend) openFiles(ctx context.Context, req *mount.Request) (*mount.Storage, error) {
	p, mt := req.Path, req.Entry.Mount
	fs, ok := b.cfg.FileSystems[mt.FileSystemID]
	if !ok {
		return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: the harness does not know where S3 Files file system %s keeps its data (s3mount.Config.FileSystems); nothing was written", p, mt.FileSystemID)
	}
	if fs.Bucket == "" {
		return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: the configuration of S3 Files file system %s names no bucket", p, mt.FileSystemID)
	}
	dir := "/"
	if mt.AccessPoint != "" {
		root, ok := fs.AccessPoints[mt.AccessPoint]
		if !ok {
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "mount %s: access point %s of file system %s is not configured (FileSystem.AccessPoints): without its root directory the mount would show more of the file system than the access point does; nothing was written", p, mt.AccessPoint, mt.FileSystemID)
		}
		dir = path.Join("/", root)
	}
	dir = path.Join(dir, mt.Subpath)
	for _, o := range mt.ExtraOptions {
		name, _, _ := strings.Cut(o, "=")
		switch {
		case name == "ro" && !mt.IsReadOnly(), name == "rw" && mt.IsReadOnly():
			return nil, errkind.Errorf(errkind.ErrInvalidArgument, "mount %s: extra option %q contradicts read_only; set read_only instead (extra_options are NFS mount options, which this bucket-backed mount does not use)", p, o)
		}
	}
	if len(mt.ExtraOptions) > 0 || mt.MountTargetIP != "" {
		req.Log.Info("mount: NFS-only settings of an s3_files_mount ignored (it is read through its backing bucket)", zap.String("mount", p),
			zap.Strings("extra_options", mt.ExtraOptions), zap.Bool("mount_target_ip", mt.MountTargetIP != ""))
	}
	region := fs.Region
	if region == "" {
		region = mt.Region
	}
	// An s3_mount of the backing bucket, signed with the file system's
	// configured credentials.
	objs, err := b.bucketObjects(ctx, req, fs.Bucket, region, fs.Endpoint, fs.Credentials)
	if err != nil {
		return nil, err
	}
	prefix := mount.KeyPrefix(path.Join(strings.Trim(fs.Prefix, "/"), strings.TrimPrefix(dir, "/")))
	desc := "s3files://" + mt.FileSystemID + dir + " (s3://" + fs.Bucket + "/" + prefix
	if fs.Endpoint != "" {
		desc += " at " + fs.Endpoint
	}
	desc += ")"
	return &mount.Storage{Objects: objs, Bucket: fs.Bucket, Prefix: prefix, Description: desc}, nil
}
