package process

import (
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// outputReadSize is the read size of the output pumps: a full default pipe.
const outputReadSize = 64 << 10

// proc is one started process. Fields above mu are immutable after Start.
type proc struct {
	id        string
	requestID string
	opts      StartOptions // as requested, to recognise a retried Start
	argv      []string
	dir       string
	user      string
	tty       bool
	startedAt time.Time
	pid       int // also the process group id (and session id with a TTY)
	master    *os.File
	outputs   []*os.File    // read ends of the output pipes, or the PTY master
	drained   chan struct{} // closed when every output reached end of file
	// leaderReaped is closed when the group leader's status was collected.
	leaderReaped chan struct{}
	exited       chan struct{} // closed once exit is set and the Manager's bookkeeping done

	mu           sync.Mutex
	out          *outputLog
	changed      chan struct{} // closed and cleared on every change; nil when nobody waits
	leaderExited bool
	leaderStatus unix.WaitStatus
	timedOut     bool
	timeout      *time.Timer
	exit         *ExitStatus
	forget       *time.Timer

	stdinMu       sync.Mutex
	stdin         *os.File // pipe write end or PTY master; nil when stdin is /dev/null
	stdinAccepted int64
	stdinClosed   bool
}

// info snapshots the process for callers.
func (p *proc) info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := Info{
		ID: p.id, RequestID: p.requestID, PID: p.pid, Argv: slices.Clone(p.argv), Dir: p.dir,
		User: p.user, TTY: p.tty, StartedAt: p.startedAt, Running: p.exit == nil,
	}
	if p.exit != nil {
		e := *p.exit
		in.Exit = &e
	}
	return in
}

// waitChanged returns a channel closed at the next change of output or
// state. p.mu must be held.
func (p *proc) waitChanged() <-chan struct{} {
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

// notify wakes the waiters of waitChanged. p.mu must be held.
func (p *proc) notify() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// pump copies one output into the log until end of file. After the exit
// was reported the log is sealed and further bytes are read and discarded,
// so a background job still holding the output is not killed by SIGPIPE.
func (p *proc) pump(f *os.File, s Stream, done func()) {
	defer done()
	defer f.Close()
	buf := make([]byte, outputReadSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.out.append(s, buf[:n]) {
				p.notify()
			}
			p.mu.Unlock()
		}
		if err != nil {
			// io.EOF for a pipe; EIO for a PTY whose slave side is closed;
			// os.ErrClosed when Shutdown or Start's cleanup closed it.
			return
		}
	}
}

// leaderDone records the group leader's wait status. It runs on the reaper
// goroutine and must not block.
func (p *proc) leaderDone(ws unix.WaitStatus) {
	p.mu.Lock()
	p.leaderExited = true
	p.leaderStatus = ws
	if p.timeout != nil {
		p.timeout.Stop()
	}
	p.mu.Unlock()
	close(p.leaderReaped)
}

// awaitDrain waits, once the leader was reaped, until the output reached
// end of file or grace passed.
func (p *proc) awaitDrain(grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.drained:
	case <-t.C:
	}
}

// finish sets the final exit status, seals the output and closes stdin.
func (p *proc) finish(now time.Time) ExitStatus {
	p.mu.Lock()
	ws := p.leaderStatus
	e := ExitStatus{TimedOut: p.timedOut, ExitedAt: now}
	switch {
	case ws.Signaled():
		e.Signal = unix.SignalName(ws.Signal())
		e.Code = 128 + int(ws.Signal())
	default:
		e.Code = ws.ExitStatus()
	}
	p.exit = &e
	p.out.seal()
	p.notify()
	p.mu.Unlock()

	// Not under stdinMu: a write blocked on a full pipe must not delay the
	// exit report; closing the file interrupts it.
	if p.stdin != nil && p.stdin != p.master {
		p.stdin.Close()
	}
	return e
}

// exitStatus returns the exit status, or nil while running.
func (p *proc) exitStatus() *ExitStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil {
		return nil
	}
	e := *p.exit
	return &e
}

// closeOutputs stops the output pumps by closing what they read.
func (p *proc) closeOutputs() {
	for _, f := range p.outputs {
		f.Close()
	}
}
