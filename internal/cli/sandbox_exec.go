package cli

// `harness sandbox exec` runs one command in a sandbox; `harness sandbox
// shell` opens an interactive shell through a PTY.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
)

// shellCommand starts the sandbox user's interactive shell: bash when the
// sandbox has it, else sh, as a login shell.
const shellCommand = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"

// stdinChunk is the most input forwarded in one WriteStdin.
const stdinChunk = 32 << 10

// execFlags are the flags of exec.
type execFlags struct {
	user    string
	workdir string
	tty     bool
}

// newSandboxExecCmd returns `harness sandbox exec`.
func newSandboxExecCmd(g *globals) *cobra.Command {
	f := &execFlags{}
	cmd := &cobra.Command{
		Use:   "exec ID [--user U] [--workdir W] [--tty] -- CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output, and exit with its exit code",
		Long: `Run CMD with ARGS in the session's sandbox (no shell is involved: use sh -c for one). Output is
streamed as it comes, stdout and stderr kept apart (one stream with --tty), and the exit status is
the command's.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 1 || dash == 0 {
				return usageErr(compute.ErrInvalidArgument, "usage: exec ID [flags] -- CMD [ARGS...] (one session id before --)")
			}
			if len(args) < 2 {
				return usageErr(compute.ErrInvalidArgument, "usage: exec ID [flags] -- CMD [ARGS...] (no command given)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error { return serverExec(cmd, c, f, args[0], args[1:]) })
			}
			return sandboxExec(cmd, g, f, args[0], args[1:])
		},
	}
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "sandbox user to run as (default: the manifest's run_as user)")
	cmd.Flags().StringVarP(&f.workdir, "workdir", "w", "", "working directory, relative to the workspace root")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run under a pseudo-terminal (stdout and stderr become one stream)")
	return cmd
}

// sandboxExec runs argv in session id and ends with its exit code.
func sandboxExec(cmd *cobra.Command, g *globals, f *execFlags, id string, argv []string) error {
	ctx := cmd.Context()
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	r, err := reconnect(cmd, g, id, materializer.Options{})
	if err != nil {
		return err
	}
	defer r.release()
	r.noteRebuilt(stderr)
	spec := compute.ProcessSpec{Argv: argv, Cwd: f.workdir, User: runAsUser(r.sess, f.user), Tty: f.tty}
	if f.tty {
		spec.Size = termSize(cmd.OutOrStdout())
		spec.Env = map[string]string{"TERM": termName()}
	}
	res, err := r.sess.Exec(ctx, spec, compute.ExecOptions{}, func(msg *compute.ExecEvent) error {
		return writeOutput(stdout, stderr, msg.Chunks, msg.DroppedBytes)
	})
	if err != nil {
		if ctx.Err() != nil {
			return exitError{code: 130, msg: fmt.Sprintf("interrupted; the command was stopped (%v)", context.Cause(ctx))}
		}
		return fmt.Errorf("exec in session %s: %w", id, err)
	}
	return exitWith(&res.Exit)
}

// runAsUser is the user a command runs as: the --user flag, else the
// session manifest's run_as user (else the daemon's default user).
func runAsUser(sess *compute.Session, flag string) string {
	if flag != "" {
		return flag
	}
	if m := sess.Manifest(); m != nil {
		return m.RunAs
	}
	return ""
}

// writeOutput writes a batch of process output: stderr chunks to stderr,
// everything else (stdout, PTY) to stdout, and notes lost output.
func writeOutput(stdout, stderr io.Writer, chunks []compute.OutputChunk, dropped int64) error {
	if dropped > 0 {
		fmt.Fprintf(stderr, "\r\n[%d bytes of output were lost: the sandbox's output buffer wrapped]\r\n", dropped)
	}
	for _, ch := range chunks {
		w := stdout
		if ch.Stream == compute.StreamStderr {
			w = stderr
		}
		if _, err := w.Write(ch.Data); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	}
	return nil
}

// exitWith turns a process's exit status into the command's.
func exitWith(exit *compute.ExitStatus) error {
	code := exit.ExitCode
	switch {
	case exit.TimedOut:
		return exitError{code: code, msg: "the command timed out"}
	case exit.Signal != "":
		return exitError{code: code, msg: "the command was killed by " + exit.Signal}
	case code != 0:
		return exitError{code: code}
	}
	return nil
}

// newSandboxShellCmd returns `harness sandbox shell`.
func newSandboxShellCmd(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "shell ID [--user U]",
		Short: "Open an interactive shell in a sandbox",
		Long: `Open an interactive login shell (bash, else sh) in the session's sandbox through a pseudo-terminal.
The local terminal is put in raw mode (and restored on exit), window resizes are forwarded, and
the exit status is the shell's. Stdin must be a terminal.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := g.server(); err != nil || c != nil {
				return orServer(err, func() error {
					if err := refuseWithServer(cmd, "the shell runs as the sandbox's own account", "user"); err != nil {
						return err
					}
					return serverTerminal(cmd, c, args[0], nil, true)
				})
			}
			return sandboxShell(cmd, g, args[0], user)
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "sandbox user to run as (default: the manifest's run_as user)")
	return cmd
}

// sandboxShell runs an interactive shell in session id.
func sandboxShell(cmd *cobra.Command, g *globals, id, user string) error {
	in, out, stderr := cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	inFd, ok := fdOf(in)
	if !ok {
		return usageErr(compute.ErrFailedPrecondition,
			"shell needs an interactive terminal, and stdin is not one (to run a command: harness sandbox exec %s -- CMD)", id)
	}
	ctx := cmd.Context()
	r, err := reconnect(cmd, g, id, materializer.Options{})
	if err != nil {
		return err
	}
	defer r.release()
	r.noteRebuilt(stderr)
	agent := r.sess.Agent()
	var sizeOf any = out
	if _, ok := fdOf(out); !ok {
		sizeOf = in
	}
	spec := compute.ProcessSpec{
		Argv: []string{"/bin/sh", "-c", shellCommand},
		User: runAsUser(r.sess, user),
		Tty:  true,
		Size: termSize(sizeOf),
		Env:  map[string]string{"TERM": termName()},
	}
	started, err := agent.Start(ctx, spec, compute.StartOptions{})
	if err != nil {
		return fmt.Errorf("shell in session %s: %w", id, err)
	}
	pid := started.Process.ProcessID
	old, err := term.MakeRaw(inFd)
	if err != nil {
		hangUp(ctx, agent, pid)
		return fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	exit, err := runShell(ctx, agent, pid, in, out, stderr, sizeOf)
	// Restore the terminal before anything else is printed.
	if rerr := term.Restore(inFd, old); rerr != nil {
		err = errors.Join(err, fmt.Errorf("restore the terminal: %w", rerr))
	}
	if err != nil {
		hangUp(ctx, agent, pid)
		if ctx.Err() != nil {
			return exitError{code: 130, msg: fmt.Sprintf("interrupted; the shell was hung up (%v)", context.Cause(ctx))}
		}
		return fmt.Errorf("shell in session %s: %w", id, err)
	}
	return exitWith(exit)
}

// runShell connects a started PTY process to the local terminal: input
// forwarded with offsets, output followed from its cursor, window resizes
// forwarded; it returns when the process exits or the connection fails.
//
// A read from a terminal cannot be interrupted, so the goroutine reading
// stdin is left blocked when the shell exits; the command ends right after.
func runShell(ctx context.Context, agent *agentclient.Client, pid string, in io.Reader, out, stderr io.Writer, sizeOf any) (*compute.ExitStatus, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
				_ = agent.Resize(ctx, pid, termSize(sizeOf)) // a lost resize only misdraws
			}
		}
	}()

	inputErr := make(chan error, 1)
	go func() { inputErr <- forwardInput(ctx, agent, pid, in) }()

	type result struct {
		exit *compute.ExitStatus
		err  error
	}
	done := make(chan result, 1)
	go func() {
		exit, err := agent.Follow(ctx, pid, compute.FollowOptions{}, func(msg *compute.Output) error {
			return writeOutput(out, stderr, msg.Chunks, msg.DroppedBytes)
		})
		done <- result{exit, err}
	}()
	for {
		select {
		case res := <-done:
			return res.exit, res.err
		case err := <-inputErr:
			inputErr = nil // stdin ended: keep showing output until the shell exits
			if err != nil && !exited(ctx, agent, pid) {
				cancel()
				<-done
				return nil, err
			}
		}
	}
}

// forwardInput copies in to the process's stdin. Offsets make a write
// retried across a dropped connection apply once.
func forwardInput(ctx context.Context, agent *agentclient.Client, pid string, in io.Reader) error {
	buf := make([]byte, stdinChunk)
	var offset int64
	for {
		n, rerr := in.Read(buf)
		if n > 0 {
			next, err := agent.WriteStdin(ctx, pid, offset, buf[:n])
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("forward input: %w", err)
			}
			offset = next
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read stdin: %w", rerr)
		}
	}
}

// exited reports whether the process is known to have exited (input
// fails once it has, while its last output may still be on its way).
func exited(ctx context.Context, agent *agentclient.Client, pid string) bool {
	procs, err := agent.List(ctx)
	if err != nil {
		return false
	}
	for _, p := range procs {
		if p.ProcessID == pid {
			return p.State == compute.ProcessExited
		}
	}
	return false
}

// hangUp sends SIGHUP to a shell that is being left, even after ctx ended.
func hangUp(ctx context.Context, agent *agentclient.Client, pid string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = agent.Signal(ctx, pid, "HUP")
}

// termSize returns the size of the terminal behind v, or 24x80.
func termSize(v any) compute.TerminalSize {
	if fd, ok := fdOf(v); ok {
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			return compute.TerminalSize{Rows: uint32(h), Cols: uint32(w)}
		}
	}
	return compute.TerminalSize{Rows: 24, Cols: 80}
}

// termName is the terminal type given to PTY processes.
func termName() string {
	if t := os.Getenv("TERM"); t != "" && t != "dumb" {
		return t
	}
	return "xterm-256color"
}
