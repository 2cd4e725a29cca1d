package workspace

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// runAs runs fn with the filesystem identity of u, so that files fn creates
// belong to u and permission checks are u's.
//
// u == nil, or u equal to the daemon's own uid and gid, runs fn directly on
// the calling goroutine. Otherwise the daemon must be root (else
// errkind.ErrPermissionDenied) and fn runs on the calling goroutine locked
// to its OS thread, whose supplementary groups, fsgid and fsuid (or, where
// the kernel lacks setfsuid as gVisor does, effective gid and uid: see
// credSwitch) are switched to u's with raw system calls (which, unlike
// syscall.Setgroups and friends, touch only the calling thread) and
// afterwards set back to what they were, capabilities included (see
// switchedRun). The thread is
// unlocked only once its identity has been read back and found restored,
// so no other goroutine ever runs with u's credentials; if it cannot be
// restored, the thread stays locked and the runtime ends it when the
// goroutine exits. New threads are never cloned from a locked thread (the
// runtime uses its template thread), so u's credentials are not inherited
// either.
//
// Switching in place costs a dozen system calls; the alternative, a fresh
// thread per operation that is thrown away afterwards, cost a thread
// creation and a cross-CPU hand-off per file operation and per process
// start as a run_as user (about 50 µs each on a small VM).
//
// When fsuid changes from 0 to non-zero the kernel clears CAP_CHOWN,
// CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID and friends
// from the thread's effective set, so permission checks are real; changing
// it back to 0 raises those permitted again, which the restore checks
// against the capabilities the thread had before.
//
// fn must do all its work synchronously on the calling goroutine; it must
// not start goroutines that touch the filesystem. runAs waits for fn even if
// ctx ends meanwhile (a system call cannot be abandoned), but does not start
// it when ctx has already ended. A panic in fn propagates after the thread's
// identity is restored.
func (w *Workspace) runAs(ctx context.Context, u *userdb.User, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.isSelf(u) {
		return fn()
	}
	if w.euid != 0 {
		return errorf(errkind.ErrPermissionDenied,
			"the daemon runs as uid %d and cannot act as user %q (uid %d)", w.euid, u.Name, u.UID)
	}
	runtime.LockOSThread()
	if isMainThread() {
		return runBesideMainThread(w.credSwitch, u, fn)
	}
	return switchedRun(w.credSwitch, u, fn)
}

// isSelf reports whether acting as u is acting as the daemon itself (u nil,
// or the daemon's own uid and gid): nothing to switch.
func (w *Workspace) isSelf(u *userdb.User) bool {
	return u == nil || (u.UID == w.euid && u.GID == w.egid)
}

// switchedRun runs fn as u on the calling goroutine, which the caller
// locked to its thread (not the main thread). It unlocks the thread once
// its identity is restored, and leaves it locked otherwise (the runtime
// then ends it with the goroutine).
func switchedRun(how credSwitch, u *userdb.User, fn func() error) (err error) {
	saved, err := getThreadCreds()
	if err != nil {
		runtime.UnlockOSThread() // nothing was changed
		return fmt.Errorf("%w: read the thread's credentials: %w", errkind.ErrInternal, err)
	}
	defer func() {
		if rerr := restoreThreadCreds(how, saved); rerr != nil {
			err = errors.Join(err, fmt.Errorf("%w: restore the thread's credentials after acting as user %q: %w",
				errkind.ErrInternal, u.Name, rerr))
			return // still locked: this thread ends with its goroutine
		}
		runtime.UnlockOSThread()
	}()
	if err := setThreadCreds(how, u.UID, u.GID, u.Groups); err != nil {
		return fmt.Errorf("%w: switch to user %q: %w", errkind.ErrInternal, u.Name, err)
	}
	return fn()
}

// runBesideMainThread runs fn as u on another goroutine while the calling
// goroutine, locked to the main thread, waits; the main thread's
// credentials are never touched (it is the process's leader, /proc/<pid>
// shows them, and a locked goroutine exiting there does not end it). Being
// locked, the main thread cannot pick up the other goroutine, which
// therefore runs on some other thread. A panic in fn becomes an error
// here: it cannot cross goroutines.
func runBesideMainThread(how credSwitch, u *userdb.User, fn func() error) error {
	defer runtime.UnlockOSThread()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("%w: panic while acting as user %q: %v", errkind.ErrInternal, u.Name, r)
			}
		}()
		runtime.LockOSThread()
		done <- switchedRun(how, u, fn)
	}()
	return <-done
}
