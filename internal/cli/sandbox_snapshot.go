package cli

// The snapshot store the commands use (--snapshot-store), and the
// `harness sandbox snapshot ls|rm|gc` subcommands that manage it.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot/s3store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
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
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverSnapshotLs(cmd, c, asJSON) })
			}
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
				return err
			}
			if asJSON {
				if entries == nil {
					entries = []snapshotEntry{}
				}
				return printJSON(out, entries)
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
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverSnapshotRm(cmd, c, args) })
			}
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
					return err
				}
				if !ok {
					return usageErr(compute.ErrNotFound, "no snapshot %s in the store", id)
				}
				if err := store.Delete(ctx, id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed snapshot %s\n", id)
			}
			return nil
		},
	}
}

// The snapshot store's default retention (`harness sandbox snapshot gc`).
const (
	// DefaultSnapshotMaxAge: older snapshots are removed.
	DefaultSnapshotMaxAge = 7 * 24 * time.Hour
	// DefaultSnapshotMaxCount: snapshots past the newest this many are
	// removed.
	DefaultSnapshotMaxCount = 50
)

func newSnapshotGCCmd(g *globals) *cobra.Command {
	var (
		grace    time.Duration
		dryRun   bool
		maxAge   = ageValue(DefaultSnapshotMaxAge)
		maxCount int
	)
	cmd := &cobra.Command{
		Use:   "gc [--max-age 7d] [--max-count 50] [--dry-run] [--grace 24h]",
		Short: "Remove old snapshots (by default those older than 7 days or past the newest 50) and the chunks no snapshot uses",
		Long: `Apply the snapshot store's retention, then, in an S3 store, delete the chunks no snapshot uses.

Retention: a snapshot is removed when it is older than --max-age (default 7d) or is not among the
newest --max-count (default 50) in the store; 0 turns a limit off. A snapshot that a saved state
still names is never removed, whatever its age: a session of ` + "`harness sandbox create`" + ` or of
` + "`harness run --keep`" + ` (the state directory's sessions/), or a run stopped for approval (runs/).
--dry-run lists what would be removed and removes nothing.

Chunks (S3 stores): chunks younger than --grace are kept whatever references them: an upload in
progress references its chunks only once it finishes, and --grace must be longer than any upload
takes (uploads refuse to finish past half the store's grace period, 24h). A directory store keeps
whole files and has no chunks to collect.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if maxCount < 0 || maxAge < 0 {
				return usageErr(compute.ErrInvalidArgument, "--max-age and --max-count must not be negative (0 turns a limit off)")
			}
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error {
					return usageErr(compute.ErrUnimplemented, "gc works on a snapshot store, not through a server: %s keeps its tenants' snapshots under a quota; remove them with `harness sandbox snapshot rm`", c.base)
				})
			}
			store, err := g.snapshots()
			if err != nil {
				return err
			}
			if err := snapshotRetention(cmd, g, store, retention{maxAge: time.Duration(maxAge), maxCount: maxCount}, dryRun); err != nil {
				return err
			}
			s3, ok := store.(*s3store.Store)
			if !ok {
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
	cmd.Flags().Var(&maxAge, "max-age", "remove snapshots older than this, e.g. 7d, 36h (0: no age limit)")
	cmd.Flags().IntVar(&maxCount, "max-count", DefaultSnapshotMaxCount, "keep at most this many snapshots, the newest (0: no count limit)")
	cmd.Flags().DurationVar(&grace, "grace", 0, "S3 stores: keep chunks younger than this (default: the store's, 24h)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list the snapshots and count the chunks that would be removed; remove nothing")
	return cmd
}

// retention says which snapshots gc keeps: those younger than maxAge and
// among the newest maxCount (a zero limit is off), and any a saved state
// names.
type retention struct {
	maxAge   time.Duration
	maxCount int
}

func (r retention) String() string {
	var parts []string
	if r.maxAge > 0 {
		parts = append(parts, "younger than "+formatAge(r.maxAge))
	}
	if r.maxCount > 0 {
		parts = append(parts, fmt.Sprintf("the newest %d", r.maxCount))
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return strings.Join(parts, ", ")
}

// retentionVerdict is what gc does with one snapshot that the retention
// would remove.
type retentionVerdict struct {
	info   snapshot.Info
	why    string // why the retention would remove it
	heldBy string // the saved state naming it ("" when none: it goes)
}

// planRetention returns the snapshots of infos that r would remove, newest
// first, each with the state that keeps it (held names snapshot ids'
// states).
func planRetention(infos []snapshot.Info, held map[string]string, r retention, now time.Time) []retentionVerdict {
	sorted := slices.Clone(infos)
	slices.SortStableFunc(sorted, func(a, b snapshot.Info) int {
		if c := b.Modified.Compare(a.Modified); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	var out []retentionVerdict
	for i, in := range sorted {
		why := ""
		switch age := now.Sub(in.Modified); {
		case r.maxAge > 0 && age > r.maxAge:
			why = fmt.Sprintf("%s old, past %s", roughAge(age), formatAge(r.maxAge))
		case r.maxCount > 0 && i >= r.maxCount:
			why = fmt.Sprintf("not among the newest %d", r.maxCount)
		default:
			continue
		}
		out = append(out, retentionVerdict{info: in, why: why, heldBy: held[in.ID]})
	}
	return out
}

// snapshotRetention removes (or with dryRun lists) the snapshots r does
// not keep, never one a saved state names, and says what it did.
func snapshotRetention(cmd *cobra.Command, g *globals, store snapshot.Lister, r retention, dryRun bool) error {
	ctx := cmd.Context()
	held, err := heldSnapshots(g)
	if err != nil {
		return fmt.Errorf("%w; nothing was removed (the saved states must be readable to tell which snapshots they need)", err)
	}
	var infos []snapshot.Info
	if err := store.List(ctx, func(in snapshot.Info) error {
		infos = append(infos, in)
		return nil
	}); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	removed, kept := 0, 0
	var errs []error
	for _, v := range planRetention(infos, held, r, time.Now()) {
		switch {
		case v.heldBy != "":
			kept++
			fmt.Fprintf(out, "kept snapshot %s (%s): the saved state %s names it\n", v.info.ID, v.why, v.heldBy)
		case dryRun:
			removed++
			fmt.Fprintf(out, "would remove snapshot %s (%s)\n", v.info.ID, v.why)
		default:
			if err := store.Delete(ctx, v.info.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
			fmt.Fprintf(out, "removed snapshot %s (%s)\n", v.info.ID, v.why)
		}
	}
	verb := "removed"
	if dryRun {
		verb = "would remove"
	}
	fmt.Fprintf(out, "%d snapshots; retention keeps %s: %s %d", len(infos), r, verb, removed)
	if kept > 0 {
		fmt.Fprintf(out, ", kept %d that saved states name", kept)
	}
	fmt.Fprintln(out)
	return errors.Join(errs...)
}

// heldSnapshots returns the snapshot ids that saved states name, each with
// the file of one such state: the sessions' (sessions/) and the sessions of
// runs stopped for approval (runs/). A state that cannot be read is an
// error: the snapshot it names is unknown.
func heldSnapshots(g *globals) (map[string]string, error) {
	held := map[string]string{}
	states, paths, errs := readStates(g)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for id, st := range states {
		held[snapshotOf(st)] = paths[id]
	}
	dir, err := g.dir("runs")
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the stopped runs' states: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() || filepath.Ext(e.Name()) != ".json" {
			continue
		}
		p := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rs, err := harness.DecodeRunState(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, st := range rs.Sessions {
			if st != nil {
				held[snapshotOf(st)] = p
			}
		}
	}
	return held, nil
}

// ageValue is a duration flag that also takes days: 7d, 1d12h, 36h.
type ageValue time.Duration

func (a *ageValue) String() string { return formatAge(time.Duration(*a)) }

func (a *ageValue) Type() string { return "age" }

func (a *ageValue) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	*a = ageValue(d)
	return nil
}

// parseAge reads a duration with an optional leading whole number of days
// ("7d", "1d12h") before time.ParseDuration's units.
func parseAge(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseUint(s[:i], 10, 16)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration such as 7d, 36h or 1d12h", s)
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a duration such as 7d, 36h or 1d12h", s)
	}
	return days + d, nil
}

// formatAge writes a duration the way parseAge reads it, whole days as
// days and without zero units: 7d, 1d12h, 36m.
func formatAge(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	days := d / (24 * time.Hour)
	rest := ""
	if r := d - days*24*time.Hour; r > 0 {
		rest = r.String() // 12h0m0s, 1h30m0s, 36m0s, 1m30s
		if strings.HasSuffix(rest, "m0s") {
			rest = rest[:len(rest)-2]
		}
		if strings.HasSuffix(rest, "h0m") {
			rest = rest[:len(rest)-2]
		}
	}
	if days == 0 {
		return rest
	}
	return fmt.Sprintf("%dd%s", days, rest)
}

// roughAge writes an age in its largest whole unit: 9 days, 5 hours, 3 minutes.
func roughAge(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d >= 2*time.Hour:
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return fmt.Sprintf("%d minutes", d/time.Minute)
}
