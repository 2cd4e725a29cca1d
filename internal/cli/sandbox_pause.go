package cli

// `harness sandbox pause`: a sandbox paused with its memory and processes
// (gVisor local sandboxes); `harness sandbox resume` restores it.

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
)

// newSandboxPauseCmd returns `harness sandbox pause`.
func newSandboxPauseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a sandbox with its memory and processes (gVisor local sandboxes); resume restores it",
		Long: `Pause session ID's sandbox with its memory and processes: its workspace is persisted to the
snapshot store first, then the whole sandbox (every process, its memory, its open files) is saved
to a checkpoint in the sandbox's private directory and the sandbox stops, releasing its CPU and
memory. ` + "`harness sandbox resume ID`" + ` restores it: its processes run on from where they were.
Local sandboxes under gVisor (--isolation gvisor, a root harness) can be paused; other providers
and isolations refuse, saying what they would need, and leave the sandbox untouched.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverPause(cmd, c, args[0]) })
			}
			ctx := cmd.Context()
			id := args[0]
			st, err := loadState(cmd, g, id)
			if err != nil {
				return err
			}
			if paused, err := isPaused(cmd, g, st); err != nil {
				return err
			} else if paused {
				fmt.Fprintf(cmd.OutOrStdout(), "session %s: paused already (`harness sandbox resume %s` restores it)\n", id, id)
				return nil
			}
			r, err := reconnect(cmd, g, id, materializer.Options{})
			if err != nil {
				return err
			}
			defer r.release()
			r.noteRebuilt(cmd.ErrOrStderr())
			info, err := r.sess.Pause(ctx)
			if err != nil {
				return err
			}
			st, err = r.sess.State()
			if err != nil {
				return err
			}
			if _, err := saveState(g, st); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s: paused with its memory and processes (checkpoint %s, %s; workspace persisted in %s, checkpoint taken in %s); `harness sandbox resume %s` restores it\n",
				id, info.Checkpoint, humanBytes(float64(info.Bytes)), info.Persisted.Round(time.Millisecond), info.Checkpointed.Round(time.Millisecond), id)
			return nil
		},
	}
}

// isPaused reports whether the provider lists session st's sandbox as
// paused.
func isPaused(cmd *cobra.Command, g *globals, st *compute.State) (bool, error) {
	client, release, err := g.client(materializer.Options{})
	if err != nil {
		return false, err
	}
	defer release()
	infos, err := client.List(cmd.Context())
	if err != nil {
		return false, err
	}
	for _, info := range infos {
		if info.SessionID == st.SessionID {
			return info.Paused, nil
		}
	}
	return false, nil
}
