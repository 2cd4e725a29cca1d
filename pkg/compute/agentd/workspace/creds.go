package workspace

import (
	"context"
	"fmt"
	"runtime"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/userdb"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"
)

// runAs runs fn with the filesystem identity of u, so that files fn creates
// belong to u and permission checks are u's.
//
// u == nil, or u equal to the daemon's own uid and gid, runs fn directly on
// the calling goroutine. Otherwise the daemon must be root (else
// errdefs.ErrPermissionDenied) and fn runs on a fresh goroutine that locks
// its OS thread, switches that thread's supplementary groups, fsgid and
// fsuid with raw system calls (which, unlike syscall.Setgroups and friends,
// touch only the calling thread), and returns without unlocking: the Go
// runtime then terminates the thread instead of reusing it, so no other
// goroutine ever runs with u's credentials. New threads are never cloned
// from a locked thread (the runtime uses its template thread), so u's
// credentials are not inherited either.
//
// When fsuid changes from 0 to non-zero the kernel clears CAP_CHOWN,
// CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID and friends
// from the thread's effective set, so permission checks are real.
//
// fn must do all its work synchronously on the calling goroutine; it must
// not start goroutines that touch the filesystem. runAs waits for fn even if
// ctx ends meanwhile (a system call cannot be abandoned), but does not start
// it when ctx has already ended.
func (w *Workspace) runAs(ctx context.Context, u *userdb.User, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if u == nil || (u.UID == w.euid && u.GID == w.egid) {
		return fn()
	}
	if w.euid != 0 {
		return errorf(errdefs.ErrPermissionDenied,
			"the daemon runs as uid %d and cannot act as user %q (uid %d)", w.euid, u.Name, u.UID)
	}
	done := make(chan error, 1)
	go runOnThread(u, fn, done)
	return <-done
}

// runOnThread locks the calling goroutine to its thread, switches the
// thread's filesystem credentials to u, runs fn and sends the result. It
// never unlocks a switched thread, so the runtime ends it when the
// goroutine exits.
//
// The main thread is the exception: a locked goroutine exiting there does
// not end it but parks it forever (it is the process's leader and
// /proc/<pid> shows its credentials). On the main thread runOnThread keeps
// it locked and idle while another goroutine, which therefore runs on some
// other thread, does the work; the main thread's credentials are never
// touched and it is unlocked afterwards.
func runOnThread(u *userdb.User, fn func() error, done chan<- error) {
	runtime.LockOSThread()
	if isMainThread() {
		inner := make(chan error, 1)
		go runOnThread(u, fn, inner)
		err := <-inner
		runtime.UnlockOSThread()
		done <- err
		return
	}
	// Deliberately never unlocked from here on.
	if err := setThreadFSCreds(u.UID, u.GID, u.Groups); err != nil {
		done <- fmt.Errorf("%w: switch to user %q: %w", errdefs.ErrInternal, u.Name, err)
		return
	}
	defer func() {
		if r := recover(); r != nil {
			done <- fmt.Errorf("%w: panic while acting as user %q: %v", errdefs.ErrInternal, u.Name, r)
		}
	}()
	done <- fn()
}
