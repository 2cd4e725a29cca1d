package process

import (
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
)

// outputReadSize bounds one read of an output pump: a full output pipe.
const outputReadSize = outputPipeSize

// firstReadSize is the size of a pump's reads before the process printed
// anything: they go through proc.first, so a process that prints nothing
// allocates no ring.
const firstReadSize = 512

// discardReadSize is the read size of a pump discarding output after the
// exit was reported.
const discardReadSize = 32 << 10

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
	pidfd     *os.File      // the leader's pidfd (non-blocking, on the poller); nil when unsupported
	outputs   []*os.File    // read ends of the output pipes, or the PTY master
	streams   []Stream      // what each of outputs carries
	drained   chan struct{} // closed when every output reached end of file
	eofSeen   []atomic.Bool // by output: its end of file was seen (markEOF)
	eofLeft   atomic.Int32  // outputs whose end of file was not seen yet
	// leaderReaped is closed when the group leader's status was collected.
	leaderReaped chan struct{}
	exited       chan struct{} // closed once exit is set and the Manager's bookkeeping done

	stallTimeout time.Duration   // Config.FollowerStallTimeout
	activity     *activity.Clock // Config.Activity; nil: not tracked

	// landMu serializes the pumps' reads into the ring (stdout and stderr
	// share it). It is held only around a non-blocking read, never while a
	// pump waits, and is taken before mu.
	landMu  sync.Mutex
	first   [firstReadSize]byte // landMu; see firstReadSize
	discard []byte              // landMu; lazily allocated, see discardReadSize

	mu           sync.Mutex
	out          *outputLog
	changed      chan struct{} // closed and cleared on every change; nil when nobody waits
	followers    []*follower   // attached readers holding the pumps back
	reserved     *follower     // HoldOutput's follower, until an Attach from 0 adopts it
	space        chan struct{} // closed and cleared when a waiting pump should look again; nil when none waits
	released     bool          // followers no longer hold the pumps back (shutting down)
	relocate     bool          // move the ring to new storage before the next pump read (a stalled follower has bytes lent)
	held         int           // pumps waiting for a follower
	heldSince    time.Time     // when held became positive
	heldTotal    time.Duration // time held was positive, up to heldSince
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

// follower is an attached reader (Attach, Exec). While it is live, the
// pumps do not overwrite output it has not consumed yet.
type follower struct {
	cursor   int64     // output before it was consumed (delivered), or lent out
	progress time.Time // when it attached or last consumed output
	// stalled is set when it held the pumps back without progress for the
	// stall timeout; it then no longer holds them back (and may see
	// Dropped) until it consumes output again.
	stalled bool
	// lent is set while output from cursor on is being delivered straight
	// from the ring (see proc.lend).
	lent bool
}

// addFollower attaches a follower at cursor. The first follower from cursor
// 0 of a process started with HoldOutput takes over the reservation made at
// start, with whatever it holds back.
func (p *proc) addFollower(cursor int64) *follower {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.reserved; f != nil && cursor == 0 {
		p.reserved = nil
		f.progress = time.Now()
		return f
	}
	f := &follower{cursor: cursor, progress: time.Now()}
	p.followers = append(p.followers, f)
	return f
}

// removeFollower detaches f; the pumps no longer wait for it.
func (p *proc) removeFollower(f *follower) {
	p.mu.Lock()
	if i := slices.Index(p.followers, f); i >= 0 {
		p.followers = slices.Delete(p.followers, i, i+1)
	}
	p.wakePumpsLocked()
	p.mu.Unlock()
}

// lentLocked records that f is delivering output from the ring starting at
// from (its cursor, or the oldest retained byte after a drop). A stalled
// follower holds the pumps back again from now on. p.mu must be held.
func (p *proc) lentLocked(f *follower, from int64, now time.Time) {
	f.lent = true
	if from != f.cursor || f.stalled {
		f.cursor, f.progress, f.stalled = from, now, false
		p.wakePumpsLocked()
	}
}

// delivered records that f is done with the output lent to it up to next.
func (p *proc) delivered(f *follower, next int64) {
	p.mu.Lock()
	f.lent = false
	if next != f.cursor || f.stalled {
		f.cursor, f.progress, f.stalled = next, time.Now(), false
		p.wakePumpsLocked()
	}
	p.mu.Unlock()
}

// dropDelivered frees the retained output once f delivered the exit
// (AttachOptions.ReleaseAtExit), unless another follower is attached or
// the HoldOutput reservation is still pending: they keep it. Under p.mu, a
// follower attaching concurrently is either attached first (the output is
// kept for it) or sees it dropped.
func (p *proc) dropDelivered(f *follower) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil || !p.out.sealed || p.reserved != nil {
		return
	}
	for _, g := range p.followers {
		if g != f {
			return
		}
	}
	p.out.drop()
}

// wakePumpsLocked wakes the pumps waiting for room. p.mu must be held.
func (p *proc) wakePumpsLocked() {
	if p.space != nil {
		close(p.space)
		p.space = nil
	}
}

// release stops followers from holding the pumps back (Shutdown).
func (p *proc) release() {
	p.mu.Lock()
	p.released = true
	for _, f := range p.followers {
		p.relocate = p.relocate || f.lent // see stallLocked
	}
	p.wakePumpsLocked()
	p.mu.Unlock()
}

// slowestLocked returns the lowest cursor of the live followers (a cursor
// before the oldest retained byte counts as that byte), or false when no
// live follower holds the pumps back. p.mu must be held.
func (p *proc) slowestLocked() (int64, bool) {
	var cur int64
	found := false
	if p.released || p.out.sealed {
		return 0, false
	}
	for _, f := range p.followers {
		if c := max(f.cursor, p.out.start); !f.stalled && (!found || c < cur) {
			cur, found = c, true
		}
	}
	return cur, found
}

// roomLocked returns how many bytes of stream s the pump may add now
// (at most outputReadSize): without live followers any amount, with them
// as many as evict none of the output the slowest one has not consumed.
// p.mu must be held.
func (p *proc) roomLocked(s Stream) int64 {
	cur, ok := p.slowestLocked()
	if !ok {
		return outputReadSize
	}
	room := min(cur+int64(p.out.max)-p.out.end, outputReadSize)
	if room <= 0 || p.out.appendStart(s, room) > cur {
		return 0 // full, or a new segment would drop the oldest one
	}
	return room
}

// stallLocked marks as stalled the followers at the slowest cursor cur
// that made no progress for the stall timeout since they started holding
// the pump back (at waitStart at the earliest). It reports whether it
// marked any, and otherwise when the next one would stall. p.mu must be
// held.
func (p *proc) stallLocked(cur int64, waitStart, now time.Time) (next time.Time, marked bool) {
	for _, f := range p.followers {
		if f.stalled || max(f.cursor, p.out.start) != cur {
			continue
		}
		due := f.progress
		if due.Before(waitStart) {
			due = waitStart
		}
		due = due.Add(p.stallTimeout)
		if !now.Before(due) {
			f.stalled, marked = true, true
			// It may still be sending bytes lent from the ring, which
			// the pumps may now overwrite: they move the ring to new
			// storage first and leave the old one to it.
			p.relocate = p.relocate || f.lent
		} else if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return next, marked
}

// waitRoom returns once the pump of stream s may add output: at once when
// no live follower is behind, else when the slowest follower consumed
// output, detached or stalled, or flow control was released. While it
// waits the pump does not read, so the pipe fills and the writer blocks.
func (p *proc) waitRoom(s Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.roomLocked(s) > 0 {
		return
	}
	start := time.Now()
	p.holdLocked(start, 1)
	var t *time.Timer
	now := start
	for {
		if p.roomLocked(s) > 0 {
			break
		}
		cur, _ := p.slowestLocked()
		next, marked := p.stallLocked(cur, start, now)
		if marked {
			continue
		}
		if p.space == nil {
			p.space = make(chan struct{})
		}
		space := p.space
		p.mu.Unlock()
		if t == nil {
			t = time.NewTimer(next.Sub(now))
		} else {
			t.Reset(next.Sub(now))
		}
		select {
		case <-space:
		case <-t.C:
		}
		p.mu.Lock()
		now = time.Now()
	}
	if t != nil {
		t.Stop()
	}
	p.holdLocked(time.Now(), -1)
}

// holdLocked counts pumps that wait for a follower (delta +1 or -1) and the
// time any did. p.mu must be held.
func (p *proc) holdLocked(now time.Time, delta int) {
	if p.held == 0 {
		p.heldSince = now
	}
	p.held += delta
	if p.held == 0 {
		p.heldTotal += now.Sub(p.heldSince)
	}
}

// heldTimeLocked is the total time any pump waited for a follower, up to
// now. p.mu must be held.
func (p *proc) heldTimeLocked(now time.Time) time.Duration {
	if p.held > 0 {
		return p.heldTotal + now.Sub(p.heldSince)
	}
	return p.heldTotal
}

// errNoRoom is readOnce's answer when the room was taken meanwhile.
var errNoRoom = errors.New("no room")

// pump copies one output into the log until end of file, reading straight
// into the ring and never overwriting output that a live follower has not
// consumed. After the exit was reported the log is sealed and further bytes
// are read and discarded, so a background job still holding the output is
// not killed by SIGPIPE.
func (p *proc) pump(f *os.File, s Stream, eof, done func()) {
	defer done()
	defer f.Close()
	defer eof() // before closing: the exit report may be waiting for it
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	var total int64
	for {
		p.waitRoom(s)
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = p.readOnce(int(fd), s)
			return rerr != unix.EAGAIN
		}); err != nil {
			return // os.ErrClosed: Shutdown or Start's cleanup closed it
		}
		switch {
		case rerr == errNoRoom, rerr == unix.EINTR:
		case rerr != nil:
			return // EIO for a PTY whose slave side is closed
		case n == 0:
			return // end of file
		}
		if limit := int64(outputPipeSize); total < limit && total+int64(n) >= limit && s != PTY {
			// A chatty process: a larger pipe lets it run further ahead
			// of the pump, with fewer wake-ups on both sides. Best effort
			// (unprivileged pipe quotas may refuse); quiet processes keep
			// the default pipe and save the system call.
			_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, outputPipeSize) })
		}
		total += int64(n)
	}
}

// readOnce does one non-blocking read of the output fd into the ring (or,
// before the first output, into p.first; after the exit into p.discard)
// and records it. It returns 0, nil at end of file.
func (p *proc) readOnce(fd int, s Stream) (int, error) {
	p.landMu.Lock()
	defer p.landMu.Unlock()
	p.mu.Lock()
	if p.relocate {
		// Under landMu: no read into the old storage is in flight.
		p.relocate = false
		if !p.out.sealed && len(p.out.buf) > 0 {
			p.out.resize(len(p.out.buf))
		}
	}
	var dst []byte
	landed := false
	switch room := p.roomLocked(s); {
	case p.out.sealed:
		if p.discard == nil {
			p.discard = make([]byte, discardReadSize)
		}
		dst = p.discard
	case room == 0:
		p.mu.Unlock()
		return 0, errNoRoom
	case len(p.out.buf) == 0:
		dst = p.first[:min(room, firstReadSize)]
	default:
		dst, landed = p.out.landing(int(room)), true
	}
	p.mu.Unlock()
	n, err := unix.Read(fd, dst)
	if n <= 0 {
		if n == 0 && err == nil && p.discard != nil {
			// End of file: this output needs the discard buffer no more.
			// It is not kept for the exit retention (32 KiB for every
			// exited process, 2 MiB over the 64 kept); the other output,
			// if still open, allocates it again.
			p.discard = nil
		}
		return 0, err
	}
	p.activity.Touch() // output written: lock-free, outside p.mu
	p.mu.Lock()
	var ok bool
	if landed {
		ok = p.out.commit(s, n)
	} else {
		ok = p.out.append(s, dst[:n])
	}
	if ok {
		p.notify()
	}
	p.mu.Unlock()
	return n, nil
}

// markEOF records that output i reached its end (or its pump stopped),
// once per output; the last one closes drained. The pump and the exit
// watcher (drainAtExit) may both see it.
func (p *proc) markEOF(i int) {
	if p.eofSeen[i].CompareAndSwap(false, true) && p.eofLeft.Add(-1) == 0 {
		close(p.drained)
	}
}

// drainAtExitReads bounds the reads drainAtExit makes per output, so that
// a background job that keeps printing cannot hold the exit watcher.
const drainAtExitReads = 4

// drainAtExit is the exit watcher reading the outputs' remaining bytes and
// end of file itself once the leader was reaped, instead of waiting for the
// pumps to be woken by the poller and to report it: for a process whose
// output is closed at its exit (the usual case), the exit is reported
// without another goroutine hand-off. It reads the way the pumps do
// (readOnce, under landMu, never past a follower's room) and leaves to them
// whatever it does not finish: output still open (a background job), no
// room, or more than drainAtExitReads reads.
func (p *proc) drainAtExit() {
	for i, f := range p.outputs {
		if p.eofSeen[i].Load() {
			continue
		}
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		eof := false
		// Control holds a reference: the pump closing f meanwhile does
		// not release the descriptor under the read.
		if rc.Control(func(fd uintptr) {
			for range drainAtExitReads {
				n, err := p.readOnce(int(fd), p.streams[i])
				switch {
				case err == unix.EINTR:
					continue
				case err == unix.EAGAIN, err == errNoRoom:
					return
				case err != nil, n == 0:
					eof = true // as the pump: EIO is a PTY whose slave side is closed
					return
				}
			}
		}) != nil {
			continue // closed: its pump has stopped and reported it
		}
		if eof {
			p.markEOF(i)
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
// end of file or grace passed. Time during which a follower held the pumps
// back does not count towards grace, so output still in the pipe reaches a
// live follower; a stalled follower stops holding them back.
func (p *proc) awaitDrain(grace time.Duration) {
	select {
	case <-p.drained:
		return
	default:
	}
	begin := time.Now()
	p.mu.Lock()
	held0 := p.heldTimeLocked(begin)
	p.mu.Unlock()
	t := time.NewTimer(grace)
	defer t.Stop()
	for {
		select {
		case <-p.drained:
			return
		case <-t.C:
		}
		now := time.Now()
		p.mu.Lock()
		held := p.heldTimeLocked(now) - held0
		p.mu.Unlock()
		left := grace - (now.Sub(begin) - held)
		if left <= 0 {
			return
		}
		t.Reset(left)
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
	p.wakePumpsLocked() // they discard from now on
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

// awaitExit blocks until the group leader has exited (it is a zombie or
// was reaped) or its pidfd is closed. The pidfd is non-blocking on the
// runtime poller: the watcher parks without holding a thread, and the
// leader's exit (the pidfd turning readable) comes back from the same
// epoll_wait as its outputs' hang-up, which drainAtExit then reads. Where
// the pidfd cannot be polled it blocks a thread in waitid instead (as
// os/exec's Wait does); after Shutdown gave up waiting that thread may
// stay blocked until the process dies.
func (p *proc) awaitExit() {
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return
	}
	err = rc.Read(func(fd uintptr) bool {
		for {
			// WNOHANG: a leader still running leaves info zeroed.
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false
			case err != nil:
				return true // not ours to wait for after all: let collect see
			}
			return info.Signo != 0
		}
	})
	if err == nil || errors.Is(err, os.ErrClosed) {
		return
	}
	// Not pollable here. Control holds a reference: a concurrent Close
	// does not release the descriptor (and its number) before waitid
	// returns.
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetNonblock(int(fd), false)
		for {
			var info unix.Siginfo
			if err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
				return
			}
		}
	})
}

// closeOutputs stops the output pumps by closing what they read, and the
// exit watcher by closing the pidfd.
func (p *proc) closeOutputs() {
	p.release()
	if p.pidfd != nil {
		p.pidfd.Close()
	}
	for _, f := range p.outputs {
		f.Close()
	}
}
