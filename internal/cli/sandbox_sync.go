package cli

// `harness sandbox sync` uploads what changed in a sandbox's writable
// mounts, and the sync that `harness sandbox rm` does first.
//
// A writable mount (s3_mount, r2_mount, gcs_mount, ... without read_only)
// is a copy: the agent's changes reach the bucket only when the mount is
// synced. A session run by `harness run` is synced when it closes; a
// sandbox made by `harness sandbox create` keeps running between commands,
// so these commands sync it from whichever harness process runs them. That
// works because every client of the CLI keeps the mounts' baselines (what
// each object was when it was downloaded) in the state directory
// (<state>/mount-baselines, see mount.DirBaselines): the process that
// created the sandbox saved them, this one reads them.

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
)

// newSandboxSyncCmd returns `harness sandbox sync`.
func newSandboxSyncCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "sync ID",
		Short: "Upload the changed, new and deleted files of a sandbox's writable mounts to their buckets",
		Long: `Sync session ID's writable mounts: files the sandbox changed or created are uploaded, files it
deleted are deleted remotely, each only if the object is still the one that was downloaded. An object
changed remotely in the meantime is never overwritten (nor deleted): its path is reported as a
conflict, the remote copy is kept, and the command exits non-zero; the other files are still synced.
Read-only mounts are skipped. The sandbox keeps running. The credentials the mounts name are read
from this process's environment, as at create.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, err := loadState(cmd, g, args[0])
			if err != nil {
				return err
			}
			client, release, err := g.client(materializer.Options{})
			if err != nil {
				return err
			}
			defer release()
			s, err := attachRunning(ctx, client, st)
			if err != nil {
				return err
			}
			if s == nil {
				return usageErr(compute.ErrFailedPrecondition, "session %s: its sandbox is gone, and with it any change not synced; nothing to sync", st.SessionID)
			}
			defer func() { _ = s.Release() }()
			stats, err := g.mounter.Sync(ctx, s)
			printSyncStats(cmd.OutOrStdout(), st.SessionID, stats)
			if err != nil {
				return fmt.Errorf("sync session %s: %w", st.SessionID, err)
			}
			return nil
		},
	}
}

// attachRunning finds session st's sandbox through the provider and
// reattaches to it; nil when the provider has no such sandbox (then
// nothing is launched in its place, unlike Resume alone). Release the
// session afterwards.
func attachRunning(ctx context.Context, client *compute.Client, st *compute.State) (*compute.Session, error) {
	infos, err := client.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, info := range infos {
		if info.SessionID == st.SessionID {
			return client.Resume(ctx, st)
		}
	}
	return nil, nil
}

// printSyncStats reports a sync in one line.
func printSyncStats(w io.Writer, id string, stats mount.SyncStats) {
	fmt.Fprintf(w, "session %s: mounts synced: %d uploaded, %d deleted, %d unchanged, %d conflicts\n",
		id, stats.Uploaded, stats.Deleted, stats.Unchanged, len(stats.Conflicts))
	for _, p := range stats.Conflicts {
		fmt.Fprintf(w, "  conflict: %s changed remotely; the remote copy was kept\n", p)
	}
}

// syncBeforeRemove syncs the writable mounts of the session s before its
// sandbox is deleted. An error (a conflict, an unreachable bucket) stops
// the removal: deleting would lose the changes not uploaded.
func syncBeforeRemove(ctx context.Context, g *globals, w io.Writer, s *compute.Session) error {
	stats, err := g.mounter.Sync(ctx, s)
	if stats.Uploaded+stats.Deleted+len(stats.Conflicts) > 0 || err != nil {
		printSyncStats(w, s.ID(), stats)
	}
	if err != nil {
		return fmt.Errorf("session %s: its writable mounts could not all be synced, so the sandbox was kept "+
			"(resolve the conflicts and run `harness sandbox sync %s`, or remove it with --no-sync to discard the changes not uploaded): %w",
			s.ID(), s.ID(), err)
	}
	return nil
}

// forgetMounts deletes the saved mount baselines of a removed session.
func forgetMounts(ctx context.Context, g *globals, id string) {
	dir, err := g.dir("mount-baselines")
	if err == nil {
		err = mount.DirBaselines(dir).DeleteBaselines(ctx, id)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		g.logger().Warn("could not delete the saved mount baselines", zap.String("session", id), zap.Error(err))
	}
}
