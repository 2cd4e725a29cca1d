package process

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// WriteStdin writes data to the process's stdin (the terminal in TTY mode).
// offset is the absolute stdin offset the client believes data starts at:
// bytes before the count already accepted are skipped (a resent write is
// not applied twice) and an offset beyond it is a errkind.ErrConflict.
// It returns the stdin offset after the accepted bytes, also on error, so a
// write cut short by ctx can be resumed from there.
func (m *Manager) WriteStdin(ctx context.Context, id string, offset int64, data []byte) (int64, error) {
	const op = "write_stdin"
	if offset < 0 {
		return 0, procErrf(op, id, errkind.ErrInvalidArgument, "negative stdin offset")
	}
	p, err := m.lookup(op, id)
	if err != nil {
		return 0, err
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	acc := p.stdinAccepted
	if err := p.stdinUsableLocked(); err != nil {
		return acc, procErr(op, id, err)
	}
	if offset > acc {
		return acc, procErrf(op, id, errkind.ErrConflict, "stdin offset %d is past the %d bytes accepted so far", offset, acc)
	}
	skip := acc - offset
	if skip >= int64(len(data)) {
		return acc, nil
	}
	data = data[skip:]

	f := p.stdin
	// Only ctx bounds the write: a deadline copied from ctx could fire
	// before ctx reports it, and an error would then look internal.
	_ = f.SetWriteDeadline(time.Time{})
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = f.SetWriteDeadline(time.Unix(1, 0)) // in the past: interrupts Write
		close(fired)
	})
	n, err := f.Write(data)
	if !stop() {
		<-fired // never leave a stale deadline behind for the next write
	}
	p.stdinAccepted += int64(n)
	acc = p.stdinAccepted
	switch {
	case err == nil:
		return acc, nil
	case ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded):
		return acc, procErr(op, id, ctxErr(ctx))
	case p.exitStatus() != nil:
		return acc, procErrf(op, id, errkind.ErrFailedPrecondition, "the process exited during the write; its stdin is closed")
	case errors.Is(err, syscall.EPIPE), errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EIO):
		return acc, procErrf(op, id, errkind.ErrFailedPrecondition, "the process no longer reads its stdin (closed or exited)")
	}
	return acc, procErrf(op, id, errkind.ErrInternal, "write stdin: %v", err)
}

// stdinUsableLocked says why stdin cannot be written; p.stdinMu held.
func (p *proc) stdinUsableLocked() error {
	switch {
	case p.stdin == nil:
		return errkind.Errorf(errkind.ErrFailedPrecondition, "the process was started without stdin (stdin is /dev/null)")
	case p.exitStatus() != nil:
		return errkind.Errorf(errkind.ErrFailedPrecondition, "the process has exited; its stdin is closed")
	case p.stdinClosed:
		return errkind.Errorf(errkind.ErrFailedPrecondition, "stdin was closed")
	}
	return nil
}

// CloseStdin closes the process's stdin pipe so it reads end of file.
// Closing it twice is not an error. A TTY has no separate stdin: send
// Ctrl-D ("\x04") with WriteStdin instead.
func (m *Manager) CloseStdin(id string) error {
	const op = "close_stdin"
	p, err := m.lookup(op, id)
	if err != nil {
		return err
	}
	if p.tty {
		return procErrf(op, id, errkind.ErrFailedPrecondition, "a terminal has no separate stdin to close; write Ctrl-D (\\x04) instead")
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return procErrf(op, id, errkind.ErrFailedPrecondition, "the process was started without stdin (stdin is /dev/null)")
	}
	if p.stdinClosed || p.exitStatus() != nil {
		return nil
	}
	p.stdinClosed = true
	if err := p.stdin.Close(); err != nil {
		return procErrf(op, id, errkind.ErrInternal, "close stdin: %v", err)
	}
	return nil
}

// Resize sets the terminal size of a TTY process (the kernel then sends
// SIGWINCH to its foreground group). Each dimension must be 1 to
// MaxTerminalDimension (errkind.ErrInvalidArgument otherwise, checked as
// Start checks its size, see terminalSize).
func (m *Manager) Resize(id string, rows, cols uint32) error {
	const op = "resize"
	r, c, err := terminalSize(rows, cols, false)
	if err != nil {
		return procErr(op, id, err)
	}
	p, err := m.lookup(op, id)
	if err != nil {
		return err
	}
	if !p.tty {
		return procErrf(op, id, errkind.ErrFailedPrecondition, "the process has no terminal to resize (it was started without tty)")
	}
	if p.exitStatus() != nil {
		return procErrf(op, id, errkind.ErrFailedPrecondition, "the process has exited")
	}
	if err := setWinsize(p.master, r, c); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return procErrf(op, id, errkind.ErrFailedPrecondition, "the terminal is closed")
		}
		return procErrf(op, id, errkind.ErrInternal, "resize terminal: %v", err)
	}
	return nil
}
