//go:build linux && (386 || arm)

package workspace

import "golang.org/x/sys/unix"

// System calls taking 32-bit ids (the plain ones take 16-bit ids here).
const (
	sysSetgroups = unix.SYS_SETGROUPS32
	sysSetfsuid  = unix.SYS_SETFSUID32
	sysSetfsgid  = unix.SYS_SETFSGID32
	sysGetgroups = unix.SYS_GETGROUPS32
	sysSetresuid = unix.SYS_SETRESUID32
	sysSetresgid = unix.SYS_SETRESGID32
	sysGetresuid = unix.SYS_GETRESUID32
	sysGetresgid = unix.SYS_GETRESGID32
)
