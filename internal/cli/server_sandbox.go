package cli

// `harness sandbox create|exec|ls|rm` against a service (--server): the
// same output and exit codes as locally, through SandboxService.

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// refuseWithServer fails when one of the named flags was given, because
// a service does not take it.
func refuseWithServer(cmd *cobra.Command, why string, names ...string) error {
	for _, n := range names {
		if f := cmd.Flag(n); f != nil && f.Changed {
			return usageErr(compute.ErrInvalidArgument, "--%s: not with --server (%s)", n, why)
		}
	}
	return nil
}

// serverCreate makes a sandbox on the service and prints its id. The
// manifest is sent as text, and the service reads it as an untrusted one
// (no host sources).
func serverCreate(cmd *cobra.Command, g *globals, c *serverConn, mf *manifestFlags, opts compute.CreateOptions) error {
	if err := refuseWithServer(cmd, "the service names, places and networks its sandboxes itself", "id", "pool", "allow-domain", "base-dir", "provider"); err != nil {
		return err
	}
	if opts.TTL < 0 || opts.IdleTimeout < 0 {
		return usageErr(compute.ErrInvalidArgument, "--ttl and --idle-timeout must not be negative")
	}
	req := &harnessv1.CreateSandboxRequest{}
	if mf.manifest != "" {
		b, err := os.ReadFile(mf.manifest)
		if err != nil {
			return fmt.Errorf("--manifest: %w", err)
		}
		req.Manifest = string(b)
	}
	if opts.TTL > 0 {
		req.Ttl = durationpb.New(opts.TTL)
	}
	if opts.IdleTimeout > 0 {
		req.IdleTimeout = durationpb.New(opts.IdleTimeout)
	}
	if len(g.labels) > 0 {
		req.Labels = map[string]string{}
		for _, l := range g.labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return usageErr(compute.ErrInvalidArgument, "--label %q: want KEY=VALUE", l)
			}
			req.Labels[k] = v
		}
	}
	resp, err := c.sandboxes.CreateSandbox(cmd.Context(), connect.NewRequest(req))
	if err != nil {
		return c.serverErr("", err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), resp.Msg.GetSandbox().GetSandboxId())
	return nil
}

// serverExec runs argv in sandbox id through the streaming Exec and ends
// with the command's exit code.
func serverExec(cmd *cobra.Command, c *serverConn, f *execFlags, id string, argv []string) error {
	if f.tty {
		return serverTerminal(cmd, c, id, argv, false)
	}
	ctx := cmd.Context()
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	stream, err := c.sandboxes.Exec(ctx, connect.NewRequest(&harnessv1.ExecRequest{
		SandboxId: id, Argv: argv, Cwd: workspacePath(f.workdir), User: f.user}))
	if err != nil {
		return c.serverErr(id, err)
	}
	defer stream.Close()
	for stream.Receive() {
		switch m := stream.Msg(); {
		case m.GetOutput() != nil:
			w := stdout
			if m.GetOutput().GetStream() == harnessv1.OutputStream_OUTPUT_STREAM_STDERR {
				w = stderr
			}
			if _, err := w.Write(m.GetOutput().GetData()); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		case m.GetExited() != nil:
			x := m.GetExited()
			if x.GetDroppedBytes() > 0 {
				fmt.Fprintf(stderr, "\r\n[%d bytes of output were lost: the sandbox's output buffer wrapped]\r\n", x.GetDroppedBytes())
			}
			return exitWith(&compute.ExitStatus{ExitCode: int(x.GetExitCode()), Signal: x.GetSignal(), TimedOut: x.GetTimedOut()})
		}
	}
	if ctx.Err() != nil {
		return exitError{code: 130, msg: fmt.Sprintf("interrupted; the command was stopped (%v)", context.Cause(ctx))}
	}
	if err := stream.Err(); err != nil {
		return c.serverErr(id, err)
	}
	return fmt.Errorf("exec in sandbox %s: the stream ended before the command's exit", id)
}

// serverList lists the tenant's sandboxes on the service as ls entries.
func serverList(cmd *cobra.Command, c *serverConn) ([]lsEntry, error) {
	var out []lsEntry
	now := time.Now()
	token := ""
	for {
		resp, err := c.sandboxes.ListSandboxes(cmd.Context(), connect.NewRequest(&harnessv1.ListSandboxesRequest{PageSize: 500, PageToken: token}))
		if err != nil {
			return nil, c.serverErr("", err)
		}
		for _, s := range resp.Msg.GetSandboxes() {
			e := lsEntry{SessionID: s.GetSandboxId(), Provider: s.GetProvider(), Sandbox: s.GetSandboxId(),
				Running: s.GetStatus() == harnessv1.SandboxStatus_SANDBOX_STATUS_RUNNING, Server: c.base}
			if s.GetCreateTime() != nil {
				e.CreatedAt = s.GetCreateTime().AsTime()
			}
			if s.GetExpireTime() != nil {
				e.Expired = !s.GetExpireTime().AsTime().After(now)
			}
			if s.GetIdleTimeout() != nil {
				e.IdleTimeout = s.GetIdleTimeout().AsDuration()
			}
			out = append(out, e)
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SessionID < out[j].SessionID })
	return out, nil
}

// serverRm deletes sandbox id on the service.
func serverRm(cmd *cobra.Command, c *serverConn, id string) error {
	if err := refuseWithServer(cmd, "the service keeps no snapshot of a deleted sandbox, and syncs nothing", "keep-snapshot", "no-sync"); err != nil {
		return err
	}
	if _, err := c.sandboxes.DeleteSandbox(cmd.Context(), connect.NewRequest(&harnessv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		return c.serverErr(id, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "removed session %s\n", id)
	return nil
}

// serverUnsupported is the answer of a call an older service lacks
// (Unimplemented), naming the command; other errors as serverErr words
// them.
func serverUnsupported(c *serverConn, id, what string, err error) error {
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		return usageErr(compute.ErrUnimplemented, "this server does not support %s (%s is an older harness serve)", what, c.base)
	}
	return c.serverErr(id, err)
}

// serverPause pauses sandbox id on the service.
func serverPause(cmd *cobra.Command, c *serverConn, id string) error {
	resp, err := c.sandboxes.PauseSandbox(cmd.Context(), connect.NewRequest(&harnessv1.PauseSandboxRequest{SandboxId: id}))
	if err != nil {
		return serverUnsupported(c, id, "pause", err)
	}
	kept := "its workspace only (this server's provider cannot keep memory: its processes ended)"
	if resp.Msg.GetKeepMemory() {
		kept = "its memory and processes"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "session %s: paused with %s; `harness sandbox resume %s` restores it\n", id, kept, id)
	return nil
}

// serverResume resumes sandbox id on the service.
func serverResume(cmd *cobra.Command, c *serverConn, id string) error {
	resp, err := c.sandboxes.ResumeSandbox(cmd.Context(), connect.NewRequest(&harnessv1.ResumeSandboxRequest{SandboxId: id}))
	if err != nil {
		return serverUnsupported(c, id, "resume", err)
	}
	if resp.Msg.GetKeepMemory() {
		fmt.Fprintf(cmd.OutOrStdout(), "session %s: restored from its pause with its memory and processes\n", id)
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "session %s: running (its workspace kept; processes started before a pause ended)\n", id)
	return nil
}

// serverSnapshot takes a snapshot of sandbox id's workspace on the
// service and prints its id.
func serverSnapshot(cmd *cobra.Command, c *serverConn, id string) error {
	resp, err := c.sandboxes.SnapshotSandbox(cmd.Context(), connect.NewRequest(&harnessv1.SnapshotSandboxRequest{SandboxId: id}))
	if err != nil {
		return serverUnsupported(c, id, "snapshot", err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), resp.Msg.GetSnapshot().GetSnapshotId())
	return nil
}

// serverSnapshotLs lists the tenant's snapshots on the service, in the
// columns of the local listing.
func serverSnapshotLs(cmd *cobra.Command, c *serverConn, asJSON bool) error {
	resp, err := c.sandboxes.ListSnapshots(cmd.Context(), connect.NewRequest(&harnessv1.ListSnapshotsRequest{}))
	if err != nil {
		return serverUnsupported(c, "", "snapshots", err)
	}
	entries := []snapshotEntry{}
	for _, s := range resp.Msg.GetSnapshots() {
		e := snapshotEntry{ID: s.GetSnapshotId(), Size: s.GetSizeBytes()}
		if s.GetCreateTime() != nil {
			e.Modified = s.GetCreateTime().AsTime().UTC()
		}
		entries = append(entries, e)
	}
	out := cmd.OutOrStdout()
	if asJSON {
		return printJSON(out, entries)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tSIZE\tCHUNKS\tMODIFIED")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t-\t%s\n", e.ID, dash(e.Size), e.Modified.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// serverSnapshotRm deletes the tenant's snapshots ids on the service.
func serverSnapshotRm(cmd *cobra.Command, c *serverConn, ids []string) error {
	for _, id := range ids {
		if _, err := c.sandboxes.DeleteSnapshot(cmd.Context(), connect.NewRequest(&harnessv1.DeleteSnapshotRequest{SnapshotId: id})); err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound {
				return usageErr(compute.ErrNotFound, "no snapshot %s on %s", id, c.base)
			}
			return serverUnsupported(c, "", "snapshots", err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "removed snapshot %s\n", id)
	}
	return nil
}

// newSandboxForkCmd returns `harness sandbox fork` (through a service).
func newSandboxForkCmd(g *globals) *cobra.Command {
	var count int32
	cmd := &cobra.Command{
		Use:   "fork ID [--count N]",
		Short: "Make N new sandboxes from a sandbox's current workspace, and print their ids (needs --server)",
		Long: `Make N independent sandboxes from session ID's current workspace, with its manifest and labels,
and print their ids, one a line. All or none are made. This goes through a harness serve (--server,
$BULKHEAD_SERVER or the context's server): its ForkSandbox call.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.server()
			if err != nil {
				return err
			}
			if c == nil {
				return usageErr(compute.ErrUnimplemented, "fork needs a server (--server, $%s or a context's server): local sandboxes are forked through the Go library", serverEnv)
			}
			if count < 1 {
				return usageErr(compute.ErrInvalidArgument, "--count %d: at least 1", count)
			}
			resp, err := c.sandboxes.ForkSandbox(cmd.Context(), connect.NewRequest(&harnessv1.ForkSandboxRequest{SandboxId: args[0], Count: count}))
			if err != nil {
				return serverUnsupported(c, args[0], "fork", err)
			}
			for _, s := range resp.Msg.GetSandboxes() {
				fmt.Fprintln(cmd.OutOrStdout(), s.GetSandboxId())
			}
			return nil
		},
	}
	cmd.Flags().Int32VarP(&count, "count", "n", 1, "how many sandboxes to make")
	return cmd
}

// orServer runs fn, the command's service form, unless resolving the
// service failed with err.
func orServer(err error, fn func() error) error {
	if err != nil {
		return err
	}
	return fn()
}
