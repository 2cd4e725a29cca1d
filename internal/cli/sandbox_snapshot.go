package cli

// The snapshot store the commands use (--snapshot-store), and the
// `harness sandbox snapshot ls|rm|gc` subcommands that manage it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot/s3store"
)

// storeFlags choose the snapshot store.
type storeFlags struct {
	// store is a directory or s3://BUCKET[/PREFIX]; empty means the state
	// directory's snapshots/.
	store string
	// s3Endpoint is an S3-compatible server's URL (overrides
	// AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL).
	s3Endpoint string
}

func (f *storeFlags) add(pf *pflag.FlagSet) {
	pf.StringVar(&f.store, "snapshot-store", "", "where workspace snapshots are kept: a directory, or s3://BUCKET[/PREFIX] "+
		"(credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION) (default: the state directory's snapshots/)")
	pf.StringVar(&f.s3Endpoint, "s3-endpoint", "", "URL of an S3-compatible server (MinIO, R2, Versity) for an s3:// --snapshot-store (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS)")
}

// snapshots returns the snapshot store the command's sessions persist to.
func (g *globals) snapshots() (snapshot.Lister, error) {
	spec := g.storeFlags.store
	if spec == "" {
		dir, err := g.dir("snapshots")
		if err != nil {
			return nil, err
		}
		return snapshot.NewLocal(dir)
	}
	if !strings.Contains(spec, "://") {
		return snapshot.NewLocal(spec)
	}
	if !strings.HasPrefix(spec, "s3://") {
		return nil, usageErr(compute.ErrInvalidArgument, "--snapshot-store: want a directory or s3://BUCKET[/PREFIX]")
	}
	cfg, err := s3store.ConfigFromURL(spec, os.Getenv)
	if err != nil {
		return nil, usageErr(compute.ErrInvalidArgument, "--snapshot-store: %v", err)
	}
	if g.storeFlags.s3Endpoint != "" {
		cfg.Endpoint, cfg.UsePathStyle = g.storeFlags.s3Endpoint, true
	}
	cfg.Log = g.logger()
	s, err := s3store.New(cfg)
	if err != nil {
		return nil, usageErr(compute.ErrInvalidArgument, "--snapshot-store: %v", err)
	}
	return s, nil
}

// addSnapshotSubcommands adds ls, rm and gc to `harness sandbox snapshot`.
func addSnapshotSubcommands(g *globals, cmd *cobra.Command) {
	cmd.AddCommand(newSnapshotLsCmd(g), newSnapshotRmCmd(g), newSnapshotGCCmd(g))
}

// snapshotEntry is a line of `snapshot ls`.
type snapshotEntry struct {
	ID       string    `json:"id"`
	Size     int64     `json:"size,omitempty"`
	Chunks   int       `json:"chunks,omitempty"`
	Modified time.Time `json:"modified"`
}

func newSnapshotLsCmd(g *globals) *cobra.Command {
	var asJSON, long bool
	cmd := &cobra.Command{
		Use:   "ls [--long] [--json]",
		Short: "List the snapshots in the snapshot store",
		Long: `List the snapshots in the snapshot store (--snapshot-store), one listing page at a time.
With --long each snapshot is also described (its size; its chunks in an S3 store), which reads
one small object per snapshot in an S3 store.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			store, err := g.snapshots()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			var entries []snapshotEntry
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			if !asJSON {
				fmt.Fprintln(tw, "SNAPSHOT\tSIZE\tCHUNKS\tMODIFIED")
			}
			err = store.List(ctx, func(in snapshot.Info) error {
				if long {
					st, err := store.Stat(ctx, in.ID)
					if errors.Is(err, compute.ErrNotFound) {
						return nil // deleted since the listing
					}
					if err != nil {
						return err
					}
					in = st
				}
				e := snapshotEntry{ID: in.ID, Size: in.Size, Chunks: in.Chunks, Modified: in.Modified.UTC()}
				if asJSON {
					entries = append(entries, e)
					return nil
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.ID, dash(e.Size), dash(int64(e.Chunks)), e.Modified.Local().Format(time.DateTime))
				return nil
			})
			if err != nil {
				return fmt.Errorf("snapshot ls: %w", err)
			}
			if asJSON {
				if entries == nil {
					entries = []snapshotEntry{}
				}
				b, err := json.MarshalIndent(entries, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(out, string(b))
				return nil
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "describe each snapshot (size, chunks)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func dash(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func newSnapshotRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm SNAPSHOT...",
		Short: "Delete snapshots from the snapshot store",
		Long: `Delete snapshots from the snapshot store. Session states naming them are left alone (a resume
then builds the workspace from the manifest). In an S3 store the chunks only the deleted snapshots
used are freed by ` + "`harness sandbox snapshot gc`" + `.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, err := g.snapshots()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := snapshot.ValidateID(id); err != nil {
					return usageErr(compute.ErrInvalidArgument, "%q is not a snapshot id (1-128 characters from [A-Za-z0-9._-])", id)
				}
				ok, err := store.Exists(ctx, id)
				if err != nil {
					return fmt.Errorf("snapshot rm: %w", err)
				}
				if !ok {
					return usageErr(compute.ErrNotFound, "snapshot rm: no snapshot %s in the store", id)
				}
				if err := store.Delete(ctx, id); err != nil {
					return fmt.Errorf("snapshot rm: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed snapshot %s\n", id)
			}
			return nil
		},
	}
}

func newSnapshotGCCmd(g *globals) *cobra.Command {
	var (
		grace  time.Duration
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "gc [--grace 24h] [--dry-run]",
		Short: "Delete the chunks no snapshot uses from an S3 snapshot store",
		Long: `Delete the chunks no snapshot references from an S3 snapshot store. Chunks younger than --grace
are kept whatever references them: an upload in progress references its chunks only once it
finishes, and --grace must be longer than any upload takes (uploads refuse to finish past half
the store's grace period, 24h). A directory store keeps whole files and has nothing to collect.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := g.snapshots()
			if err != nil {
				return err
			}
			s3, ok := store.(*s3store.Store)
			if !ok {
				fmt.Fprintln(cmd.OutOrStdout(), "a directory snapshot store has nothing to collect")
				return nil
			}
			st, err := s3.GC(cmd.Context(), s3store.GCOptions{Grace: grace, DryRun: dryRun})
			if err != nil {
				return err
			}
			verb := "deleted"
			if dryRun {
				verb = "would delete"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d snapshots reference %d of %d chunks; %s %d unreferenced chunks (%d bytes)\n",
				st.Snapshots, st.Referenced, st.Chunks, verb, st.Deleted, st.Bytes)
			return nil
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 0, "keep chunks younger than this (default: the store's, 24h)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	return cmd
}
