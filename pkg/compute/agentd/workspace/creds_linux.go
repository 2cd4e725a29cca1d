//go:build linux

package workspace

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setThreadFSCreds sets the calling OS thread's supplementary groups, fsgid
// and fsuid. The caller must have locked the goroutine to its thread and
// must never unlock it. Only the raw system calls are used: the libc-style
// wrappers (and syscall.Setgroups) change every thread of the process.
func setThreadFSCreds(uid, gid uint32, groups []uint32) error {
	var ptr uintptr
	if len(groups) > 0 {
		ptr = uintptr(unsafe.Pointer(&groups[0]))
	}
	if _, _, e := unix.RawSyscall(sysSetgroups, uintptr(len(groups)), ptr, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	runtime.KeepAlive(groups)
	// setfsgid and setfsuid return the previous value and never fail
	// visibly; an invalid id (-1) only reads the current one back.
	unix.RawSyscall(sysSetfsgid, uintptr(gid), 0, 0)
	if cur, _, _ := unix.RawSyscall(sysSetfsgid, ^uintptr(0), 0, 0); uint32(cur) != gid {
		return fmt.Errorf("setfsgid(%d) did not take effect", gid)
	}
	unix.RawSyscall(sysSetfsuid, uintptr(uid), 0, 0)
	if cur, _, _ := unix.RawSyscall(sysSetfsuid, ^uintptr(0), 0, 0); uint32(cur) != uid {
		return fmt.Errorf("setfsuid(%d) did not take effect", uid)
	}
	return nil
}

// isMainThread reports whether the calling thread is the process's main
// thread.
func isMainThread() bool { return unix.Gettid() == unix.Getpid() }
