package local

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// startLogMax bounds the start-up output a launch keeps: the first bytes
// the sandbox (bwrap, runsc or the daemon itself) writes, which is where
// a refusal to start is explained.
const startLogMax = 4 << 10

// startLog keeps the first startLogMax bytes a sandbox writes to its
// stdout and stderr while it starts, so that a sandbox that exits before
// serving says why (ErrExitedAtStart carries the text).
//
// The sandbox's stdout and stderr are one end of a unix datagram
// socketpair, not a pipe: a sandbox may outlive the harness (to be
// resumed by the next one), and a Go program (the daemon, runsc) that
// writes to a pipe nobody reads any more dies of SIGPIPE, while a write
// to a datagram socket whose peer is gone only fails (ECONNREFUSED,
// then ENOTCONN), as good as /dev/null. Once the daemon serves, the
// launcher stops reading and closes its end when nobody asked for the
// daemon's log (Options.Stderr nil); otherwise it goes on copying the
// log there until the daemon exits. Either way memory stays bounded and
// the reading goroutine and descriptor end with stop.
type startLog struct {
	conn   *net.UnixConn
	fwd    io.Writer // Options.Stderr: gets everything read; nil: nothing
	secret string    // never shown (the token; it is not written, but to be sure)

	mu      sync.Mutex
	head    []byte
	dropped int64 // bytes read past head

	stopOnce sync.Once
	done     chan struct{}
}

// newStartLog starts reading a fresh socketpair; the returned file is the
// sandbox's end (its stdout and stderr), which the caller closes once the
// sandbox has started.
func newStartLog(fwd io.Writer, secret string) (*startLog, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox output socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "sandbox-output")
	// Non-blocking for the reading end only (O_NONBLOCK belongs to each
	// end's open file, so the sandbox's stays blocking): net polls it, so a
	// deadline can end a read.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		child.Close()
		return nil, nil, fmt.Errorf("sandbox output socket: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "sandbox-output-reader")
	c, err := net.FileConn(f)
	f.Close() // FileConn holds its own copy
	if err != nil {
		child.Close()
		return nil, nil, fmt.Errorf("sandbox output socket: %w", err)
	}
	conn, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		child.Close()
		return nil, nil, fmt.Errorf("sandbox output socket: a %T, not a unix socket", c)
	}
	l := &startLog{conn: conn, fwd: fwd, secret: secret, done: make(chan struct{})}
	go l.run()
	return l, child, nil
}

// run reads until stop, then takes what is still queued (everything a
// process wrote before it exited is) and closes the reading end.
func (l *startLog) run() {
	defer close(l.done)
	defer l.conn.Close()
	// One datagram per read: large enough for any line a zap logger,
	// bwrap or runsc writes, so none is cut.
	buf := make([]byte, 64<<10)
	for {
		n, err := l.conn.Read(buf)
		l.keep(buf[:n])
		if err != nil {
			break // stop's deadline (or a broken socket: nothing more to read)
		}
	}
	if err := l.conn.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	rc, err := l.conn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		for {
			n, err := unix.Read(int(fd), buf)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return true // EAGAIN: drained
			}
			l.keep(buf[:n])
		}
	})
}

func (l *startLog) keep(p []byte) {
	if len(p) == 0 {
		return
	}
	if l.fwd != nil {
		_, _ = l.fwd.Write(p)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := min(len(p), startLogMax-len(l.head))
	l.head = append(l.head, p[:n]...)
	l.dropped += int64(len(p) - n)
}

// stop ends the reading (after taking what is queued) and closes the
// launcher's end; it returns once the reader is gone. Idempotent.
func (l *startLog) stop() {
	l.stopOnce.Do(func() { _ = l.conn.SetReadDeadline(time.Now()) })
	<-l.done
}

// text is the kept output, trimmed, for an error message: "" when the
// sandbox wrote nothing.
func (l *startLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSpace(strings.ToValidUTF8(string(l.head), "?"))
	if l.secret != "" {
		s = strings.ReplaceAll(s, l.secret, "[token]")
	}
	if l.dropped > 0 {
		s += fmt.Sprintf(" [%d more bytes not kept]", l.dropped)
	}
	return s
}

// describe is the kept output as the end of an ErrExitedAtStart message.
func (l *startLog) describe() string {
	if t := l.text(); t != "" {
		return "; its output: " + t
	}
	return "; it wrote nothing"
}
