// Package s3mount is the mount.Backend of s3_mount, r2_mount and
// s3_files_mount entries: S3 and S3-compatible buckets (R2, MinIO, Versity
// Gateway) through aws-sdk-go-v2, and S3 Files file systems through the
// bucket that backs each (Config.FileSystems), with no NFS mount in the
// sandbox. It is a package of its own so that a program mounting no S3
// bucket links no AWS code.
//
//	m, err := mount.New(mount.Config{Secrets: mount.EnvSecrets(),
//		Backends: []mount.Backend{s3mount.New(s3mount.Config{})}})
package s3mount
