// Package seccomp builds the seccomp filter that every bubblewrap sandbox
// of the local provider runs under: a classic BPF program, written by hand
// (no libseccomp, no cgo), that bwrap reads from a descriptor (--seccomp
// FD) and installs on the sandbox's first process just before it execs the
// daemon, so the daemon and everything it starts are filtered.
//
// The filter is a deny list on top of the namespaces bubblewrap sets up. It
// refuses the calls that reach past them (other processes' memory, the
// kernel keyring, kernel modules, mounts and new namespaces, the host's
// clock, ...) and the ones whose kernel code is a known exploit surface
// (bpf, perf_event_open, userfaultfd, io_uring). A root harness runs the
// daemon as real root with every capability (no user namespace, so that
// run_as accounts work): for sandbox processes that run as root, this
// filter is what keeps those capabilities from reaching the host. Denied
// calls fail with an errno (see Rules), never by killing the caller, so
// programs that probe for a feature fall back as on a kernel without it.
//
// The program first checks seccomp_data.arch: a call made through another
// architecture's entry point (int 0x80 on x86_64, AArch32 on arm64), whose
// numbers the deny list does not cover, kills the process; on x86_64 the
// x32 calls (numbers with bit 30 set) are refused. Only amd64 and arm64 are
// supported; on other architectures Program returns ErrUnsupported.
package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is returned for an architecture this package has no
// system call table for.
var ErrUnsupported = errors.New("seccomp: no filter for this architecture")

// Cond restricts a rule to calls whose argument Arg (its low 32 bits, all
// the kernel reads for the calls filtered this way) matches.
type Cond struct {
	// Arg is the argument's index (0 to 5).
	Arg int
	// AnyBits: the call is denied when the argument has any of these bits.
	AnyBits uint32
	// In: the call is denied when the argument is one of these values.
	In []uint32
	// NotIn: the call is denied when the argument is none of these values.
	NotIn []uint32
}

// Rule is one denied system call.
type Rule struct {
	// Name is the call's name as in the kernel's tables (and unix.SYS_*).
	Name string
	// Errno is what the denied call returns.
	Errno unix.Errno
	// Cond, when set, denies only the calls it matches; others are allowed.
	Cond *Cond
	// Why is one line of justification.
	Why string
}

// Namespace flags that clone must not be given: every CLONE_NEW* flag
// clone(2) accepts (CLONE_NEWTIME overlaps the exit signal there and is
// only valid for unshare and clone3, which are denied whole).
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Rules returns the deny list, in the order the filter checks it. Calls an
// architecture does not have (iopl and ioperm outside x86) are skipped
// there.
func Rules() []Rule {
	const eperm = unix.EPERM
	return []Rule{
		// Other processes.
		{Name: "ptrace", Errno: eperm, Why: "tracing reads and rewrites other processes of the same user (the daemon's, as root)"},
		{Name: "process_vm_readv", Errno: eperm, Why: "reads another process's memory"},
		{Name: "process_vm_writev", Errno: eperm, Why: "writes another process's memory"},
		{Name: "process_madvise", Errno: eperm, Why: "acts on another process's memory"},
		{Name: "pidfd_getfd", Errno: eperm, Why: "copies a descriptor out of another process"},
		{Name: "kcmp", Errno: eperm, Why: "compares kernel objects of other processes (kernel pointer order leak)"},
		{Name: "move_pages", Errno: eperm, Why: "moves another process's pages between NUMA nodes"},
		{Name: "migrate_pages", Errno: eperm, Why: "moves another process's pages between NUMA nodes"},
		// The kernel keyring is not namespaced.
		{Name: "keyctl", Errno: eperm, Why: "the kernel keyring is shared with the host (not namespaced)"},
		{Name: "add_key", Errno: eperm, Why: "the kernel keyring is shared with the host (not namespaced)"},
		{Name: "request_key", Errno: eperm, Why: "the kernel keyring is shared with the host; may upcall to host helpers"},
		// Kernel attack surface.
		{Name: "bpf", Errno: eperm, Why: "eBPF programs and maps: large kernel attack surface, tracing of the host"},
		{Name: "perf_event_open", Errno: eperm, Why: "profiling: long CVE history, leaks kernel addresses"},
		{Name: "userfaultfd", Errno: eperm, Why: "stalls kernel page faults: the usual tool for winning kernel races"},
		{Name: "io_uring_setup", Errno: eperm, Why: "io_uring: a large source of kernel exploits, bypasses this filter's view of calls"},
		{Name: "io_uring_enter", Errno: eperm, Why: "io_uring (see io_uring_setup)"},
		{Name: "io_uring_register", Errno: eperm, Why: "io_uring (see io_uring_setup)"},
		{Name: "fanotify_init", Errno: eperm, Why: "watches file access on whole mounts, the host's read-only root included"},
		// Mounts: the sandbox's view of the file system is bubblewrap's.
		{Name: "mount", Errno: eperm, Why: "would remount or uncover what bubblewrap set up (read-only root, hidden state directory)"},
		{Name: "umount2", Errno: eperm, Why: "would uncover what the tmpfs mounts hide"},
		{Name: "pivot_root", Errno: eperm, Why: "changes the root mount"},
		{Name: "chroot", Errno: eperm, Why: "changes the root directory; nothing in a sandbox needs it"},
		{Name: "open_tree", Errno: eperm, Why: "new mount API: clones mounts"},
		{Name: "open_tree_attr", Errno: eperm, Why: "new mount API: clones mounts with new attributes"},
		{Name: "move_mount", Errno: eperm, Why: "new mount API: attaches mounts"},
		{Name: "fsopen", Errno: eperm, Why: "new mount API: creates file system contexts"},
		{Name: "fsconfig", Errno: eperm, Why: "new mount API: configures file system contexts"},
		{Name: "fsmount", Errno: eperm, Why: "new mount API: creates mounts"},
		{Name: "fspick", Errno: eperm, Why: "new mount API: reconfigures existing mounts (e.g. read-only to read-write)"},
		{Name: "mount_setattr", Errno: eperm, Why: "new mount API: changes mount flags (read-only, nosuid, idmaps)"},
		{Name: "open_by_handle_at", Errno: eperm, Why: "opens files by handle, past bind mounts and tmpfs covers (the 'shocker' escape)"},
		{Name: "name_to_handle_at", Errno: eperm, Why: "makes the handles open_by_handle_at takes; leaks inode identities"},
		// Namespaces: bubblewrap made them; nested ones widen the kernel's attack surface.
		{Name: "unshare", Errno: eperm, Why: "new namespaces (user namespaces above all: a large kernel attack surface)"},
		{Name: "setns", Errno: eperm, Why: "joins other namespaces"},
		{Name: "clone", Errno: eperm, Cond: &Cond{Arg: 0, AnyBits: cloneNamespaceFlags},
			Why: "new namespaces through clone; plain fork, threads and pidfds stay allowed"},
		{Name: "clone3", Errno: unix.ENOSYS, Why: "its flags are behind a pointer seccomp cannot read: ENOSYS makes libc fall back to clone"},
		// The machine: the sandbox's root keeps capabilities over it.
		{Name: "kexec_load", Errno: eperm, Why: "loads a new kernel"},
		{Name: "kexec_file_load", Errno: eperm, Why: "loads a new kernel"},
		{Name: "reboot", Errno: eperm, Why: "reboots or halts the machine"},
		{Name: "init_module", Errno: eperm, Why: "loads kernel code"},
		{Name: "finit_module", Errno: eperm, Why: "loads kernel code"},
		{Name: "delete_module", Errno: eperm, Why: "unloads kernel modules"},
		{Name: "swapon", Errno: eperm, Why: "changes the host's swap"},
		{Name: "swapoff", Errno: eperm, Why: "changes the host's swap"},
		{Name: "acct", Errno: eperm, Why: "process accounting: writes a record of every exit to a file"},
		{Name: "quotactl", Errno: eperm, Why: "reads and sets disk quotas of the host's file systems"},
		{Name: "quotactl_fd", Errno: eperm, Why: "reads and sets disk quotas of the host's file systems"},
		{Name: "syslog", Errno: eperm, Why: "the kernel log (dmesg): host events and kernel addresses"},
		{Name: "iopl", Errno: eperm, Why: "raw I/O port access (x86)"},
		{Name: "ioperm", Errno: eperm, Why: "raw I/O port access (x86)"},
		{Name: "settimeofday", Errno: eperm, Why: "sets the host's clock (time is not namespaced)"},
		{Name: "clock_settime", Errno: eperm, Why: "sets the host's clock"},
		{Name: "clock_adjtime", Errno: eperm, Why: "adjusts the host's clock"},
		{Name: "adjtimex", Errno: eperm, Why: "adjusts the host's clock"},
		// Terminals.
		{Name: "ioctl", Errno: eperm, Cond: &Cond{Arg: 1, In: []uint32{unix.TIOCSTI, unix.TIOCLINUX}},
			Why: "TIOCSTI and TIOCLINUX push input into a terminal (CVE-2017-5226); other ioctls stay allowed"},
		// Sockets: the network namespace does not cover every family.
		{Name: "socket", Errno: unix.EAFNOSUPPORT,
			Cond: &Cond{Arg: 0, NotIn: []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK, unix.AF_PACKET}},
			Why:  "only local, IP, netlink and packet sockets: AF_VSOCK reaches a VM's host past the network namespace, and rare families autoload kernel modules"},
	}
}

// seccomp_data offsets (include/uapi/linux/seccomp.h).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32SyscallBit marks x32 system calls on x86_64.
const x32SyscallBit = 0x40000000

// Program returns the filter for the running architecture.
func Program() ([]unix.SockFilter, error) {
	a, ok := native()
	if !ok {
		return nil, fmt.Errorf("%w (%s)", ErrUnsupported, runtime.GOARCH)
	}
	return build(a, Rules())
}

// arch is what the filter needs to know of an architecture.
type arch struct {
	name  string
	audit uint32 // AUDIT_ARCH_*
	x32   bool   // refuse numbers with x32SyscallBit
	// sysnum returns a call's number, false when the architecture lacks it.
	sysnum func(name string) (uint32, bool)
}

// argLow is the offset of the low 32 bits of argument i in seccomp_data
// (the supported architectures are little-endian).
func argLow(i int) uint32 { return uint32(offArgs + 8*i) }

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

const (
	ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	retK   = unix.BPF_RET | unix.BPF_K
)

func retErrno(e unix.Errno) unix.SockFilter {
	return stmt(retK, unix.SECCOMP_RET_ERRNO|(uint32(e)&unix.SECCOMP_RET_DATA))
}

// build assembles the program: the architecture check, the x32 check, then
// per rule a comparison of the call number and, for conditional rules, of
// an argument. Each call appears in at most one rule, so a conditional
// rule whose condition fails allows the call outright.
func build(a arch, rules []Rule) ([]unix.SockFilter, error) {
	prog := []unix.SockFilter{
		stmt(ldAbsW, offArch),
		jump(jeqK, a.audit, 1, 0),
		stmt(retK, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(ldAbsW, offNr),
	}
	if a.x32 {
		prog = append(prog, jump(jgeK, x32SyscallBit, 0, 1), retErrno(unix.EPERM))
	}
	seen := map[uint32]string{}
	for _, r := range rules {
		nr, ok := a.sysnum(r.Name)
		if !ok {
			continue
		}
		if prev, dup := seen[nr]; dup {
			return nil, fmt.Errorf("seccomp: %s and %s are both call %d on %s", prev, r.Name, nr, a.name)
		}
		seen[nr] = r.Name
		body, err := ruleBody(r)
		if err != nil {
			return nil, err
		}
		if len(body) > 255 {
			return nil, fmt.Errorf("seccomp: rule %s is too long", r.Name)
		}
		prog = append(prog, jump(jeqK, nr, 0, uint8(len(body))))
		prog = append(prog, body...)
	}
	prog = append(prog, stmt(retK, unix.SECCOMP_RET_ALLOW))
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program of %d instructions exceeds the kernel's %d", len(prog), unix.BPF_MAXINSNS)
	}
	return prog, nil
}

// ruleBody returns the instructions run once the call number matched. It
// ends with the deny return and, for a conditional rule, the allow return.
func ruleBody(r Rule) ([]unix.SockFilter, error) {
	deny := retErrno(r.Errno)
	c := r.Cond
	if c == nil {
		return []unix.SockFilter{deny}, nil
	}
	if c.Arg < 0 || c.Arg > 5 {
		return nil, fmt.Errorf("seccomp: rule %s: argument %d out of range", r.Name, c.Arg)
	}
	allow := stmt(retK, unix.SECCOMP_RET_ALLOW)
	load := stmt(ldAbsW, argLow(c.Arg))
	n := len(c.In) + len(c.NotIn)
	switch {
	case c.AnyBits != 0 && n == 0:
		// jset: any bit -> deny, else allow.
		return []unix.SockFilter{load, jump(jsetK, c.AnyBits, 0, 1), deny, allow}, nil
	case len(c.In) > 0 && c.AnyBits == 0 && len(c.NotIn) == 0:
		// Each match jumps to deny, which follows the last comparison;
		// the last one falls through to allow on no match.
		out := []unix.SockFilter{load}
		for i, v := range c.In {
			left := len(c.In) - 1 - i // comparisons after this one
			if i == len(c.In)-1 {
				out = append(out, jump(jeqK, v, 0, 1))
			} else {
				out = append(out, jump(jeqK, v, uint8(left), 0))
			}
		}
		return append(out, deny, allow), nil
	case len(c.NotIn) > 0 && c.AnyBits == 0 && len(c.In) == 0:
		// Each match jumps to allow, which follows deny.
		out := []unix.SockFilter{load}
		for i, v := range c.NotIn {
			left := len(c.NotIn) - 1 - i
			out = append(out, jump(jeqK, v, uint8(left+1), 0))
		}
		return append(out, deny, allow), nil
	}
	return nil, fmt.Errorf("seccomp: rule %s: a condition takes exactly one of AnyBits, In, NotIn", r.Name)
}

// Marshal encodes a program as the kernel's struct sock_filter array in
// native byte order: what bwrap --seccomp reads.
func Marshal(prog []unix.SockFilter) []byte {
	b := make([]byte, 0, len(prog)*unix.SizeofSockFilter)
	for _, f := range prog {
		b = binary.NativeEndian.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = binary.NativeEndian.AppendUint32(b, f.K)
	}
	return b
}

// File returns a sealed, read-only-content memfd holding the marshalled
// filter for the running architecture, positioned at its start, to be
// inherited by bwrap (--seccomp FD). The caller closes it once bwrap is
// started.
func File() (*os.File, error) {
	prog, err := Program()
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("bulkhead-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("seccomp: memfd for the filter: %w", err)
	}
	f := os.NewFile(uintptr(fd), "bulkhead-seccomp")
	if _, err := f.Write(Marshal(prog)); err != nil {
		f.Close()
		return nil, fmt.Errorf("seccomp: write the filter: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("seccomp: seal the filter: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("seccomp: rewind the filter: %w", err)
	}
	return f, nil
}
