package seccomp

import "golang.org/x/sys/unix"

// native describes amd64: its audit architecture and call numbers.
func native() (arch, bool) {
	return arch{name: "amd64", audit: unix.AUDIT_ARCH_X86_64, x32: true, sysnum: sysnum}, true
}

// sysnum returns the amd64 number of a call Rules names.
func sysnum(name string) (uint32, bool) {
	switch name {
	case "ptrace":
		return unix.SYS_PTRACE, true
	case "process_vm_readv":
		return unix.SYS_PROCESS_VM_READV, true
	case "process_vm_writev":
		return unix.SYS_PROCESS_VM_WRITEV, true
	case "process_madvise":
		return unix.SYS_PROCESS_MADVISE, true
	case "pidfd_getfd":
		return unix.SYS_PIDFD_GETFD, true
	case "kcmp":
		return unix.SYS_KCMP, true
	case "move_pages":
		return unix.SYS_MOVE_PAGES, true
	case "migrate_pages":
		return unix.SYS_MIGRATE_PAGES, true
	case "keyctl":
		return unix.SYS_KEYCTL, true
	case "add_key":
		return unix.SYS_ADD_KEY, true
	case "request_key":
		return unix.SYS_REQUEST_KEY, true
	case "bpf":
		return unix.SYS_BPF, true
	case "perf_event_open":
		return unix.SYS_PERF_EVENT_OPEN, true
	case "userfaultfd":
		return unix.SYS_USERFAULTFD, true
	case "io_uring_setup":
		return unix.SYS_IO_URING_SETUP, true
	case "io_uring_enter":
		return unix.SYS_IO_URING_ENTER, true
	case "io_uring_register":
		return unix.SYS_IO_URING_REGISTER, true
	case "fanotify_init":
		return unix.SYS_FANOTIFY_INIT, true
	case "mount":
		return unix.SYS_MOUNT, true
	case "umount2":
		return unix.SYS_UMOUNT2, true
	case "pivot_root":
		return unix.SYS_PIVOT_ROOT, true
	case "chroot":
		return unix.SYS_CHROOT, true
	case "open_tree":
		return unix.SYS_OPEN_TREE, true
	case "open_tree_attr":
		return unix.SYS_OPEN_TREE_ATTR, true
	case "move_mount":
		return unix.SYS_MOVE_MOUNT, true
	case "fsopen":
		return unix.SYS_FSOPEN, true
	case "fsconfig":
		return unix.SYS_FSCONFIG, true
	case "fsmount":
		return unix.SYS_FSMOUNT, true
	case "fspick":
		return unix.SYS_FSPICK, true
	case "mount_setattr":
		return unix.SYS_MOUNT_SETATTR, true
	case "open_by_handle_at":
		return unix.SYS_OPEN_BY_HANDLE_AT, true
	case "name_to_handle_at":
		return unix.SYS_NAME_TO_HANDLE_AT, true
	case "unshare":
		return unix.SYS_UNSHARE, true
	case "setns":
		return unix.SYS_SETNS, true
	case "clone":
		return unix.SYS_CLONE, true
	case "clone3":
		return unix.SYS_CLONE3, true
	case "kexec_load":
		return unix.SYS_KEXEC_LOAD, true
	case "kexec_file_load":
		return unix.SYS_KEXEC_FILE_LOAD, true
	case "reboot":
		return unix.SYS_REBOOT, true
	case "init_module":
		return unix.SYS_INIT_MODULE, true
	case "finit_module":
		return unix.SYS_FINIT_MODULE, true
	case "delete_module":
		return unix.SYS_DELETE_MODULE, true
	case "swapon":
		return unix.SYS_SWAPON, true
	case "swapoff":
		return unix.SYS_SWAPOFF, true
	case "acct":
		return unix.SYS_ACCT, true
	case "quotactl":
		return unix.SYS_QUOTACTL, true
	case "quotactl_fd":
		return unix.SYS_QUOTACTL_FD, true
	case "syslog":
		return unix.SYS_SYSLOG, true
	case "iopl":
		return unix.SYS_IOPL, true
	case "ioperm":
		return unix.SYS_IOPERM, true
	case "settimeofday":
		return unix.SYS_SETTIMEOFDAY, true
	case "clock_settime":
		return unix.SYS_CLOCK_SETTIME, true
	case "clock_adjtime":
		return unix.SYS_CLOCK_ADJTIME, true
	case "adjtimex":
		return unix.SYS_ADJTIMEX, true
	case "ioctl":
		return unix.SYS_IOCTL, true
	case "socket":
		return unix.SYS_SOCKET, true
	}
	return 0, false
}
