package cli

// The lifecycle subcommands of `harness sandbox`: create, snapshot, resume
// and rm.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/kubernetes"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// manifestFlags are --manifest and --base-dir.
type manifestFlags struct {
	manifest string
	baseDir  string
}

// add registers the flags on cmd.
func (f *manifestFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.manifest, "manifest", "m", "", "workspace manifest (YAML or JSON); host sources are read relative to its directory")
	cmd.Flags().StringVar(&f.baseDir, "base-dir", "", "trusted directory host sources are read from (default: the manifest's directory)")
}

// load returns the trusted manifest (nil without --manifest) and the
// absolute base directory of its host sources.
func (f *manifestFlags) load() (*manifest.Manifest, string, error) {
	var m *manifest.Manifest
	base := f.baseDir
	if f.manifest != "" {
		var err error
		if m, err = manifest.LoadTrustedFile(f.manifest); err != nil {
			return nil, "", err
		}
		if base == "" {
			base = filepath.Dir(f.manifest)
		}
	}
	if base != "" {
		abs, err := filepath.Abs(base)
		if err != nil {
			return nil, "", fmt.Errorf("--base-dir: %w", err)
		}
		base = abs
	}
	return m, base, nil
}

// newSandboxCreateCmd returns `harness sandbox create`.
func newSandboxCreateCmd(g *globals) *cobra.Command {
	var (
		mf        manifestFlags
		id        string
		ttl, idle time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create [--manifest m.yaml] [--id ID] [--ttl D] [--idle-timeout D]",
		Short: "Create a sandbox from a manifest, save its session state and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := compute.CreateOptions{SessionID: id, TTL: ttl, IdleTimeout: idle}
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverCreate(cmd, g, c, &mf, opts) })
			}
			if g.kube.pool != "" {
				if g.provider != "kubernetes" {
					return usageErr(compute.ErrInvalidArgument, "--pool: warm pools are kubernetes sandboxes' (--provider kubernetes), not %s", g.provider)
				}
				opts.ProviderOptions = &kubernetes.CreateOptions{Pool: g.kube.pool}
			}
			return sandboxCreate(cmd, g, &mf, opts)
		},
	}
	mf.add(cmd)
	cmd.Flags().StringVar(&id, "id", "", "session id (default: a random one)")
	g.addAllowDomainFlag(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "most the sandbox may live, e.g. 1h (default: unbounded)")
	cmd.Flags().DurationVar(&idle, "idle-timeout", 0, "most the sandbox may stay unused, e.g. 30m (default: unbounded)")
	cmd.Flags().StringVar(&g.kube.pool, "pool", "", poolUsage)
	return cmd
}

// sandboxCreate creates and starts a session. A sandbox that fails to
// start is deleted again, so a failed create leaves nothing behind.
func sandboxCreate(cmd *cobra.Command, g *globals, mf *manifestFlags, opts compute.CreateOptions) error {
	ctx := cmd.Context()
	if opts.TTL < 0 || opts.IdleTimeout < 0 {
		return usageErr(compute.ErrInvalidArgument, "--ttl and --idle-timeout must not be negative")
	}
	m, base, err := mf.load()
	if err != nil {
		return err
	}
	opts.Manifest = m
	if opts.SessionID != "" {
		p, err := statePath(g, opts.SessionID)
		if err != nil {
			return err
		}
		if _, err := os.Stat(p); err == nil {
			return usageErr(compute.ErrAlreadyExists, "session %s exists already (`harness sandbox rm %s` removes it)", opts.SessionID, opts.SessionID)
		}
	}
	g.announce = true // say which isolation the new sandbox gets
	client, release, err := g.client(materializer.Options{BaseDir: base})
	if err != nil {
		return err
	}
	defer release()
	s, err := client.Create(ctx, opts)
	if err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return errors.Join(err, deleteQuietly(ctx, client, s))
	}
	if err := saveSession(g, s); err != nil {
		return errors.Join(err, deleteQuietly(ctx, client, s))
	}
	if err := saveSettings(g, s.ID(), client.Provider()); err != nil {
		return errors.Join(err, removeState(g, s.ID()), deleteQuietly(ctx, client, s))
	}
	if err := s.Release(); err != nil {
		return fmt.Errorf("session %s: release: %w", s.ID(), err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), s.ID())
	return nil
}

// deleteQuietly deletes a sandbox after a failure, even when ctx was
// cancelled (that may be the failure).
func deleteQuietly(ctx context.Context, client *compute.Client, s *compute.Session) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := client.Delete(ctx, s); err != nil {
		return fmt.Errorf("and deleting the new sandbox failed: %w", err)
	}
	return nil
}

// newSandboxSnapshotCmd returns `harness sandbox snapshot`.
func newSandboxSnapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot ID",
		Short: "Persist the sandbox's workspace to the snapshot store and print the snapshot id (ls, rm, gc: manage the store)",
		Long: `Persist session ID's workspace to the snapshot store (--snapshot-store) and print the snapshot id.
The subcommands ls, rm and gc list, delete and garbage-collect the store's snapshots.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverSnapshot(cmd, c, args[0]) })
			}
			ctx := cmd.Context()
			r, err := reconnect(cmd, g, args[0], materializer.Options{})
			if err != nil {
				return err
			}
			defer r.release()
			r.noteRebuilt(cmd.ErrOrStderr())
			if err := r.sess.Stop(ctx); err != nil {
				return err
			}
			st, err := r.sess.State()
			if err != nil {
				return err
			}
			store, err := g.snapshots()
			if err != nil {
				return err
			}
			switch ok, err := store.Exists(ctx, st.SnapshotID); {
			case err != nil:
				return fmt.Errorf("snapshot of session %s: %w", st.SessionID, err)
			case !ok:
				return usageErr(compute.ErrFailedPrecondition, "snapshot of session %s: nothing was persisted to %s", st.SessionID, st.SnapshotID)
			}
			if _, err := saveState(g, st); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.SnapshotID)
			return nil
		},
	}
	addSnapshotSubcommands(g, cmd)
	return cmd
}

// newSandboxResumeCmd returns `harness sandbox resume`.
func newSandboxResumeCmd(g *globals) *cobra.Command {
	var (
		mf      manifestFlags
		discard bool
	)
	cmd := &cobra.Command{
		Use:   "resume ID [--manifest m.yaml] [--discard-memory]",
		Short: "Reattach to a session's sandbox, restore it when paused, or rebuild it from its snapshot when it is gone",
		Long: `Resume a session: reattach to its sandbox when it still runs, restore it with its memory and
processes when it was paused (` + "`harness sandbox pause`" + `), otherwise launch a replacement and restore
the workspace from the session's snapshot (or build it from the manifest when there is no
snapshot). --discard-memory rebuilds a paused sandbox from its workspace instead of restoring it
(when a restore fails; its checkpoint is then deleted). --manifest gives the trusted manifest
again, for host sources the saved state leaves out.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverResume(cmd, c, args[0]) })
			}
			m, base, err := mf.load()
			if err != nil {
				return err
			}
			var opts []compute.ResumeOption
			if m != nil {
				opts = append(opts, compute.WithTrustedManifest(m))
			}
			if discard {
				opts = append(opts, compute.DiscardMemory())
			}
			start := time.Now()
			r, err := reconnect(cmd, g, args[0], materializer.Options{BaseDir: base}, opts...)
			if err != nil {
				return err
			}
			defer r.release()
			if r.sess.Restored() {
				fmt.Fprintf(cmd.OutOrStdout(), "session %s: restored from its pause with its memory and processes (%s)\n", r.sess.ID(), time.Since(start).Round(time.Millisecond))
				return nil
			}
			if r.reattached {
				fmt.Fprintf(cmd.OutOrStdout(), "session %s: reattached to its running sandbox\n", r.sess.ID())
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s: the sandbox was gone; %s\n", r.sess.ID(), r.rebuiltHow())
			return nil
		},
	}
	mf.add(cmd)
	cmd.Flags().BoolVar(&discard, "discard-memory", false, "a paused sandbox: rebuild it from its workspace instead of restoring its memory and processes (deletes the checkpoint)")
	return cmd
}

// newSandboxRmCmd returns `harness sandbox rm`.
func newSandboxRmCmd(g *globals) *cobra.Command {
	var keep, noSync bool
	cmd := &cobra.Command{
		Use:   "rm ID [--keep-snapshot] [--no-sync]",
		Short: "Delete a session's sandbox, its saved state and its snapshot",
		Long: `Delete a session's sandbox, its saved state and its snapshot. With --keep-snapshot the snapshot
and the saved state are kept, so that ` + "`harness sandbox resume ID`" + ` rebuilds the sandbox from the
snapshot later. A sandbox without a saved state (one a crashed harness left behind, see ls) is
found through the provider.

A running sandbox's writable mounts are synced first, as closing a session does (see
` + "`harness sandbox sync`" + `): changes not yet uploaded would be lost with the sandbox. If that sync
fails or reports a conflict, nothing is removed and the command exits non-zero; --no-sync removes
the sandbox without uploading, discarding those changes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverRm(cmd, c, args[0]) })
			}
			return sandboxRm(cmd, g, args[0], keep, noSync)
		},
	}
	cmd.Flags().BoolVar(&keep, "keep-snapshot", false, "keep the snapshot and the saved state, to resume the session from the snapshot later")
	cmd.Flags().BoolVar(&noSync, "no-sync", false, "do not sync the writable mounts first: their changes not yet uploaded are discarded")
	return cmd
}

// sandboxRm deletes a session's sandbox and, unless keep, its snapshot and
// saved state. Unless noSync, the writable mounts of a running sandbox with
// a saved state are synced first, and a failed sync keeps everything.
func sandboxRm(cmd *cobra.Command, g *globals, id string, keep, noSync bool) error {
	ctx := cmd.Context()
	st, err := loadState(cmd, g, id)
	saved := err == nil
	if err != nil && !errors.Is(err, compute.ErrNotFound) {
		return err
	}
	client, release, err := g.client(materializer.Options{})
	if err != nil {
		return err
	}
	defer release()
	infos, err := client.List(ctx)
	if err != nil {
		return err
	}
	var found *compute.SandboxInfo
	for i := range infos {
		if infos[i].SessionID == id {
			found = &infos[i]
			break
		}
	}
	if !saved {
		if found == nil {
			return usageErr(compute.ErrNotFound, "no sandbox session %q (no saved state and no %s sandbox of that session)", id, client.Provider())
		}
		st = &compute.State{Version: compute.StateVersion, Provider: found.Provider, SessionID: id,
			Lifetime: found.Lifetime, ProviderState: found.State}
	}
	if found != nil && found.Paused && (noSync || !saved) {
		// Not restored only to be deleted.
		if err := client.DeleteState(ctx, st); err != nil {
			return err
		}
		found = nil
	}
	if found != nil {
		// Resume finds the sandbox again (the only way to a Session; a
		// paused one is restored, for its mounts to sync), then Delete
		// removes it; nothing is started.
		s, err := client.Resume(ctx, st)
		if err != nil {
			return err
		}
		if saved && !noSync {
			if err := syncBeforeRemove(ctx, g, cmd.OutOrStdout(), s); err != nil {
				_ = s.Release()
				return err
			}
		}
		if err := client.Delete(ctx, s); err != nil {
			return err
		}
	}
	forgetMounts(ctx, g, id)
	out := cmd.OutOrStdout()
	if keep && saved {
		fmt.Fprintf(out, "removed the sandbox of session %s; kept snapshot %s and the session state (`harness sandbox resume %s` rebuilds it)\n", id, snapshotOf(st), id)
		return nil
	}
	if !keep {
		store, err := g.snapshots()
		if err != nil {
			return err
		}
		if err := store.Delete(ctx, snapshotOf(st)); err != nil {
			return fmt.Errorf("remove session %s: delete snapshot %s: %w", id, snapshotOf(st), err)
		}
	}
	if err := removeState(g, id); err != nil {
		return err
	}
	fmt.Fprintf(out, "removed session %s\n", id)
	return nil
}

// snapshotOf returns the snapshot id of a state (the session id by default).
func snapshotOf(st *compute.State) string {
	if st.SnapshotID != "" {
		return st.SnapshotID
	}
	return st.SessionID
}

// readStates returns the saved session states, by session id, and the
// files that could not be read.
func readStates(g *globals) (map[string]*compute.State, map[string]string, []error) {
	states := map[string]*compute.State{}
	paths := map[string]string{}
	dir, err := g.dir("sessions")
	if err != nil {
		return states, paths, []error{err}
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return states, paths, []error{fmt.Errorf("read saved states: %w", err)}
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() || filepath.Ext(e.Name()) != ".json" {
			continue
		}
		p := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", p, err))
			continue
		}
		st, err := compute.DecodeState(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		states[st.SessionID] = st
		paths[st.SessionID] = p
	}
	return states, paths, errs
}
