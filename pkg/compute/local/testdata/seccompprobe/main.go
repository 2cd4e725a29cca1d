// Command seccompprobe runs inside a bubblewrap sandbox (see
// ../../seccomp_test.go): it makes each system call the sandbox's seccomp
// filter denies, with arguments an unfiltered kernel would reject with
// some other errno (or accept harmlessly), and prints one JSON object:
// the errno of every call, what allowed calls did, and the process's
// seccomp mode.
//
//	seccompprobe          probe and print JSON
//	seccompprobe child    print "child-ok" (the target of the clone probes)
//	seccompprobe int80    make a system call through the i386 entry point
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Report is what the probe prints.
type Report struct {
	// Errno is the errno each probed call failed with (0: it succeeded).
	Errno map[string]int `json:"errno"`
	// Allowed holds what calls that must stay allowed said ("ok" or an
	// error).
	Allowed map[string]string `json:"allowed"`
	// Seccomp is the Seccomp line of /proc/self/status (2: filter).
	Seccomp string `json:"seccomp"`
}

// bad is an address no mapping holds: pointer arguments that an
// unfiltered kernel would fault on (EFAULT), never dereference usefully.
const bad = 1

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "child":
			fmt.Println("child-ok")
			return
		case "int80":
			int80()
			fmt.Println("int80 returned")
			return
		}
	}
	r := Report{Errno: map[string]int{}, Allowed: map[string]string{}}
	sys := func(name string, trap uintptr, a ...uintptr) {
		var args [6]uintptr
		copy(args[:], a)
		r1, _, e := syscall.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
		if e == 0 && strings.HasPrefix(name, "socket") {
			_ = syscall.Close(int(r1))
		}
		r.Errno[name] = int(e)
	}
	neg := ^uintptr(0) // -1
	self := uintptr(os.Getpid())
	const nopid = 0x7ffffff0

	sys("ptrace", unix.SYS_PTRACE, unix.PTRACE_ATTACH, nopid)
	sys("process_vm_readv", unix.SYS_PROCESS_VM_READV, nopid, 0, 0, 0, 0, 1)
	sys("process_vm_writev", unix.SYS_PROCESS_VM_WRITEV, nopid, 0, 0, 0, 0, 1)
	sys("process_madvise", unix.SYS_PROCESS_MADVISE, neg, 0, 0, 0, 0)
	sys("pidfd_getfd", unix.SYS_PIDFD_GETFD, neg, 0, 0)
	sys("kcmp", unix.SYS_KCMP, self, self, 99, 0, 0)
	sys("move_pages", unix.SYS_MOVE_PAGES, nopid, 0, 0, 0, 0, 0)
	sys("migrate_pages", unix.SYS_MIGRATE_PAGES, nopid, 0, 0, 0)
	sys("keyctl", unix.SYS_KEYCTL, 9999)
	sys("add_key", unix.SYS_ADD_KEY, bad, bad, 0, 0, 0)
	sys("request_key", unix.SYS_REQUEST_KEY, bad, bad, 0, 0)
	sys("bpf", unix.SYS_BPF, 9999, 0, 0)
	sys("perf_event_open", unix.SYS_PERF_EVENT_OPEN, bad, 0, neg, neg, 0)
	sys("userfaultfd", unix.SYS_USERFAULTFD, 0xffff)
	sys("io_uring_setup", unix.SYS_IO_URING_SETUP, 0, bad)
	sys("io_uring_enter", unix.SYS_IO_URING_ENTER, neg, 0, 0, 0, 0, 0)
	sys("io_uring_register", unix.SYS_IO_URING_REGISTER, neg, 0, 0, 0)
	sys("fanotify_init", unix.SYS_FANOTIFY_INIT, 0xffffffff, 0)
	sys("mount", unix.SYS_MOUNT, bad, bad, bad, 0, 0)
	sys("umount2", unix.SYS_UMOUNT2, bad, 0)
	sys("pivot_root", unix.SYS_PIVOT_ROOT, bad, bad)
	sys("chroot", unix.SYS_CHROOT, bad)
	sys("open_tree", unix.SYS_OPEN_TREE, neg, bad, 0)
	sys("open_tree_attr", unix.SYS_OPEN_TREE_ATTR, neg, bad, 0, 0, 0)
	sys("move_mount", unix.SYS_MOVE_MOUNT, neg, bad, neg, bad, 0)
	sys("fsopen", unix.SYS_FSOPEN, bad, 0)
	sys("fsconfig", unix.SYS_FSCONFIG, neg, 0, 0, 0, 0)
	sys("fsmount", unix.SYS_FSMOUNT, neg, 0, 0)
	sys("fspick", unix.SYS_FSPICK, neg, bad, 0)
	sys("mount_setattr", unix.SYS_MOUNT_SETATTR, neg, bad, 0, 0, 0)
	sys("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, neg, bad, 0)
	sys("name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT, neg, bad, bad, bad, 0)
	sys("unshare", unix.SYS_UNSHARE, 0) // succeeds (a no-op) unless filtered
	sys("setns", unix.SYS_SETNS, neg, 0)
	sys("clone3", unix.SYS_CLONE3, 0, 0) // EINVAL unless filtered
	sys("kexec_load", unix.SYS_KEXEC_LOAD, 0, 0x7fffffff, 0, 0)
	sys("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, neg, neg, 0, 0, 0xffffffff)
	sys("reboot", unix.SYS_REBOOT, 0, 0, 0, 0) // wrong magic: EINVAL unless filtered
	sys("init_module", unix.SYS_INIT_MODULE, bad, 0, bad)
	sys("finit_module", unix.SYS_FINIT_MODULE, neg, bad, 0)
	sys("delete_module", unix.SYS_DELETE_MODULE, bad, 0)
	sys("swapon", unix.SYS_SWAPON, bad, 0)
	sys("swapoff", unix.SYS_SWAPOFF, bad)
	sys("acct", unix.SYS_ACCT, bad)
	sys("quotactl", unix.SYS_QUOTACTL, 0xffffffff, 0, 0, 0)
	sys("quotactl_fd", unix.SYS_QUOTACTL_FD, neg, 0, 0, 0)
	sys("syslog", unix.SYS_SYSLOG, 9999, 0, 0)
	sys("settimeofday", unix.SYS_SETTIMEOFDAY, bad, bad)
	sys("clock_settime", unix.SYS_CLOCK_SETTIME, unix.CLOCK_MONOTONIC, bad)
	sys("clock_adjtime", unix.SYS_CLOCK_ADJTIME, 0x7fffffff, bad)
	sys("adjtimex", unix.SYS_ADJTIMEX, bad)
	sys("ioctl", unix.SYS_IOCTL, neg, unix.TIOCSTI, bad)
	sys("ioctl:TIOCLINUX", unix.SYS_IOCTL, neg, unix.TIOCLINUX, bad)
	sys("socket", unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	sys("socket:AF_ALG", unix.SYS_SOCKET, unix.AF_ALG, unix.SOCK_SEQPACKET, 0)
	archProbes(sys)
	for _, f := range []struct {
		name string
		flag uintptr
	}{{"NEWNS", unix.CLONE_NEWNS}, {"NEWCGROUP", unix.CLONE_NEWCGROUP}, {"NEWUTS", unix.CLONE_NEWUTS},
		{"NEWIPC", unix.CLONE_NEWIPC}, {"NEWUSER", unix.CLONE_NEWUSER}, {"NEWPID", unix.CLONE_NEWPID}, {"NEWNET", unix.CLONE_NEWNET}} {
		cmd := exec.Command("/proc/self/exe", "child")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: f.flag}
		err := cmd.Run()
		var e syscall.Errno
		switch {
		case err == nil:
			r.Errno["clone:CLONE_"+f.name] = 0
		case errors.As(err, &e):
			r.Errno["clone:CLONE_"+f.name] = int(e)
		default:
			r.Errno["clone:CLONE_"+f.name] = -1 // started, failed otherwise
		}
	}

	// What must keep working.
	allowed := func(name string, err error) {
		if err != nil {
			r.Allowed[name] = err.Error()
		} else {
			r.Allowed[name] = "ok"
		}
	}
	if pid, _, e := syscall.RawSyscall(unix.SYS_GETPID, 0, 0, 0); e != 0 || int(pid) != os.Getpid() {
		allowed("getpid", fmt.Errorf("getpid: %d, %v", pid, e))
	} else {
		allowed("getpid", nil)
	}
	out, err := exec.Command("/proc/self/exe", "child").Output() // clone(CLONE_VFORK|CLONE_VM|CLONE_PIDFD)
	if err == nil && string(out) != "child-ok\n" {
		err = fmt.Errorf("child said %q", out)
	}
	allowed("fork+exec", err)
	out, err = exec.Command("sh", "-c", "(echo sub) | cat").Output() // libc's fork and pipes
	if err == nil && string(out) != "sub\n" {
		err = fmt.Errorf("shell said %q", out)
	}
	allowed("shell", err)
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err == nil {
		unix.Close(fd)
	}
	allowed("pidfd_open", err)
	fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.Close(fd)
	}
	allowed("socket:AF_UNIX", err)
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err == nil {
		unix.Close(fd)
	}
	allowed("socket:AF_INET", err)
	// Another ioctl on a terminal: the pty pair of the probe's own.
	allowed("ioctl:TIOCGWINSZ", ptyIoctl())
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Seccomp:"); ok {
			r.Seccomp = strings.TrimSpace(v)
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// ptyIoctl opens a pseudo-terminal and reads its window size.
func ptyIoctl() error {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer ptmx.Close()
	if _, err := unix.IoctlGetWinsize(int(ptmx.Fd()), unix.TIOCGWINSZ); err != nil {
		return fmt.Errorf("TIOCGWINSZ: %w", err)
	}
	return nil
}
