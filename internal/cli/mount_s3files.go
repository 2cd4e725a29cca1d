package cli

import (
	"net/url"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/s3mount"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// s3FileSystemUsage documents --s3-file-system.
const s3FileSystemUsage = "where an S3 Files file system keeps its data, for s3_files_mount entries (read through that bucket, no NFS): " +
	"FS_ID=s3://BUCKET[/PREFIX][?region=R&endpoint=URL&access_key_id=VAR&secret_access_key=VAR&session_token=VAR&access_point=fsap-ID:/DIR] " +
	"(credentials name environment variables of the harness; access_point gives an access point's root directory; repeatable)"

// parseS3FileSystems reads the --s3-file-system values into
// s3mount.Config.FileSystems.
func parseS3FileSystems(specs []string) (map[string]s3mount.FileSystem, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := make(map[string]s3mount.FileSystem, len(specs))
	for _, spec := range specs {
		id, loc, ok := strings.Cut(spec, "=")
		if !ok || !strings.HasPrefix(id, "fs-") {
			return nil, usageErr(compute.ErrInvalidArgument, "--s3-file-system %q: want FS_ID=s3://BUCKET[/PREFIX][?options]", spec)
		}
		if _, dup := out[id]; dup {
			return nil, usageErr(compute.ErrInvalidArgument, "--s3-file-system: %s given twice", id)
		}
		u, err := url.Parse(loc)
		if err != nil || u.Scheme != "s3" || u.Host == "" || u.User != nil || u.Fragment != "" {
			return nil, usageErr(compute.ErrInvalidArgument, "--s3-file-system %s: %q is not s3://BUCKET[/PREFIX][?options]", id, loc)
		}
		fs := s3mount.FileSystem{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
		for k, vs := range u.Query() {
			if k == "access_point" { // repeatable: one per access point
				for _, v := range vs {
					ap, dir, ok := strings.Cut(v, ":")
					if !ok || !strings.HasPrefix(ap, "fsap-") || !strings.HasPrefix(dir, "/") {
						return nil, usageErr(compute.ErrInvalidArgument, "--s3-file-system %s: access_point %q: want fsap-ID:/DIR", id, v)
					}
					if fs.AccessPoints == nil {
						fs.AccessPoints = map[string]string{}
					}
					fs.AccessPoints[ap] = dir
				}
				continue
			}
			if len(vs) != 1 || vs[0] == "" {
				return nil, usageErr(compute.ErrInvalidArgument, "--s3-file-system %s: option %s needs one value", id, k)
			}
			v := vs[0]
			switch k {
			case "region":
				fs.Region = v
			case "endpoint":
				fs.Endpoint = v
			case "access_key_id", "secret_access_key", "session_token":
				if fs.Credentials == nil {
					fs.Credentials = map[string]manifest.SecretRef{}
				}
				fs.Credentials[k] = manifest.Secret(v)
			default:
				return nil, usageErr(compute.ErrInvalidArgument, "--s3-file-system %s: unknown option %s (region, endpoint, access_key_id, secret_access_key, session_token, access_point)", id, k)
			}
		}
		out[id] = fs
	}
	return out, nil
}
