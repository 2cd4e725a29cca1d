package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// int80 calls getpid through the i386 entry point (int $0x80), which the
// filter answers by killing the process.
func int80() uintptr

// archProbes adds the x32 calls, refused on amd64.
func archProbes(sys func(name string, trap uintptr, a ...uintptr)) {
	sys("x32:getpid", 0x40000000|unix.SYS_GETPID)
	sys("x32:ptrace", 0x40000000|521, syscall.PTRACE_ATTACH, 0x7ffffff0)
	sys("iopl", unix.SYS_IOPL, 99)
	sys("ioperm", unix.SYS_IOPERM, 0xffffffff, 1, 1)
}
