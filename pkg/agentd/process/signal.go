package process

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// ParseSignal resolves a signal name such as "TERM", "SIGTERM" or "int"
// (case-insensitive, with or without the SIG prefix).
func ParseSignal(name string) (unix.Signal, error) {
	n := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	if s := unix.SignalNum(n); s != 0 {
		return s, nil
	}
	return 0, errkind.Errorf(errkind.ErrInvalidArgument, "unknown signal %q", name)
}

// Signal delivers the named signal to the process's whole group. For a PTY
// process it also goes to the terminal's foreground process group (the
// group Ctrl-C would reach) when that differs.
func (m *Manager) Signal(id, name string) error {
	const op = "signal"
	sig, err := ParseSignal(name)
	if err != nil {
		return procErr(op, id, err)
	}
	p, err := m.lookup(op, id)
	if err != nil {
		return err
	}
	if p.exitStatus() != nil {
		return procErrf(op, id, errkind.ErrFailedPrecondition, "process has exited; %s not sent", unix.SignalName(sig))
	}
	if err := signalGroup(p.pid, sig); err != nil {
		return procErrf(op, id, errkind.ErrInternal, "send %s to process group %d: %v", unix.SignalName(sig), p.pid, err)
	}
	if p.tty {
		if fg, err := foregroundGroup(p.master); err == nil && fg > 0 && fg != p.pid {
			_ = signalGroup(fg, sig)
		}
	}
	m.log.Debug("signal sent", zap.String("id", id), zap.String("signal", unix.SignalName(sig)))
	return nil
}

// signalGroup sends sig to process group pgid; a group that is already
// gone is not an error.
func signalGroup(pgid int, sig unix.Signal) error {
	if pgid <= 1 {
		return nil // never signal -1 (everything) or -0 (ourselves)
	}
	if err := unix.Kill(-pgid, sig); err != nil && err != unix.ESRCH {
		return err
	}
	return nil
}

// kill sends SIGKILL to the process group and, for a PTY, to every group of
// its session (job-control shells put jobs in groups of their own). With
// timedOut the exit is marked as a timeout unless the leader already exited.
func (p *proc) kill(timedOut bool) {
	p.mu.Lock()
	if timedOut && !p.leaderExited {
		p.timedOut = true
	}
	p.mu.Unlock()
	_ = signalGroup(p.pid, unix.SIGKILL)
	if p.tty {
		for _, g := range sessionGroups(p.pid) {
			_ = signalGroup(g, unix.SIGKILL)
		}
	}
}

// onTimeout is the Timeout timer's callback.
func (p *proc) onTimeout() {
	p.mu.Lock()
	exited := p.leaderExited
	p.mu.Unlock()
	if !exited {
		p.kill(true)
	}
}

// groupMayBeAlive reports whether killing the group can still reach
// anything: the leader runs, or something holds the output open. A group
// known to be empty is not signalled, because its id may be reused.
func (p *proc) groupMayBeAlive() bool {
	p.mu.Lock()
	exited := p.leaderExited
	p.mu.Unlock()
	if !exited {
		return true
	}
	select {
	case <-p.drained:
		return false
	default:
		return true
	}
}

// foregroundGroup returns the foreground process group of a PTY.
func foregroundGroup(master *os.File) (int, error) {
	rc, err := master.SyscallConn()
	if err != nil {
		return 0, err
	}
	var pgid int
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		pgid, ierr = unix.IoctlGetInt(int(fd), unix.TIOCGPGRP)
	}); err != nil {
		return 0, err
	}
	return pgid, ierr
}

// sessionGroups lists the process groups of the processes in session sid,
// from /proc.
func sessionGroups(sid int) []int {
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	seen := map[int]bool{}
	var out []int
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...; comm may contain spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 4 {
			continue
		}
		pgrp, err1 := strconv.Atoi(f[2])
		sess, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil || sess != sid || seen[pgrp] {
			continue
		}
		seen[pgrp] = true
		out = append(out, pgrp)
	}
	return out
}
