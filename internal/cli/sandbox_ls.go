package cli

// `harness sandbox ls`: the provider's sandboxes and the saved sessions.

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
)

// lsEntry is one session as ls shows it: its sandbox (when the provider
// has one) and its saved state (when there is one).
type lsEntry struct {
	SessionID string `json:"session_id"`
	Provider  string `json:"provider"`
	// Sandbox is the provider's id of the sandbox; empty when it has none.
	Sandbox     string        `json:"sandbox,omitempty"`
	Running     bool          `json:"running"`
	Paused      bool          `json:"paused,omitempty"`
	Expired     bool          `json:"expired"`
	CreatedAt   time.Time     `json:"created_at,omitzero"`
	TTL         time.Duration `json:"ttl,omitempty"`
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	LastActive  time.Time     `json:"last_active,omitzero"`
	// StateFile is the saved session state; empty when there is none (a
	// sandbox a crashed harness left behind).
	StateFile  string `json:"state_file,omitempty"`
	SnapshotID string `json:"snapshot_id,omitempty"`
	// Snapshot reports whether the snapshot exists in the store.
	Snapshot bool `json:"snapshot"`
	// Server is the service that keeps the sandbox (--server); empty for
	// this machine's sandboxes.
	Server string `json:"server,omitempty"`
	// OtherProvider is set for a saved session of another provider than
	// the one listed, whose sandbox was not looked up.
	OtherProvider bool `json:"other_provider,omitempty"`
}

// newSandboxLsCmd returns `harness sandbox ls`.
func newSandboxLsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the provider's sandboxes and the saved sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var entries []lsEntry
			c, err := g.server()
			switch {
			case err != nil:
				return err
			case c != nil:
				entries, err = serverList(cmd, c)
			default:
				entries, err = sandboxList(cmd, g)
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if entries == nil {
					entries = []lsEntry{}
				}
				return printJSON(out, entries)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tPROVIDER\tSANDBOX\tEXPIRED\tSAVED\tSNAPSHOT\tCREATED")
			for _, e := range entries {
				created := "-"
				if !e.CreatedAt.IsZero() {
					created = e.CreatedAt.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.SessionID, e.Provider, e.sandboxColumn(),
					yesNo(e.Expired), yesNo(e.StateFile != "" || e.Server != ""), e.snapshotColumn(), created)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

// sandboxList joins the provider's sandboxes with the saved states.
// Unreadable state files are reported on stderr and skipped.
func sandboxList(cmd *cobra.Command, g *globals) ([]lsEntry, error) {
	ctx := cmd.Context()
	client, release, err := g.client(materializer.Options{})
	if err != nil {
		return nil, err
	}
	defer release()
	infos, err := client.List(ctx)
	if err != nil {
		return nil, err
	}
	store, err := g.snapshots()
	if err != nil {
		return nil, err
	}
	states, paths, errs := readStates(g)
	for _, err := range errs {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", oneLine(err.Error()))
	}
	now := time.Now()
	byID := map[string]*lsEntry{}
	var order []string
	entry := func(id, provider string) *lsEntry {
		if e, ok := byID[id]; ok {
			return e
		}
		e := &lsEntry{SessionID: id, Provider: provider}
		byID[id] = e
		order = append(order, id)
		return e
	}
	for _, info := range infos {
		e := entry(info.SessionID, info.Provider)
		e.Sandbox, e.Running, e.Paused, e.Expired = info.ID, info.Running, info.Paused, info.Expired(now)
		e.CreatedAt, e.TTL, e.IdleTimeout = info.Lifetime.CreatedAt, info.Lifetime.TTL, info.Lifetime.IdleTimeout
		e.LastActive = info.LastActive
	}
	for id, st := range states {
		e := entry(id, st.Provider)
		e.StateFile, e.SnapshotID = paths[id], snapshotOf(st)
		e.OtherProvider = st.Provider != client.Provider()
		if e.CreatedAt.IsZero() {
			e.CreatedAt, e.TTL, e.IdleTimeout = st.Lifetime.CreatedAt, st.Lifetime.TTL, st.Lifetime.IdleTimeout
			e.Expired = st.Lifetime.Expired(now, time.Time{})
		}
		if e.Snapshot, err = store.Exists(ctx, e.SnapshotID); err != nil {
			return nil, fmt.Errorf("session %s: snapshot %s: %w", id, e.SnapshotID, err)
		}
	}
	sort.Strings(order)
	out := make([]lsEntry, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out, nil
}

// sandboxColumn describes the sandbox: running, stopped or gone.
func (e lsEntry) sandboxColumn() string {
	switch {
	case e.OtherProvider:
		return "? (other provider)"
	case e.Sandbox == "":
		return "gone"
	case e.Running:
		return "running"
	case e.Paused:
		return "paused"
	}
	return "stopped"
}

// snapshotColumn names the snapshot when it exists.
func (e lsEntry) snapshotColumn() string {
	if e.Snapshot {
		return e.SnapshotID
	}
	return "-"
}

// yesNo renders a flag for the table.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printJSON writes v to out as indented JSON, a listing's --json form.
func printJSON(out io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(b))
	return err
}
