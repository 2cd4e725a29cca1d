package process

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// reaperPoll is how often the reaper looks for exited children without
// being asked: a safety net in case a SIGCHLD was consumed elsewhere or a
// status was taken by someone else, and, in ReapAll mode, how the first
// orphan is found (see Reaper).
const reaperPoll = time.Second

// ReaperOptions configure a Reaper.
type ReaperOptions struct {
	// ReapAll waits for any child (wait4(-1)), so orphans reparented to the
	// daemon are reaped too. Use it when the daemon is PID 1 or a child
	// subreaper; then no other code in the process may wait for its own
	// children (os/exec's Cmd.Wait would fail with ECHILD), and there must
	// be only one ReapAll Reaper in the process.
	ReapAll bool
	// Subreaper marks the whole process as a child subreaper
	// (PR_SET_CHILD_SUBREAPER), so orphaned grandchildren are reparented to
	// it instead of to PID 1. It implies ReapAll. It is process-wide and is
	// not undone by Close.
	Subreaper bool
}

// Reaper collects the exit status of children started through it and
// dispatches each to the callback registered for its pid. It is safe for
// concurrent use and can be shared by several Managers.
//
// A child spawned with a pidfd is "watched": its owner waits for the pidfd
// to become readable (through the runtime poller) and collects the status
// itself (collect), which is quicker and cheaper than relaying SIGCHLD
// through os/signal. The reaper goroutine handles the rest. It looks for
// exited children every reaperPoll, and it relays SIGCHLD (waking up on
// every child's exit) from the first time it is needed on: when an
// unwatched child is spawned (a kernel without pidfds), or, in ReapAll
// mode, once it has reaped an orphan (orphans have no pidfd) or the
// Manager shuts down. So a daemon whose children are all watched and that
// never saw an orphan does no work per exit beyond the watchers' own, and
// an orphan that exits before the first one was seen stays a zombie for
// up to reaperPoll; from then on orphans are reaped as they exit.
type Reaper struct {
	log     *zap.Logger
	reapAll bool

	// forkMu orders forks against wait4(-1): a spawn holds it shared from
	// fork until its pid is registered, the reaper holds it exclusively
	// while it waits, so a child is never reaped before it is registered.
	forkMu sync.RWMutex

	mu      sync.Mutex
	waiters map[int]func(unix.WaitStatus)

	sigCh      chan os.Signal
	notifyOnce sync.Once   // signal.Notify(sigCh, SIGCHLD), when first needed
	relaying   atomic.Bool // notifyOnce ran
	poke       chan struct{}
	stop       chan struct{}
	done       chan struct{}
	once       sync.Once
}

// NewReaper starts a reaper goroutine. Close stops it.
func NewReaper(opts ReaperOptions, log *zap.Logger) (*Reaper, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Subreaper {
		opts.ReapAll = true
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("reaper: set child subreaper: %w", err)
		}
	}
	r := &Reaper{
		log:     log,
		reapAll: opts.ReapAll,
		waiters: make(map[int]func(unix.WaitStatus)),
		sigCh:   make(chan os.Signal, 1),
		poke:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go r.run()
	return r, nil
}

// listen starts relaying SIGCHLD to the reaper goroutine, for good.
func (r *Reaper) listen() {
	r.notifyOnce.Do(func() {
		signal.Notify(r.sigCh, unix.SIGCHLD)
		r.relaying.Store(true)
	})
}

// reapOrphansPromptly makes a ReapAll reaper reap orphans as they exit
// (relaying SIGCHLD) from now on, and look for exited ones at once.
func (r *Reaper) reapOrphansPromptly() {
	if !r.reapAll {
		return
	}
	select {
	case <-r.stop: // closed: nothing is relayed any more
		return
	default:
	}
	r.listen()
	r.wake()
}

// Close stops the reaper. Exits that happen afterwards are not reported.
func (r *Reaper) Close() error {
	r.once.Do(func() {
		signal.Stop(r.sigCh)
		close(r.stop)
	})
	<-r.done
	return nil
}

// spawn runs fork, registers the pid it returns with onExit and makes sure
// an exit that happened meanwhile is collected. onExit runs on the reaper
// goroutine (or the goroutine calling collect) and must not block. fork
// reports whether the child is watched: its owner calls collect once the
// child exited (see Reaper).
func (r *Reaper) spawn(fork func() (pid int, watched bool, err error), onExit func(unix.WaitStatus)) (int, error) {
	select {
	case <-r.stop:
		return 0, errors.New("reaper is closed")
	default:
	}
	r.forkMu.RLock()
	pid, watched, err := fork()
	if err == nil {
		r.mu.Lock()
		r.waiters[pid] = onExit
		r.mu.Unlock()
	}
	r.forkMu.RUnlock()
	if err == nil && !watched {
		r.listen()
		r.wake() // it may have exited before it was registered
	}
	return pid, err
}

// wake asks the reaper goroutine to look for exited children.
func (r *Reaper) wake() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

func (r *Reaper) run() {
	defer close(r.done)
	t := time.NewTicker(reaperPoll)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigCh:
		case <-r.poke:
		case <-t.C:
		}
		r.reap()
	}
}

// collect reaps pid, registered with spawn, if it has exited and nobody
// reaped it yet, and runs its callback on the calling goroutine. The reaper
// goroutine may get there first; the status is dispatched exactly once.
func (r *Reaper) collect(pid int) {
	r.mu.Lock()
	fn, ok := r.waiters[pid]
	if !ok {
		r.mu.Unlock()
		return
	}
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	for err == unix.EINTR {
		got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
	if err != nil || got != pid {
		// Not exited, or reaped by a wait4(-1) that has yet to take r.mu
		// (it dispatches), or by someone else (reap reports it).
		r.mu.Unlock()
		if err == unix.ECHILD {
			r.wake()
		}
		return
	}
	delete(r.waiters, pid)
	r.mu.Unlock()
	fn(ws)
}

type reaped struct {
	fn func(unix.WaitStatus)
	ws unix.WaitStatus
}

// reap collects every exited child it may wait for and runs the callbacks
// after releasing its locks.
func (r *Reaper) reap() {
	var out []reaped
	orphans := false
	r.forkMu.Lock()
	if r.reapAll {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			r.mu.Lock()
			fn, ok := r.waiters[pid]
			delete(r.waiters, pid)
			r.mu.Unlock()
			if ok {
				out = append(out, reaped{fn, ws})
			} else {
				orphans = true
				r.log.Debug("reaped orphan", zap.Int("pid", pid))
			}
		}
	} else {
		r.mu.Lock()
		for pid, fn := range r.waiters {
			var ws unix.WaitStatus
			got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			for err == unix.EINTR {
				got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			}
			switch {
			case err == unix.ECHILD:
				// Someone else waited for it: the status is lost.
				r.log.Warn("child was reaped elsewhere", zap.Int("pid", pid))
				delete(r.waiters, pid)
				out = append(out, reaped{fn, unix.WaitStatus(0xff << 8)})
			case err == nil && got == pid:
				delete(r.waiters, pid)
				out = append(out, reaped{fn, ws})
			}
		}
		r.mu.Unlock()
	}
	r.forkMu.Unlock()
	if orphans {
		r.listen() // more may follow: reap them as they exit
	}
	for _, x := range out {
		x.fn(x.ws)
	}
}
