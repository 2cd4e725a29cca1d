//go:build linux

package workspace

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// threadCreds is an OS thread's filesystem identity: what runAs switches
// and restores.
type threadCreds struct {
	fsuid, fsgid uint32
	groups       []uint32
	caps         [2]unix.CapUserData // _LINUX_CAPABILITY_VERSION_3: two 32-bit words
}

// getThreadCreds reads the calling thread's fsuid, fsgid, supplementary
// groups and capabilities. The caller must have locked its goroutine.
func getThreadCreds() (threadCreds, error) {
	var c threadCreds
	// setfsuid and setfsgid with an invalid id (-1) only return the
	// current one.
	uid, _, _ := unix.RawSyscall(sysSetfsuid, ^uintptr(0), 0, 0)
	gid, _, _ := unix.RawSyscall(sysSetfsgid, ^uintptr(0), 0, 0)
	c.fsuid, c.fsgid = uint32(uid), uint32(gid)
	groups, err := getThreadGroups()
	if err != nil {
		return c, err
	}
	c.groups = groups
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3} // Pid 0: this thread
	if err := unix.Capget(&hdr, &c.caps[0]); err != nil {
		return c, fmt.Errorf("capget: %w", err)
	}
	return c, nil
}

// getThreadGroups reads the calling thread's supplementary groups (the raw
// system call reads the thread's own credentials).
func getThreadGroups() ([]uint32, error) {
	var buf [32]uint32
	for size := len(buf); ; size *= 2 {
		groups := buf[:]
		if size > len(buf) {
			groups = make([]uint32, size)
		}
		n, _, e := unix.RawSyscall(sysGetgroups, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0)
		runtime.KeepAlive(groups)
		switch {
		case e == unix.EINVAL && size < 1<<16: // more groups than room
			continue
		case e != 0:
			return nil, fmt.Errorf("getgroups: %w", e)
		}
		return slices.Clone(groups[:n]), nil
	}
}

// setThreadFSCreds sets the calling OS thread's supplementary groups, fsgid
// and fsuid. The caller must have locked the goroutine to its thread. Only
// the raw system calls are used: the libc-style wrappers (and
// syscall.Setgroups) change every thread of the process.
func setThreadFSCreds(uid, gid uint32, groups []uint32) error {
	if err := setThreadGroups(groups); err != nil {
		return err
	}
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

func setThreadGroups(groups []uint32) error {
	var ptr uintptr
	if len(groups) > 0 {
		ptr = uintptr(unsafe.Pointer(&groups[0]))
	}
	_, _, e := unix.RawSyscall(sysSetgroups, uintptr(len(groups)), ptr, 0)
	runtime.KeepAlive(groups)
	if e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	return nil
}

// restoreThreadCreds puts back what getThreadCreds read, fsuid first (going
// back to 0 raises the capabilities a non-zero fsuid cleared), then reads
// everything back and reports any difference.
func restoreThreadCreds(want threadCreds) error {
	unix.RawSyscall(sysSetfsuid, uintptr(want.fsuid), 0, 0)
	unix.RawSyscall(sysSetfsgid, uintptr(want.fsgid), 0, 0)
	if err := setThreadGroups(want.groups); err != nil {
		return err
	}
	got, err := getThreadCreds()
	if err != nil {
		return err
	}
	if got.caps != want.caps {
		// Returning to fsuid 0 raised a permitted capability that was not
		// effective before: drop it again.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		if err := unix.Capset(&hdr, &want.caps[0]); err != nil {
			return fmt.Errorf("capset: %w", err)
		}
		if got, err = getThreadCreds(); err != nil {
			return err
		}
	}
	switch {
	case got.fsuid != want.fsuid || got.fsgid != want.fsgid:
		return fmt.Errorf("fsuid/fsgid are %d/%d, want %d/%d", got.fsuid, got.fsgid, want.fsuid, want.fsgid)
	case !slices.Equal(got.groups, want.groups):
		return fmt.Errorf("supplementary groups are %v, want %v", got.groups, want.groups)
	case got.caps != want.caps:
		return fmt.Errorf("capabilities are %+v, want %+v", got.caps, want.caps)
	}
	return nil
}

// isMainThread reports whether the calling thread is the process's main
// thread.
func isMainThread() bool { return unix.Gettid() == unix.Getpid() }
