package compute

import (
	"context"
	"io"
	"net"
)

// The sandbox's operations in Go types. Each delegates to the session's
// daemon client (Agent), which reconnects by itself; errors are Go errors
// from the one registry (errors.Is on ErrNotFound, ErrPathEscape, ...;
// Retryable). Paths are workspace-relative, or absolute inside the
// workspace or a grant; a path that escapes is refused with nothing
// written.

// Processes.

// Exec runs a process to completion. With fn nil the output is collected
// in the result (for short commands); otherwise each event (the start,
// output, the exit) is delivered to fn as it comes and not kept. The
// process is killed if ctx ends first. A transport failure after the
// process started is not retried (the command may have run).
func (s *Session) Exec(ctx context.Context, spec ProcessSpec, opts ExecOptions, fn func(*ExecEvent) error) (*ExecResult, error) {
	return s.Agent().Exec(ctx, spec, opts, fn)
}

// StartProcess starts a process and returns at once; read its output with
// ReadOutput or Follow, and its end with Wait. (Start, without a process,
// makes the session's workspace ready.) A start is retried across a
// dropped connection without ever running twice (opts.RequestID).
func (s *Session) StartProcess(ctx context.Context, spec ProcessSpec, opts StartOptions) (*StartResult, error) {
	return s.Agent().Start(ctx, spec, opts)
}

// ReadOutput reads a process's output from opts.Cursor, waiting up to
// opts.YieldTime for some. A harness that comes back reads from its
// cursor; output the daemon's bounded buffer dropped meanwhile is counted
// in DroppedBytes.
func (s *Session) ReadOutput(ctx context.Context, processID string, opts ReadOutputOptions) (*Output, error) {
	return s.Agent().ReadOutput(ctx, processID, opts)
}

// Follow streams a process's output from opts.Cursor to fn until it exits,
// and returns its exit status, re-attaching from its cursor when the
// connection drops. The Output passed to fn and its data are valid only
// until fn returns (the buffers are reused): copy what you keep.
func (s *Session) Follow(ctx context.Context, processID string, opts FollowOptions, fn func(*Output) error) (*ExitStatus, error) {
	return s.Agent().Follow(ctx, processID, opts, fn)
}

// WriteStdin writes data to a process's stdin at offset (the stdin offset
// of data's first byte) and returns the offset after it; a resent write
// is never applied twice.
func (s *Session) WriteStdin(ctx context.Context, processID string, offset int64, data []byte) (nextOffset int64, err error) {
	return s.Agent().WriteStdin(ctx, processID, offset, data)
}

// CloseStdin closes a process's stdin.
func (s *Session) CloseStdin(ctx context.Context, processID string) error {
	return s.Agent().CloseStdin(ctx, processID)
}

// Signal sends a signal by name (TERM, KILL, INT, ...) to a process's
// whole process group.
func (s *Session) Signal(ctx context.Context, processID, signal string) error {
	return s.Agent().Signal(ctx, processID, signal)
}

// Resize sets a TTY process's terminal size.
func (s *Session) Resize(ctx context.Context, processID string, size TerminalSize) error {
	return s.Agent().Resize(ctx, processID, size)
}

// Wait blocks until a process exits and returns how it ended.
func (s *Session) Wait(ctx context.Context, processID string) (*ExitStatus, error) {
	return s.Agent().Wait(ctx, processID)
}

// ListProcesses returns the processes the daemon keeps (running, or
// exited and not yet reaped).
func (s *Session) ListProcesses(ctx context.Context) ([]ProcessInfo, error) {
	return s.Agent().List(ctx)
}

// Files.

// ReadFile streams a file (from opts.Offset, at most opts.Limit bytes when
// set) into w and returns the file's info.
func (s *Session) ReadFile(ctx context.Context, path string, opts ReadFileOptions, w io.Writer) (*FileInfo, error) {
	return s.Agent().ReadFile(ctx, path, opts, w)
}

// WriteFile streams r into the file at path, atomically: the file is
// replaced only once every byte arrived, so an interrupted write leaves
// the old file as it was.
func (s *Session) WriteFile(ctx context.Context, path string, opts WriteFileOptions, r io.Reader) (*WriteFileResult, error) {
	return s.Agent().WriteFile(ctx, path, opts, r)
}

// Stat describes a path without following a final symlink.
func (s *Session) Stat(ctx context.Context, path string, opts StatOptions) (*FileInfo, error) {
	return s.Agent().Stat(ctx, path, opts)
}

// ListDir returns one page of a directory listing (the first, or the one
// opts.PageToken names).
func (s *Session) ListDir(ctx context.Context, path string, opts ListDirOptions) (*DirPage, error) {
	return s.Agent().ListDir(ctx, path, opts)
}

// MakeDir creates a directory and returns its info.
func (s *Session) MakeDir(ctx context.Context, path string, opts MakeDirOptions) (*FileInfo, error) {
	return s.Agent().MakeDir(ctx, path, opts)
}

// Remove removes a path (a non-empty directory only when opts.Recursive).
func (s *Session) Remove(ctx context.Context, path string, opts RemoveOptions) error {
	return s.Agent().Remove(ctx, path, opts)
}

// Rename moves a path (over an existing one only when opts.Overwrite).
func (s *Session) Rename(ctx context.Context, from, to string, opts RenameOptions) error {
	return s.Agent().Rename(ctx, from, to, opts)
}

// Patches.

// ApplyPatch applies a V4A patch (the whole `*** Begin Patch` ... `***
// End Patch` text) all or nothing. A patch that does not apply is an
// ErrPatchRejected error (ErrInvalidArgument when malformed), and
// PatchRejection(err) says where and why.
func (s *Session) ApplyPatch(ctx context.Context, patch string, opts ApplyPatchOptions) (*PatchResult, error) {
	return s.Agent().ApplyPatch(ctx, patch, opts)
}

// ApplyOperations applies a patch in the per-file operation form, all or
// nothing, as ApplyPatch does.
func (s *Session) ApplyOperations(ctx context.Context, ops []PatchOperation, opts ApplyPatchOptions) (*PatchResult, error) {
	return s.Agent().ApplyOperations(ctx, ops, opts)
}

// Ports.

// Forward opens a TCP connection to 127.0.0.1:port inside the sandbox,
// tunnelled over the daemon's authenticated channel (no published port).
// Nothing listening there is a retryable ErrUnavailable error.
func (s *Session) Forward(ctx context.Context, port int) (net.Conn, error) {
	return s.Agent().Forward(ctx, port)
}

// ListenLocal listens on a free port of 127.0.0.1 and forwards every
// connection it accepts to port inside the sandbox, until ctx ends or the
// listener is closed.
func (s *Session) ListenLocal(ctx context.Context, port int) (*PortListener, error) {
	return s.Agent().ListenLocal(ctx, port)
}
