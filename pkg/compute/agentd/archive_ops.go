package agentd

import (
	"context"
	"io"
	"strconv"

	"github.com/bulkhead-dev/bulkhead/pkg/archive"
)

// Archive streams the workspace root as an archive to w. It waits for a
// restore in progress (or rolling back) to finish, so an archive never
// captures a half-swapped workspace.
func (d *Daemon) Archive(ctx context.Context, w io.Writer, opts archive.WriteOptions) (archive.Stats, error) {
	d.restoreMu.RLock()
	defer d.restoreMu.RUnlock()
	opts.UserName = d.userName
	opts.GroupName = d.users.GroupName
	if opts.Logger == nil {
		opts.Logger = d.log
	}
	return archive.Write(ctx, d.cfg.WorkspaceRoot, w, opts)
}

// Restore replaces the workspace's contents with the archive read from r,
// all at once or not at all. Restores run one at a time: a client that gave
// up on one (its stream ended) and starts another waits until the first has
// rolled back.
func (d *Daemon) Restore(ctx context.Context, r io.Reader, opts archive.RestoreOptions) (archive.Stats, error) {
	d.restoreMu.Lock()
	defer d.restoreMu.Unlock()
	if opts.Logger == nil {
		opts.Logger = d.log
	}
	return archive.Restore(ctx, d.cfg.WorkspaceRoot, r, opts)
}

// Fingerprint hashes the workspace's content and metadata.
func (d *Daemon) Fingerprint(ctx context.Context, opts archive.FingerprintOptions) (string, error) {
	d.restoreMu.RLock()
	defer d.restoreMu.RUnlock()
	return archive.Fingerprint(ctx, d.cfg.WorkspaceRoot, opts)
}

// userName names a uid from the sandbox's /etc/passwd ("" when unknown).
func (d *Daemon) userName(uid uint32) string {
	u, err := d.users.Lookup(strconv.FormatUint(uint64(uid), 10))
	if err != nil || u.UID != uid {
		return ""
	}
	return u.Name
}
