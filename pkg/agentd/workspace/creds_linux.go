//go:build linux

package workspace

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// threadCreds is an OS thread's identity as far as runAs switches and
// restores it.
type threadCreds struct {
	// fsuid and fsgid are the ids file operations run as. On a kernel
	// without setfsuid and setfsgid (gVisor) they are the effective ids.
	fsuid, fsgid uint32
	euid, egid   uint32
	groups       []uint32
	caps         [2]unix.CapUserData // _LINUX_CAPABILITY_VERSION_3: two 32-bit words
}

// credSwitch is how runAs changes a thread's file system identity.
type credSwitch uint8

const (
	// switchFSIDs changes the fsuid and fsgid only (setfsuid, setfsgid):
	// the thread keeps its effective ids, and with them the capabilities
	// that are not about files.
	switchFSIDs credSwitch = iota
	// switchEffectiveIDs changes the effective uid and gid (setresuid and
	// setresgid with the real and saved ids left at 0, so that the thread
	// can return), for kernels that lack setfsuid and setfsgid: gVisor
	// answers them with ENOSYS (gvisor.dev/issue/260). Leaving effective
	// uid 0 clears every effective capability; returning to it raises the
	// permitted ones, which the restore drops again where they were not
	// effective before.
	switchEffectiveIDs
)

// probeCredSwitch reports how this kernel lets runAs switch a thread.
// setfsuid with an invalid id only reads the current one, so probing
// changes nothing.
func probeCredSwitch() credSwitch {
	if _, _, e := unix.RawSyscall(sysSetfsuid, ^uintptr(0), 0, 0); e == unix.ENOSYS {
		return switchEffectiveIDs
	}
	return switchFSIDs
}

// getThreadCreds reads the calling thread's fsuid, fsgid, effective ids,
// supplementary groups and capabilities. The caller must have locked its
// goroutine.
func getThreadCreds() (threadCreds, error) {
	var c threadCreds
	var r, e, sv uint32
	if _, _, errno := unix.RawSyscall(sysGetresuid, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&sv))); errno != 0 {
		return c, fmt.Errorf("getresuid: %w", errno)
	}
	c.euid = e
	if _, _, errno := unix.RawSyscall(sysGetresgid, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&sv))); errno != 0 {
		return c, fmt.Errorf("getresgid: %w", errno)
	}
	c.egid = e
	// setfsuid and setfsgid with an invalid id (-1) only return the
	// current one; without them, file operations use the effective ids.
	uid, _, errno := unix.RawSyscall(sysSetfsuid, ^uintptr(0), 0, 0)
	gid, _, _ := unix.RawSyscall(sysSetfsgid, ^uintptr(0), 0, 0)
	if errno == unix.ENOSYS {
		uid, gid = uintptr(c.euid), uintptr(c.egid)
	}
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

// setThreadCreds switches the calling OS thread to uid, gid and groups
// the way how says. The caller must have locked the goroutine to its
// thread. Only the raw system calls are used: the libc-style wrappers (and
// syscall.Setgroups, syscall.Setresuid and friends) change every thread of
// the process.
func setThreadCreds(how credSwitch, uid, gid uint32, groups []uint32) error {
	if how == switchEffectiveIDs {
		return setThreadEffectiveIDs(uid, gid, groups)
	}
	return setThreadFSCreds(uid, gid, groups)
}

// setThreadFSCreds sets the calling thread's supplementary groups, fsgid
// and fsuid.
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

// setThreadEffectiveIDs sets the calling thread's supplementary groups,
// effective gid and effective uid, leaving the real and saved ids (root's)
// as they are. It first returns to effective uid 0, which the saved uid
// allows, so that a thread already acting as some user (a nested runAs)
// has the capabilities to switch again.
func setThreadEffectiveIDs(uid, gid uint32, groups []uint32) error {
	if err := setEffectiveUID(0); err != nil {
		return err
	}
	if err := setThreadGroups(groups); err != nil {
		return err
	}
	if err := setEffectiveGID(gid); err != nil {
		return err
	}
	return setEffectiveUID(uid)
}

// setEffectiveUID sets the calling thread's effective uid (and with it its
// fsuid) and checks that it took.
func setEffectiveUID(uid uint32) error {
	keep := ^uintptr(0) // -1: leave the real and saved uids
	if _, _, e := unix.RawSyscall(sysSetresuid, keep, uintptr(uid), keep); e != 0 {
		return fmt.Errorf("setresuid(-1, %d, -1): %w", uid, e)
	}
	var r, eff, sv uint32
	if _, _, e := unix.RawSyscall(sysGetresuid, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&eff)), uintptr(unsafe.Pointer(&sv))); e != 0 {
		return fmt.Errorf("getresuid: %w", e)
	}
	if eff != uid {
		return fmt.Errorf("setresuid(-1, %d, -1) did not take effect: the effective uid is %d", uid, eff)
	}
	return nil
}

// setEffectiveGID sets the calling thread's effective gid (and with it its
// fsgid) and checks that it took.
func setEffectiveGID(gid uint32) error {
	keep := ^uintptr(0)
	if _, _, e := unix.RawSyscall(sysSetresgid, keep, uintptr(gid), keep); e != 0 {
		return fmt.Errorf("setresgid(-1, %d, -1): %w", gid, e)
	}
	var r, eff, sv uint32
	if _, _, e := unix.RawSyscall(sysGetresgid, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&eff)), uintptr(unsafe.Pointer(&sv))); e != 0 {
		return fmt.Errorf("getresgid: %w", e)
	}
	if eff != gid {
		return fmt.Errorf("setresgid(-1, %d, -1) did not take effect: the effective gid is %d", gid, eff)
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

// restoreThreadCreds puts back what getThreadCreds read, then reads
// everything back and reports any difference. With switchFSIDs it sets the
// fsuid first (going back to 0 raises the capabilities a non-zero fsuid
// cleared); with switchEffectiveIDs it returns to effective uid 0 first
// (raising the permitted capabilities, which setting the groups and gid
// back needs), then sets the saved effective uid. Either way the
// capabilities are then set back to what they were.
func restoreThreadCreds(how credSwitch, want threadCreds) error {
	if how == switchEffectiveIDs {
		if err := setEffectiveUID(0); err != nil {
			return err
		}
		if err := setEffectiveGID(want.egid); err != nil {
			return err
		}
		if err := setThreadGroups(want.groups); err != nil {
			return err
		}
		if err := setEffectiveUID(want.euid); err != nil {
			return err
		}
	} else {
		unix.RawSyscall(sysSetfsuid, uintptr(want.fsuid), 0, 0)
		unix.RawSyscall(sysSetfsgid, uintptr(want.fsgid), 0, 0)
		if err := setThreadGroups(want.groups); err != nil {
			return err
		}
	}
	got, err := getThreadCreds()
	if err != nil {
		return err
	}
	if got.caps != want.caps {
		// Returning to uid 0 raised a permitted capability that was not
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
	case got.euid != want.euid || got.egid != want.egid:
		return fmt.Errorf("effective uid/gid are %d/%d, want %d/%d", got.euid, got.egid, want.euid, want.egid)
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
