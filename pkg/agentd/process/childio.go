package process

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// outputPipeSize is the kernel buffer requested for the output pipes of a
// chatty process (see proc.pump).
const outputPipeSize = 256 << 10

// childIO holds the descriptors of a process being started: the child's
// ends (raw, blocking, passed to ForkExec and closed in the parent right
// after) and the parent's ends (non-blocking *os.File on the runtime
// poller, so Close interrupts a blocked Read or Write).
type childIO struct {
	files      []uintptr // the child's fds 0, 1, 2
	childFds   []int     // to close in the parent after fork
	childFiles []*os.File
	stdin      *os.File // parent's stdin writer (pipe or PTY master), nil for /dev/null
	master     *os.File // PTY master, nil in pipe mode
	outputs    []*os.File
	streams    []Stream
}

func (c *childIO) closeChildEnds() {
	for _, fd := range c.childFds {
		unix.Close(fd)
	}
	for _, f := range c.childFiles {
		f.Close()
	}
	c.childFds, c.childFiles = nil, nil
}

func (c *childIO) closeParentEnds() {
	if c.stdin != nil && c.stdin != c.master {
		c.stdin.Close()
	}
	for _, f := range c.outputs {
		f.Close()
	}
}

func (c *childIO) closeAll() {
	c.closeChildEnds()
	c.closeParentEnds()
}

func resourceErr(what string, err error) error {
	return errkind.MarkRetryable(errkind.Errorf(errkind.ErrResourceExhausted, "%s: %v", what, err))
}

// pipe returns a close-on-exec pipe with the parent's end as a non-blocking
// *os.File: parentReads selects which end that is.
func pipe(name string, parentReads bool) (parent *os.File, child int, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, -1, resourceErr("create "+name+" pipe", err)
	}
	p, c := fds[1], fds[0]
	if parentReads {
		p, c = fds[0], fds[1]
	}
	// The child's end blocks, as a program expects of its stdio. A pipe
	// has no other status flag to keep, so one F_SETFL does it.
	if _, err := unix.FcntlInt(uintptr(c), unix.F_SETFL, 0); err != nil {
		unix.Close(p)
		unix.Close(c)
		return nil, -1, fmt.Errorf("%w: %s pipe: %v", errkind.ErrInternal, name, err)
	}
	return os.NewFile(uintptr(p), name), c, nil
}

// openPipes prepares pipe-mode I/O: stdout and stderr pipes, and a stdin
// pipe or /dev/null (devNull, when not negative, is an open read-only
// /dev/null that stays open).
func openPipes(withStdin bool, devNull int) (_ *childIO, err error) {
	c := &childIO{}
	defer func() {
		if err != nil {
			c.closeAll()
		}
	}()
	in := devNull
	switch {
	case withStdin:
		var w *os.File
		if w, in, err = pipe("stdin", false); err != nil {
			return nil, err
		}
		c.stdin = w
		c.childFds = append(c.childFds, in)
	case in < 0:
		if in, err = unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return nil, resourceErr("open "+os.DevNull, err)
		}
		c.childFds = append(c.childFds, in)
	}
	c.files = []uintptr{uintptr(in)}
	for _, s := range []Stream{Stdout, Stderr} {
		r, w, err := pipe(s.String(), true)
		if err != nil {
			return nil, err
		}
		c.outputs, c.streams = append(c.outputs, r), append(c.streams, s)
		c.childFds = append(c.childFds, w)
		c.files = append(c.files, uintptr(w))
	}
	return c, nil
}

// openPTY prepares TTY-mode I/O: a pseudo-terminal of rows x cols (as
// terminalSize returns them) whose slave is the child's fds 0-2 and
// controlling terminal.
func openPTY(rows, cols uint16) (_ *childIO, err error) {
	master, tty, err := pty.Open()
	if err != nil {
		return nil, resourceErr("open a pseudo-terminal", err)
	}
	c := &childIO{master: master, stdin: master, outputs: []*os.File{master}, streams: []Stream{PTY}, childFiles: []*os.File{tty}}
	if err := setWinsize(master, rows, cols); err != nil {
		c.closeAll()
		return nil, fmt.Errorf("%w: set terminal size: %v", errkind.ErrInternal, err)
	}
	// Fd puts the slave back into blocking mode, which is what the child
	// needs (os.OpenFile made its file description non-blocking).
	fd := tty.Fd()
	c.files = []uintptr{fd, fd, fd}
	return c, nil
}

// setWinsize sets a PTY's size without taking the master out of the
// runtime poller (pty.Setsize would, through File.Fd).
func setWinsize(master *os.File, rows, cols uint16) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}
