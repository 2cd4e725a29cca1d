package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// plan is a fully resolved start request.
type plan struct {
	argv []string
	path string // what execve receives
	env  []string
	dir  string
	user string
	cred *syscall.Credential
	// checkLater: dir and path were not checked before the start (see
	// plan); startError checks them if it fails.
	checkLater bool
}

// Start starts a process and returns as soon as it runs; the process is not
// bound to ctx. With a RequestID, a retry of the same request returns the
// process already started, and a concurrent retry waits for the first.
//
// Errors are *errkind.ProcessError wrapping: ErrInvalidArgument (malformed
// options, relative Dir, bad env), ErrNotFound (unknown run_as user, missing
// Dir, missing program or interpreter, named in the message),
// ErrNotDirectory (Dir is not a directory), ErrPermissionDenied (another
// user while the daemon is not root, program not executable or Dir not
// enterable by the user), ErrConflict (RequestID reused with other options),
// ErrResourceExhausted (MaxProcesses, or the kernel out of processes/fds;
// the latter retryable), ErrUnavailable (shutting down), ErrCanceled /
// ErrDeadlineExceeded (ctx ended before the start).
func (m *Manager) Start(ctx context.Context, opts StartOptions) (Info, error) {
	info, _, err := m.StartOrFind(ctx, opts)
	return info, err
}

// StartOrFind is Start that also reports whether opts.RequestID matched a
// process started earlier (existing), in which case nothing new was started.
func (m *Manager) StartOrFind(ctx context.Context, opts StartOptions) (info Info, existing bool, err error) {
	const op = "start"
	if err := validateOptions(opts); err != nil {
		return Info{}, false, procErr(op, "", err)
	}
	var pend *pendingStart
	for pend == nil {
		if ctx.Err() != nil {
			return Info{}, false, procErr(op, "", ctxErr(ctx))
		}
		m.mu.Lock()
		if m.closing {
			m.mu.Unlock()
			return Info{}, false, procErrf(op, "", errkind.ErrUnavailable, "the process manager is shutting down")
		}
		if rid := opts.RequestID; rid != "" {
			if p := m.byRequest[rid]; p != nil {
				m.mu.Unlock()
				if !sameOptions(p.opts, opts) {
					return Info{}, false, procErrf(op, p.id, errkind.ErrConflict, "request_id %q was already used to start a different process", rid)
				}
				return p.info(), true, nil
			}
			if other := m.pending[rid]; other != nil {
				m.mu.Unlock()
				if !sameOptions(other.opts, opts) {
					return Info{}, false, procErrf(op, "", errkind.ErrConflict, "request_id %q is already starting a different process", rid)
				}
				select {
				case <-other.done:
				case <-ctx.Done():
					return Info{}, false, procErr(op, "", ctxErr(ctx))
				}
				continue // it either started (found above) or failed (we try)
			}
		}
		if m.running+m.npending >= m.cfg.MaxProcesses {
			m.mu.Unlock()
			return Info{}, false, procErrf(op, "", errkind.ErrResourceExhausted, "%d processes are already running (the limit)", m.cfg.MaxProcesses)
		}
		pend = &pendingStart{opts: opts, done: make(chan struct{})}
		if opts.RequestID != "" {
			m.pending[opts.RequestID] = pend
		}
		m.npending++
		m.inflight.Add(1)
		m.mu.Unlock()
	}

	p, err := m.startPlanned(opts)

	m.mu.Lock()
	if opts.RequestID != "" {
		delete(m.pending, opts.RequestID)
	}
	m.npending--
	if err == nil {
		m.procs[p.id] = p
		if opts.RequestID != "" {
			m.byRequest[opts.RequestID] = p
		}
		m.running++
		// Watch only once registered, so that the exit bookkeeping
		// (retention, eviction) always finds the process.
		m.workers.Add(1)
		go m.watch(p)
	}
	m.mu.Unlock()
	close(pend.done)
	m.inflight.Done()
	if err != nil {
		return Info{}, false, err
	}
	return p.info(), false, nil
}

// startPlanned resolves opts and launches the process.
func (m *Manager) startPlanned(opts StartOptions) (*proc, error) {
	pl, err := m.plan(opts)
	if err != nil {
		return nil, procErr("start", "", err)
	}
	p, err := m.launch(pl, opts)
	if err != nil {
		return nil, procErr("start", "", err)
	}
	m.log.Info("process started", zap.String("id", p.id), zap.Int("pid", p.pid),
		zap.String("program", pl.argv[0]), zap.String("user", pl.user), zap.Bool("tty", opts.TTY))
	return p, nil
}

// workdirError reports a failure about the working directory dir.
func workdirError(dir string, err error) error {
	return &errkind.PathError{Op: "chdir", Path: dir, Err: err}
}

// validateOptions checks what needs no lookup.
func validateOptions(o StartOptions) error {
	switch {
	case len(o.Argv) > 0 && o.Command != "":
		return errkind.Errorf(errkind.ErrInvalidArgument, "give either argv or a shell command, not both")
	case len(o.Argv) == 0 && o.Command == "":
		return errkind.Errorf(errkind.ErrInvalidArgument, "neither argv nor a shell command was given")
	case len(o.Argv) > 0 && o.Argv[0] == "":
		return errkind.Errorf(errkind.ErrInvalidArgument, "argv[0] is empty")
	case o.Dir != "" && !filepath.IsAbs(o.Dir):
		return workdirError(o.Dir, errkind.Errorf(errkind.ErrInvalidArgument, "the working directory is not absolute"))
	case o.Timeout < 0:
		return errkind.Errorf(errkind.ErrInvalidArgument, "negative timeout %s", o.Timeout)
	case !o.TTY && (o.Rows != 0 || o.Cols != 0):
		return errkind.Errorf(errkind.ErrInvalidArgument, "a terminal size was given without tty")
	}
	if o.TTY {
		if _, _, err := terminalSize(o.Rows, o.Cols, true); err != nil {
			return err
		}
	}
	for i, a := range o.Argv {
		if strings.ContainsRune(a, 0) {
			return errkind.Errorf(errkind.ErrInvalidArgument, "argv[%d] contains a NUL byte", i)
		}
	}
	if strings.ContainsRune(o.Command, 0) || strings.ContainsRune(o.Shell, 0) || strings.ContainsRune(o.Dir, 0) {
		return errkind.Errorf(errkind.ErrInvalidArgument, "command, shell or directory contains a NUL byte")
	}
	for k, v := range o.Env {
		if err := checkEnvVar(k, v); err != nil {
			return err
		}
	}
	return nil
}

// sameOptions reports whether two requests describe the same process.
func sameOptions(a, b StartOptions) bool {
	return slices.Equal(a.Argv, b.Argv) && a.Command == b.Command && a.Shell == b.Shell &&
		a.Login == b.Login && a.Dir == b.Dir && maps.Equal(a.Env, b.Env) && a.User == b.User &&
		a.TTY == b.TTY && a.Rows == b.Rows && a.Cols == b.Cols && a.Stdin == b.Stdin &&
		a.Timeout == b.Timeout
}

// plan resolves user, environment, directory and program.
func (m *Manager) plan(o StartOptions) (*plan, error) {
	pl := &plan{}
	var u *userdb.User
	name := o.User
	if name == "" {
		name = m.cfg.DefaultUser
	}
	if name != "" {
		if o.RunAs != nil && o.RunAs.Name == name {
			u = o.RunAs
		} else {
			var err error
			if u, err = m.cfg.Users.Lookup(name); err != nil {
				return nil, fmt.Errorf("run_as user: %w", err)
			}
		}
		switch {
		case m.euid == 0:
			groups := []uint32{u.GID}
			for _, g := range u.Groups {
				if !slices.Contains(groups, g) {
					groups = append(groups, g)
				}
			}
			pl.cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: groups}
		case int(u.UID) != m.euid:
			return nil, errkind.Errorf(errkind.ErrPermissionDenied,
				"the daemon runs as uid %d, not root, and cannot start processes as user %q (uid %d)", m.euid, u.Name, u.UID)
		}
	} else if self, err := m.cfg.Users.Account(strconv.Itoa(m.euid)); err == nil {
		u = self // only for HOME/USER/LOGNAME/SHELL; no credential change, so no groups
	}
	if u != nil {
		pl.user = u.Name
	}
	m.envMu.RLock()
	pl.env = buildEnv(m.cfg.BaseEnv, u, m.env, o.Env, o.TTY)
	m.envMu.RUnlock()

	pl.dir = o.Dir
	if pl.dir == "" {
		pl.dir = "/"
		if u != nil && filepath.IsAbs(u.Home) {
			if fi, err := os.Stat(u.Home); err == nil && fi.IsDir() {
				pl.dir = u.Home
			}
		}
	}
	if len(o.Argv) > 0 {
		pl.argv = slices.Clone(o.Argv)
	} else {
		shell := o.Shell
		if shell == "" {
			shell = m.cfg.DefaultShell
		}
		flag := "-c"
		if o.Login {
			flag = "-lc"
		}
		pl.argv = []string{shell, flag, o.Command}
	}
	if strings.Contains(pl.argv[0], "/") {
		// A program named by its path is what execve receives as it is:
		// the checks that explain a failure (checkDir, checkExecutable)
		// run only if the start fails (see launch), which saves their
		// system calls on every start that succeeds. execve and the
		// child's chdir refuse whatever those checks refuse.
		pl.path, pl.checkLater = pl.argv[0], true
		return pl, nil
	}
	// A bare name is searched in PATH, which needs the directory checked
	// first (as a failure about it must win).
	if err := checkDir(pl.dir); err != nil {
		return nil, err
	}
	var err error
	if pl.path, err = lookPath(pl.argv[0], envValue(pl.env, "PATH"), pl.dir); err != nil {
		return nil, err
	}
	return pl, nil
}

// checkDir reports why dir cannot be a process's working directory, if it
// cannot. A failure about the working directory is a PathError on it: the
// path tells callers that the directory, not the program, is at fault.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return workdirError(dir, errkind.Errorf(errkind.ErrNotFound, "the working directory does not exist"))
	case errors.Is(err, unix.ENOTDIR):
		return workdirError(dir, errkind.Errorf(errkind.ErrNotDirectory, "a parent of the working directory is not a directory"))
	case err != nil:
		return workdirError(dir, errkind.Errorf(errkind.ErrPermissionDenied, "the working directory cannot be entered: %v", err))
	case !fi.IsDir():
		return workdirError(dir, errkind.Errorf(errkind.ErrNotDirectory, "the working directory is not a directory"))
	}
	return nil
}

// startError explains a failed fork/exec of pl: for a plan whose checks
// were left for later (plan.checkLater), the first check that fails, as
// plan would have reported it before starting; otherwise, or when every
// check passes, the errno itself (execError).
func startError(err error, pl *plan) error {
	if pl.checkLater {
		if cerr := checkDir(pl.dir); cerr != nil {
			return cerr
		}
		if _, cerr := lookPath(pl.argv[0], "", pl.dir); cerr != nil {
			return cerr
		}
	}
	return execError(err, pl)
}

// launch creates the process's descriptors, forks it through the reaper
// and starts its output pumps. The caller starts its exit watcher.
func (m *Manager) launch(pl *plan, o StartOptions) (p *proc, err error) {
	o.Argv, o.Env = slices.Clone(o.Argv), maps.Clone(o.Env) // the caller may reuse them
	p = &proc{
		id: newID(), requestID: o.RequestID, opts: o, argv: pl.argv, dir: pl.dir, user: pl.user,
		tty: o.TTY, out: newOutputLog(m.cfg.OutputBufferBytes), stallTimeout: m.cfg.FollowerStallTimeout, activity: m.cfg.Activity,
		drained: make(chan struct{}), leaderReaped: make(chan struct{}), exited: make(chan struct{}),
	}
	var ch *childIO
	if o.TTY {
		rows, cols, serr := terminalSize(o.Rows, o.Cols, true) // checked by validateOptions
		if serr != nil {
			return nil, serr
		}
		ch, err = openPTY(rows, cols)
	} else {
		ch, err = openPipes(o.Stdin, m.devNull)
	}
	if err != nil {
		return nil, err
	}
	defer ch.closeChildEnds() // the child has its copies; ours must go for EOF to work
	attr := &syscall.ProcAttr{
		Dir:   pl.dir,
		Env:   pl.env,
		Files: ch.files,
		Sys:   &syscall.SysProcAttr{Credential: pl.cred},
	}
	if o.TTY {
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
	} else {
		attr.Sys.Setpgid = true
	}

	pidfd := -1
	attr.Sys.PidFD = &pidfd // exit notification through the poller, see watch

	p.startedAt = time.Now()
	m.cfg.Activity.TouchAt(p.startedAt)
	pid, err := m.reaper.spawn(func() (int, bool, error) {
		pid, err := syscall.ForkExec(pl.path, pl.argv, attr)
		if err != nil {
			return pid, false, err
		}
		p.pid = pid
		if pidfd >= 0 {
			// Non-blocking, so that NewFile puts it on the poller. A
			// pidfd has no other status flag to keep, so one F_SETFL
			// does it (no F_GETFL first).
			if _, err := unix.FcntlInt(uintptr(pidfd), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
				unix.Close(pidfd)
			} else {
				p.pidfd = os.NewFile(uintptr(pidfd), "pidfd")
			}
		}
		return pid, p.pidfd != nil, nil
	}, func(ws unix.WaitStatus) {
		p.leaderDone(ws)
	})
	if err != nil {
		ch.closeParentEnds()
		return nil, startError(err, pl)
	}
	p.pid = pid
	p.master, p.stdin, p.outputs, p.streams = ch.master, ch.stdin, ch.outputs, ch.streams
	p.eofSeen = make([]atomic.Bool, len(ch.outputs))
	p.eofLeft.Store(int32(len(ch.outputs)))
	if o.HoldOutput { // before any pump runs: nothing can be dropped before it
		p.reserved = &follower{progress: time.Now()}
		p.followers = append(p.followers, p.reserved)
	}

	m.workers.Add(len(ch.outputs))
	var open atomic.Int32
	open.Store(int32(len(ch.outputs)))
	done := func() { // after eof and closing the output
		if open.Add(-1) == 0 {
			m.mu.Lock()
			delete(m.pumping, p)
			m.mu.Unlock()
		}
		m.workers.Done()
	}
	m.mu.Lock()
	m.pumping[p] = struct{}{}
	m.mu.Unlock()
	for i, f := range ch.outputs {
		go p.pump(f, ch.streams[i], func() { p.markEOF(i) }, done)
	}
	if o.Timeout > 0 {
		p.mu.Lock()
		if !p.leaderExited {
			p.timeout = time.AfterFunc(o.Timeout, p.onTimeout)
		}
		p.mu.Unlock()
	}
	return p, nil
}

// execError turns a fork/exec failure into a precise compute error.
func execError(err error, pl *plan) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return errkind.Errorf(errkind.ErrInternal, "start %q: %v", pl.argv[0], err)
	}
	who := pl.user
	if who == "" {
		who = "the daemon's user"
	}
	switch errno {
	case unix.ENOENT:
		return errkind.Errorf(errkind.ErrNotFound, "start %q: the program or its interpreter does not exist", pl.argv[0])
	case unix.EACCES:
		return errkind.Errorf(errkind.ErrPermissionDenied, "start %q: %s may not execute it or enter %q", pl.argv[0], who, pl.dir)
	case unix.EPERM:
		return errkind.Errorf(errkind.ErrPermissionDenied, "start %q: cannot switch to %s: %v", pl.argv[0], who, errno)
	case unix.ENOEXEC:
		return errkind.Errorf(errkind.ErrInvalidArgument, "start %q: not an executable format", pl.argv[0])
	case unix.ENOTDIR:
		return errkind.Errorf(errkind.ErrNotDirectory, "start %q: a path component is not a directory", pl.argv[0])
	case unix.E2BIG:
		return errkind.Errorf(errkind.ErrInvalidArgument, "start %q: argument list and environment too long", pl.argv[0])
	case unix.EAGAIN, unix.ENOMEM, unix.EMFILE, unix.ENFILE:
		return errkind.MarkRetryable(errkind.Errorf(errkind.ErrResourceExhausted, "start %q: %v", pl.argv[0], errno))
	}
	return errkind.Errorf(errkind.ErrInternal, "start %q: %v", pl.argv[0], errno)
}
