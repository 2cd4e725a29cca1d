//go:build linux && !386 && !arm

package workspace

import "golang.org/x/sys/unix"

// System calls taking 32-bit ids.
const (
	sysSetgroups = unix.SYS_SETGROUPS
	sysSetfsuid  = unix.SYS_SETFSUID
	sysSetfsgid  = unix.SYS_SETFSGID
	sysGetgroups = unix.SYS_GETGROUPS
	sysSetresuid = unix.SYS_SETRESUID
	sysSetresgid = unix.SYS_SETRESGID
	sysGetresuid = unix.SYS_GETRESUID
	sysGetresgid = unix.SYS_GETRESGID
)
