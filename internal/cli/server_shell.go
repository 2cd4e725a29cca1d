package cli

// `harness sandbox shell` (and `exec --tty`) against a service: the
// bidirectional OpenTerminal stream, the local terminal in raw mode.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// terminalStream is the client side of OpenTerminal.
type terminalStream = connect.BidiStreamForClient[harnessv1.OpenTerminalRequest, harnessv1.OpenTerminalResponse]

// termSender serializes the sends of the input and resize goroutines (a
// stream's Send is not safe for concurrent use).
type termSender struct {
	mu     sync.Mutex
	stream *terminalStream
}

func (t *termSender) send(m *harnessv1.OpenTerminalRequest) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stream.Send(m)
}

// serverTerminal runs argv (a login shell when empty) on a PTY in sandbox
// id. With raw, stdin must be a terminal: it is put in raw mode and its
// bytes and window resizes are forwarded; without, only output comes back.
func serverTerminal(cmd *cobra.Command, c *serverConn, id string, argv []string, raw bool) error {
	in, out := cmd.InOrStdin(), cmd.OutOrStdout()
	inFd, isTerm := fdOf(in)
	if raw && !isTerm {
		return usageErr(compute.ErrFailedPrecondition,
			"shell needs an interactive terminal, and stdin is not one (to run a command: harness sandbox exec %s -- CMD)", id)
	}
	var sizeOf any = out
	if _, ok := fdOf(out); !ok {
		sizeOf = in
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	stream := c.sandboxes.OpenTerminal(ctx)
	size := termSize(sizeOf)
	start := &harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Start{Start: &harnessv1.TerminalStart{
		SandboxId: id, Command: argv, Cols: size.Cols, Rows: size.Rows}}}
	if err := stream.Send(start); err != nil && !errors.Is(err, io.EOF) {
		return c.serverErr(id, err)
	}
	if raw {
		old, err := term.MakeRaw(inFd)
		if err != nil {
			_ = stream.CloseRequest()
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		// Restore the terminal before anything else is printed.
		defer func() { _ = term.Restore(inFd, old) }()
		ts := &termSender{stream: stream}
		go forwardTerminalInput(ctx, ts, in)
		go forwardResizes(ctx, ts, sizeOf)
	}
	exit, err := receiveTerminal(stream, out)
	_ = stream.CloseResponse()
	if err != nil {
		if ctx.Err() != nil || cmd.Context().Err() != nil {
			return exitError{code: 130, msg: fmt.Sprintf("interrupted; the terminal was hung up (%v)", context.Cause(cmd.Context()))}
		}
		return c.serverErr(id, err)
	}
	return exitWith(exit)
}

// receiveTerminal writes the terminal's output until its exit.
func receiveTerminal(stream *terminalStream, out io.Writer) (*compute.ExitStatus, error) {
	for {
		m, err := stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errors.New("the terminal ended before its process's exit")
			}
			return nil, err
		}
		if x := m.GetExited(); x != nil {
			return &compute.ExitStatus{ExitCode: int(x.GetExitCode()), Signal: x.GetSignal()}, nil
		}
		if _, err := out.Write(m.GetOutput()); err != nil {
			return nil, fmt.Errorf("write output: %w", err)
		}
	}
}

// forwardTerminalInput sends what is typed. A read from a terminal cannot
// be interrupted, so this goroutine is left blocked when the shell exits;
// the command ends right after.
func forwardTerminalInput(ctx context.Context, ts *termSender, in io.Reader) {
	buf := make([]byte, stdinChunk)
	for ctx.Err() == nil {
		n, err := in.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			if ts.send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Stdin{Stdin: data}}) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forwardResizes sends the window's size when it changes (a lost resize
// only misdraws).
func forwardResizes(ctx context.Context, ts *termSender, sizeOf any) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
			s := termSize(sizeOf)
			_ = ts.send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Resize{Resize: &harnessv1.TerminalSize{Cols: s.Cols, Rows: s.Rows}}})
		}
	}
}
