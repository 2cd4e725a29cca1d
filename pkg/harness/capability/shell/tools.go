package shell

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// Messages of the reference contract.
const (
	msgSessionNotFound = "write_stdin failed: PTY session not found: %d"
	msgNoStdin         = "stdin is not available for this process. Start the command with `tty=true` in `exec_command` before using `write_stdin`."
)

// execTool is exec_command.
type execTool struct{ s *Shell }

// Definition returns exec_command's definition.
func (t execTool) Definition() model.Tool { return t.s.execDefinition() }

// Call runs exec_command.
func (t execTool) Call(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	return t.s.execCommand(ctx, call, input)
}

// writeTool is write_stdin.
type writeTool struct{ s *Shell }

// Definition returns write_stdin's definition.
func (t writeTool) Definition() model.Tool { return t.s.writeDefinition() }

// Call runs write_stdin.
func (t writeTool) Call(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	return t.s.writeStdin(ctx, call, input)
}

// update is what one call observed of a process.
type update struct {
	out      rendered
	exit     *agentclient.ExitStatus // nil while the process runs
	session  int                     // the session ID while it runs
	notFound bool                    // the daemon no longer knows the process
}

// execCommand starts a command and waits up to the yield time for it.
func (s *Shell) execCommand(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	start := time.Now()
	var a execArgs
	if err := decodeArgs(input, &a); err != nil {
		return failure(ExecCommandName, err.Error()), nil
	}
	if a.Cmd == "" {
		return failure(ExecCommandName, "cmd must not be empty"), nil
	}
	yield, err := yieldArg("yield_time_ms", a.YieldTimeMS, s.opts.ExecYield)
	if err != nil {
		return failure(ExecCommandName, err.Error()), nil
	}
	maxTokens, err := maxTokensArg(a.MaxOutputTokens)
	if err != nil {
		return failure(ExecCommandName, err.Error()), nil
	}
	if call.Agent == nil {
		return failure(ExecCommandName, "this run has no sandbox to run commands in"), nil
	}
	cwd, err := resolveWorkdir(call.Workdir, a.Workdir)
	if err != nil {
		return failure(ExecCommandName, err.Error()), nil
	}
	spec := agentclient.ProcessSpec{
		Command: a.Cmd,
		Shell:   deref(a.Shell),
		Login:   a.Login == nil || *a.Login,
		Cwd:     cwd,
		User:    call.RunAs,
		Tty:     a.TTY != nil && *a.TTY,
	}
	log := logger(call).With(zap.String("tool", ExecCommandName), zap.String("call_id", call.CallID))

	p, err := s.reserve(ctx, call, spec.Tty)
	if err != nil {
		return tool.Result{}, err
	}
	defer p.unlock()
	resp, err := call.Agent.Start(ctx, spec, agentclient.StartOptions{})
	if err != nil {
		s.remove(p)
		if msg, ok := startFailure(err, a.Workdir, spec); ok {
			return failure(ExecCommandName, msg), nil
		}
		return tool.Result{}, fmt.Errorf("shell: exec_command: start: %w", err)
	}
	pid := resp.Process.ProcessID
	if !s.started(p, pid) {
		_ = killProcess(context.WithoutCancel(ctx), call.Agent, pid)
		return tool.Result{}, errClosed
	}
	log.Debug("command started", zap.String("process_id", pid), zap.Int("session_id", p.id), zap.Bool("tty", spec.Tty))

	u, err := s.collect(ctx, call, p, time.Now().Add(execWait(yield)), maxTokens)
	if err != nil {
		return tool.Result{}, fmt.Errorf("shell: exec_command: read output of session %d: %w", p.id, err)
	}
	if u.notFound {
		return failure(ExecCommandName, "the sandbox lost track of the command before it could be read"), nil
	}
	return tool.Result{Output: s.format(start, u)}, nil
}

// writeStdin writes input to a running session (or polls it) and returns
// the output since the last call.
func (s *Shell) writeStdin(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	start := time.Now()
	var a writeArgs
	if err := decodeArgs(input, &a); err != nil {
		return failure(WriteStdinName, err.Error()), nil
	}
	if a.SessionID == nil {
		return failure(WriteStdinName, "session_id is required"), nil
	}
	yield, err := yieldArg("yield_time_ms", a.YieldTimeMS, s.opts.WriteYield)
	if err != nil {
		return failure(WriteStdinName, err.Error()), nil
	}
	maxTokens, err := maxTokensArg(a.MaxOutputTokens)
	if err != nil {
		return failure(WriteStdinName, err.Error()), nil
	}
	id := int(*a.SessionID)
	chars := deref(a.Chars)

	notFound := func() tool.Result {
		return tool.Result{Output: s.format(start, update{
			out:  rendered{text: fmt.Sprintf(msgSessionNotFound, id)},
			exit: &agentclient.ExitStatus{ExitCode: 1},
		}), IsError: true}
	}
	p := s.lookup(id)
	if p == nil {
		return notFound(), nil
	}
	if err := p.lock(ctx); err != nil {
		return tool.Result{}, fmt.Errorf("shell: write_stdin: wait for session %d: %w", id, err)
	}
	defer p.unlock()
	if s.isGone(p) {
		return notFound(), nil
	}
	s.useAgent(p, call.Agent)

	wait := writeWait(yield, chars != "", s.pollMin)
	if chars != "" {
		if !p.tty {
			return tool.Result{Output: s.format(start, update{
				out:  rendered{text: msgNoStdin},
				exit: &agentclient.ExitStatus{ExitCode: 1},
			}), IsError: true}, nil
		}
		if err := s.write(ctx, p, []byte(chars)); err != nil {
			if errors.Is(err, errkind.ErrNotFound) {
				s.remove(p)
				return notFound(), nil
			}
			return tool.Result{}, fmt.Errorf("shell: write_stdin: session %d: %w", id, err)
		}
	}

	u, err := s.collect(ctx, call, p, time.Now().Add(wait), maxTokens)
	if err != nil {
		return tool.Result{}, fmt.Errorf("shell: write_stdin: read output of session %d: %w", id, err)
	}
	if u.notFound {
		return notFound(), nil
	}
	s.touch(p)
	return tool.Result{Output: s.format(start, u)}, nil
}

// write writes data to p's terminal at p's stdin offset, so a write the
// client retries after a dropped connection is applied once. A process
// that stopped reading (it exited) is not an error: the output shows it.
func (s *Shell) write(ctx context.Context, p *proc, data []byte) error {
	if p.stdinUnknown {
		// A failed write may have been partly applied: ask where stdin is
		// (an empty write at offset 0 returns the daemon's offset).
		next, err := p.agent.WriteStdin(ctx, p.pid, 0, nil)
		if err != nil {
			if errors.Is(err, errkind.ErrFailedPrecondition) {
				return nil
			}
			return err
		}
		p.stdin, p.stdinUnknown = next, false
	}
	next, err := p.agent.WriteStdin(ctx, p.pid, p.stdin, data)
	switch {
	case err == nil:
		p.stdin = next
		return nil
	case errors.Is(err, errkind.ErrFailedPrecondition):
		p.stdinUnknown = true
		return nil
	}
	p.stdinUnknown = true
	return err
}

// collect reads p's output from its cursor until the process exits or the
// deadline passes, passing it to call.Emit as it comes, and renders it.
// Output stays in the daemon until read, so output produced between calls
// is returned by the next one; bytes the daemon had to drop are reported.
//
// It is one round trip however the output comes: an Attach stream (Follow)
// that ends with the exit or is cancelled at the deadline. Cancelling it
// neither kills nor holds back the process (the daemon's flow control
// holds a process back only for a follower still attached), and output
// the stream carried but was not read by then is read again by the next
// call, from the cursor.
func (s *Shell) collect(ctx context.Context, call tool.Context, p *proc, deadline time.Time, maxTokens int) (update, error) {
	c := newCollector(s.opts.MaxOutputBytes)
	exit, err := s.follow(ctx, p, deadline, func(o *agentclient.Output) {
		if n := o.DroppedBytes; n > 0 {
			c.add([]byte(fmt.Sprintf("\n[%d bytes of output were lost: the sandbox's output buffer overflowed before they were read]\n", n)))
		}
		for _, ch := range o.Chunks {
			c.add(ch.Data)
			s.emit(call, p, ch)
		}
		p.cursor = o.NextCursor
	})
	if err != nil {
		if errors.Is(err, errkind.ErrNotFound) {
			s.remove(p)
			return update{notFound: true}, nil
		}
		return update{}, err
	}
	u := update{exit: exit}
	if exit != nil {
		s.remove(p)
	} else {
		p.cursor -= int64(c.unreadIncompleteRune())
		u.session = p.id
	}
	u.out = render(c, maxTokens, s.opts.EstimateTokens)
	return u, nil
}

// follow passes p's output from its cursor to take, whose argument and
// data are valid only during the call, until the process exits (its exit
// status is returned) or the deadline passes (nil, nil: it runs on). An
// error of ctx (the caller's) is returned as such.
func (s *Shell) follow(ctx context.Context, p *proc, deadline time.Time, take func(*agentclient.Output)) (*agentclient.ExitStatus, error) {
	if !time.Now().Before(deadline) {
		// No time left to wait in: take what is there.
		o, err := p.agent.ReadOutput(ctx, p.pid, agentclient.ReadOutputOptions{Cursor: p.cursor})
		if err != nil {
			return nil, err
		}
		take(o)
		return o.Exit, nil
	}
	window, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	exit, err := p.agent.Follow(window, p.pid, agentclient.FollowOptions{Cursor: p.cursor}, func(o *agentclient.Output) error {
		take(o)
		return nil
	})
	// The yield time passed. The daemon may end the stream first (its end
	// of the deadline: gRPC sends it along), before this side's timer
	// has cancelled window: the clock says so then.
	if err != nil && ctx.Err() == nil && (window.Err() != nil || !time.Now().Before(deadline)) {
		return nil, nil
	}
	return exit, err
}

// emit passes the part of ch not emitted before to call.Emit.
func (s *Shell) emit(call tool.Context, p *proc, ch agentclient.OutputChunk) {
	data := ch.Data
	end := ch.Offset + int64(len(data))
	if end <= p.emitted {
		return
	}
	if skip := p.emitted - ch.Offset; skip > 0 {
		data = data[skip:]
	}
	p.emitted = end
	if call.Emit != nil && len(data) > 0 {
		call.Emit(tool.Progress{CallID: call.CallID, Output: append([]byte(nil), data...)})
	}
}

// format builds the text the model sees: the reference's header lines, then
// the output.
func (s *Shell) format(start time.Time, u update) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Chunk ID: %s\n", s.chunkID())
	fmt.Fprintf(&sb, "Wall time: %.4f seconds\n", s.elapsed(start).Seconds())
	if u.exit != nil {
		fmt.Fprintf(&sb, "Process exited with code %d\n", u.exit.ExitCode)
	} else {
		fmt.Fprintf(&sb, "Process running with session ID %d\n", u.session)
	}
	if u.out.originalTokens > 0 {
		fmt.Fprintf(&sb, "Original token count: %d\n", u.out.originalTokens)
	}
	sb.WriteString("Output:\n")
	sb.WriteString(u.out.text)
	return sb.String()
}

// failure is a result for a call that could not run.
func failure(toolName, msg string) tool.Result {
	return tool.Result{Output: toolName + " failed: " + msg, IsError: true}
}

// resolveWorkdir returns the daemon cwd for the model's workdir: the run's
// working directory when none is given, the model's path resolved against
// it when relative, the path itself when absolute (the daemon confines it).
func resolveWorkdir(runDir string, workdir *string) (string, error) {
	w := strings.TrimSpace(deref(workdir))
	if w == "" {
		return runDir, nil
	}
	if strings.IndexByte(w, 0) >= 0 {
		return "", errors.New("workdir contains a NUL byte")
	}
	w = strings.ReplaceAll(w, `\`, "/")
	if path.IsAbs(w) {
		return path.Clean(w), nil
	}
	if runDir == "" {
		return path.Clean(w), nil
	}
	return path.Join(runDir, w), nil
}

// startFailure turns a failed start into the message the model sees. It
// never passes on the daemon's own text, which may name paths on the
// daemon's side; ok is false for failures of the harness or the sandbox
// itself (unreachable, canceled, internal), which end the call with an
// error instead.
func startFailure(err error, workdir *string, spec agentclient.ProcessSpec) (string, bool) {
	dir := strconv.Quote(deref(workdir))
	if deref(workdir) == "" {
		dir = "the working directory"
	} else {
		dir = "workdir " + dir
	}
	shell := spec.Shell
	if shell == "" {
		shell = "the default shell"
	} else {
		shell = "shell " + strconv.Quote(shell)
	}
	// The one path of a start is its working directory: a failure that
	// carries a path concerns the directory, one without concerns the
	// program (see ErrorDetail.path).
	var pe *errkind.PathError
	isPath := errors.As(err, &pe)
	switch {
	case errors.Is(err, errkind.ErrUserNotFound):
		return fmt.Sprintf("the user %q that commands run as does not exist in the sandbox", spec.User), true
	case errors.Is(err, errkind.ErrPathEscape):
		return dir + " is outside the workspace", true
	case errors.Is(err, errkind.ErrReadOnly):
		return dir + " is read-only", true
	case isPath && errors.Is(err, errkind.ErrNotFound):
		return dir + " does not exist", true
	case isPath && errors.Is(err, errkind.ErrNotDirectory):
		return dir + " is not a directory", true
	case isPath && errors.Is(err, errkind.ErrPermissionDenied):
		return dir + " cannot be entered by the user commands run as", true
	case isPath && errors.Is(err, errkind.ErrInvalidArgument):
		return dir + " is not a valid path", true
	case errors.Is(err, errkind.ErrNotFound):
		return shell + " does not exist in the sandbox", true
	case errors.Is(err, errkind.ErrPermissionDenied):
		return "permission denied: " + shell + " cannot be run by the user commands run as in this directory", true
	case errors.Is(err, errkind.ErrNotDirectory):
		return shell + " is not a program (a path component is not a directory)", true
	case errors.Is(err, errkind.ErrResourceExhausted):
		return "the sandbox is running as many processes as it allows; wait for some to finish or stop them", true
	case errors.Is(err, errkind.ErrInvalidArgument):
		return "the command cannot be started: its text, shell or environment is invalid (for example too long or containing a NUL byte)", true
	}
	return "", false
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
