package agentd

import (
	"context"
	"io"
	"strconv"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/archive"
)

// Archive streams the workspace root as an archive to w. It waits for a
// restore in progress (or rolling back) to finish, so an archive never
// captures a half-swapped workspace, and first completes a restore a crash
// interrupted; while that cannot be done it refuses with
// errkind.ErrFailedPrecondition naming the restore.
func (d *Daemon) Archive(ctx context.Context, w io.Writer, opts archive.WriteOptions) (archive.Stats, error) {
	if err := d.settleRestore(); err != nil {
		return archive.Stats{}, err
	}
	d.restoreMu.RLock()
	defer d.restoreMu.RUnlock()
	opts.UserName = d.userName
	opts.GroupName = d.users.GroupName
	if opts.Logger == nil {
		opts.Logger = d.log
	}
	// Write itself refuses should a restore have become incomplete since
	// (its rollback failed).
	return archive.Write(ctx, d.cfg.WorkspaceRoot, w, opts)
}

// Restore replaces the workspace's contents with the archive read from r,
// all at once or not at all. Restores run one at a time: a client that gave
// up on one (its stream ended) and starts another waits until the first has
// rolled back. A restore a crash interrupted is completed first (by
// archive.Restore); while it cannot be, Restore refuses with
// errkind.ErrFailedPrecondition.
func (d *Daemon) Restore(ctx context.Context, r io.Reader, opts archive.RestoreOptions) (archive.Stats, error) {
	d.restoreMu.Lock()
	defer d.restoreMu.Unlock()
	if opts.Logger == nil {
		opts.Logger = d.log
	}
	return archive.Restore(ctx, d.cfg.WorkspaceRoot, r, opts)
}

// Fingerprint hashes the workspace's content and metadata, after
// completing an interrupted restore as Archive does.
func (d *Daemon) Fingerprint(ctx context.Context, opts archive.FingerprintOptions) (string, error) {
	if err := d.settleRestore(); err != nil {
		return "", err
	}
	d.restoreMu.RLock()
	defer d.restoreMu.RUnlock()
	return archive.Fingerprint(ctx, d.cfg.WorkspaceRoot, opts)
}

// settleRestore completes (or undoes) a restore whose journal is still in
// the workspace's private area: one a crash interrupted and the start-up
// recovery could not complete, or one whose rollback failed. The check is
// one lookup; only a pending restore takes the exclusive lock.
func (d *Daemon) settleRestore() error {
	id, err := archive.Pending(d.cfg.WorkspaceRoot)
	if err != nil || id == "" {
		return err
	}
	d.restoreMu.Lock()
	defer d.restoreMu.Unlock()
	return d.recoverRestore()
}

// recoverRestore runs archive.Recover on the workspace; the caller holds
// restoreMu exclusively (or is New, before anything is served).
func (d *Daemon) recoverRestore() error {
	// Recover logs what it did with an interrupted restore.
	rec, err := archive.Recover(d.cfg.WorkspaceRoot, archive.RecoverOptions{Logger: d.log})
	if rec.Removed > 0 {
		d.log.Info("removed restore leftovers", zap.Int("count", rec.Removed))
	}
	return err
}

// userName names a uid from the sandbox's /etc/passwd ("" when unknown).
func (d *Daemon) userName(uid uint32) string {
	u, err := d.users.Lookup(strconv.FormatUint(uint64(uid), 10))
	if err != nil || u.UID != uid {
		return ""
	}
	return u.Name
}
