package seccomp

import (
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// call is a synthetic seccomp_data: the fields the filter reads.
type call struct {
	arch uint32
	nr   uint32
	args [6]uint64
}

// input lays a call out as seccomp_data for x/net/bpf's VM. The VM's
// 32-bit loads read big-endian, the kernel's native-endian: each 32-bit
// word goes at its little-endian offset, written big-endian, so that every
// load the filter makes sees the value the kernel would give it.
func (c call) input() []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], c.nr)
	binary.BigEndian.PutUint32(b[offArch:], c.arch)
	for i, a := range c.args {
		binary.BigEndian.PutUint32(b[argLow(i):], uint32(a))
		binary.BigEndian.PutUint32(b[argLow(i)+4:], uint32(a>>32))
	}
	return b
}

// vm runs a raw program on x/net/bpf's VM (an independent interpreter).
func vm(t *testing.T, prog []unix.SockFilter) func(call) uint32 {
	t.Helper()
	ins := make([]bpf.Instruction, len(prog))
	for i, f := range prog {
		ins[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}.Disassemble()
		if _, raw := ins[i].(bpf.RawInstruction); raw {
			t.Fatalf("instruction %d (%+v) is not valid classic BPF", i, f)
		}
	}
	m, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatalf("the VM refuses the program: %v", err)
	}
	return func(c call) uint32 {
		t.Helper()
		ret, err := m.Run(c.input())
		if err != nil {
			t.Fatalf("run %+v: %v", c, err)
		}
		return uint32(ret)
	}
}

func errnoRet(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }

const allow = unix.SECCOMP_RET_ALLOW

func nativeArch(t *testing.T) arch {
	t.Helper()
	a, ok := native()
	if !ok {
		testenv.Skip(t, "no seccomp filter for "+runtime.GOARCH)
	}
	return a
}

// allowedCalls are calls the filter must let through, with their numbers
// on the architecture the test runs on.
func allowedCalls() map[string]uint32 {
	return map[string]uint32{
		"getpid":            unix.SYS_GETPID,
		"read":              unix.SYS_READ,
		"write":             unix.SYS_WRITE,
		"openat":            unix.SYS_OPENAT,
		"mmap":              unix.SYS_MMAP,
		"futex":             unix.SYS_FUTEX,
		"execve":            unix.SYS_EXECVE,
		"wait4":             unix.SYS_WAIT4,
		"waitid":            unix.SYS_WAITID,
		"setuid":            unix.SYS_SETUID,
		"setgid":            unix.SYS_SETGID,
		"setgroups":         unix.SYS_SETGROUPS,
		"setresuid":         unix.SYS_SETRESUID,
		"setresgid":         unix.SYS_SETRESGID,
		"setfsuid":          unix.SYS_SETFSUID,
		"setfsgid":          unix.SYS_SETFSGID,
		"capset":            unix.SYS_CAPSET,
		"capget":            unix.SYS_CAPGET,
		"prctl":             unix.SYS_PRCTL,
		"pidfd_open":        unix.SYS_PIDFD_OPEN,
		"pidfd_send_signal": unix.SYS_PIDFD_SEND_SIGNAL,
		"kill":              unix.SYS_KILL,
		"setsid":            unix.SYS_SETSID,
		"setpgid":           unix.SYS_SETPGID,
		"epoll_pwait":       unix.SYS_EPOLL_PWAIT,
		"rt_sigaction":      unix.SYS_RT_SIGACTION,
		"seccomp":           unix.SYS_SECCOMP,
	}
}

func nr(t *testing.T, a arch, name string) uint32 {
	t.Helper()
	n, ok := a.sysnum(name)
	if !ok {
		n, ok = allowedCalls()[name]
	}
	if !ok {
		t.Fatalf("%s has no %s", a.name, name)
	}
	return n
}

// Every denied call is refused with its errno; calls the daemon and the
// processes it runs need are allowed.
func TestProgramDeniesAndAllows(t *testing.T) {
	a := nativeArch(t)
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	run := vm(t, prog)
	for _, r := range Rules() {
		n, ok := a.sysnum(r.Name)
		if !ok {
			if r.Name != "iopl" && r.Name != "ioperm" || a.name == "amd64" {
				t.Errorf("%s has no number on %s", r.Name, a.name)
			}
			continue
		}
		if r.Why == "" || strings.Contains(r.Why, "\n") {
			t.Errorf("%s: want one line of why", r.Name)
		}
		if r.Cond != nil {
			continue // below
		}
		if got := run(call{arch: a.audit, nr: n}); got != errnoRet(r.Errno) {
			t.Errorf("%s: got %#x, want errno %d", r.Name, got, r.Errno)
		}
	}
	if got := run(call{arch: a.audit, nr: nr(t, a, "clone3")}); got != errnoRet(unix.ENOSYS) {
		t.Errorf("clone3: got %#x, want ENOSYS", got)
	}
	for name, n := range allowedCalls() {
		if got := run(call{arch: a.audit, nr: n}); got != allow {
			t.Errorf("%s: got %#x, want allowed", name, got)
		}
	}
}

// clone is refused with any namespace flag and allowed without: fork,
// vfork with a pidfd (os/exec), threads.
func TestProgramCloneFlags(t *testing.T) {
	a := nativeArch(t)
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	run := vm(t, prog)
	clone := nr(t, a, "clone")
	for _, f := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
		unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET} {
		for _, with := range []uint64{0, uint64(unix.SIGCHLD), unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD, 0xffffffff_00000000} {
			if got := run(call{arch: a.audit, nr: clone, args: [6]uint64{f | with}}); got != errnoRet(unix.EPERM) {
				t.Errorf("clone(%#x): got %#x, want EPERM", f|with, got)
			}
		}
	}
	threads := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM |
		unix.CLONE_THREAD | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID)
	for _, f := range []uint64{
		uint64(unix.SIGCHLD), // fork
		unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD | uint64(unix.SIGCHLD), // os/exec
		threads,
		0xffffffff_00000000 | uint64(unix.SIGCHLD), // the kernel reads only the low 32 bits of clone's flags
	} {
		if got := run(call{arch: a.audit, nr: clone, args: [6]uint64{f}}); got != allow {
			t.Errorf("clone(%#x): got %#x, want allowed", f, got)
		}
	}
	// The flags are argument 0 on amd64 and arm64: others do not count.
	if got := run(call{arch: a.audit, nr: clone, args: [6]uint64{uint64(unix.SIGCHLD), unix.CLONE_NEWUSER}}); got != allow {
		t.Errorf("clone with CLONE_NEWUSER in argument 1: got %#x, want allowed", got)
	}
}

// ioctl: only the input-injecting requests; socket: only the listed
// families.
func TestProgramArgumentRules(t *testing.T) {
	a := nativeArch(t)
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	run := vm(t, prog)
	ioctl, socket := nr(t, a, "ioctl"), nr(t, a, "socket")
	for req, want := range map[uint64]uint32{
		unix.TIOCSTI:                 errnoRet(unix.EPERM),
		unix.TIOCLINUX:               errnoRet(unix.EPERM),
		1<<32 | unix.TIOCSTI:         errnoRet(unix.EPERM), // cmd is an unsigned int
		unix.TIOCSWINSZ:              allow,
		unix.TIOCGWINSZ:              allow,
		unix.TIOCSCTTY:               allow,
		unix.TCGETS:                  allow,
		uint64(unix.TIOCGPTN):        allow,
		uint64(unix.TIOCSPTLCK):      allow,
		uint64(unix.TIOCSTI) + 1<<16: allow,
	} {
		if got := run(call{arch: a.audit, nr: ioctl, args: [6]uint64{3, req}}); got != want {
			t.Errorf("ioctl(3, %#x): got %#x, want %#x", req, got, want)
		}
	}
	for family, want := range map[uint64]uint32{
		unix.AF_UNIX:    allow,
		unix.AF_INET:    allow,
		unix.AF_INET6:   allow,
		unix.AF_NETLINK: allow,
		unix.AF_PACKET:  allow,
		unix.AF_VSOCK:   errnoRet(unix.EAFNOSUPPORT),
		unix.AF_ALG:     errnoRet(unix.EAFNOSUPPORT),
		unix.AF_KEY:     errnoRet(unix.EAFNOSUPPORT),
		unix.AF_TIPC:    errnoRet(unix.EAFNOSUPPORT),
	} {
		if got := run(call{arch: a.audit, nr: socket, args: [6]uint64{family, unix.SOCK_STREAM}}); got != want {
			t.Errorf("socket(%d): got %#x, want %#x", family, got, want)
		}
	}
}

// A call made through another architecture's entry point kills the
// process, whatever its number; x32 calls are refused on amd64.
func TestProgramArchitectures(t *testing.T) {
	a := nativeArch(t)
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	run := vm(t, prog)
	getpid := nr(t, a, "getpid")
	for _, foreign := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_AARCH64,
		unix.AUDIT_ARCH_RISCV64, unix.AUDIT_ARCH_PPC64LE, 0} {
		if foreign == a.audit {
			continue
		}
		for _, n := range []uint32{0, getpid, 20, 39, 172, x32SyscallBit | getpid} {
			if got := run(call{arch: foreign, nr: n}); got != unix.SECCOMP_RET_KILL_PROCESS {
				t.Errorf("arch %#x call %d: got %#x, want kill", foreign, n, got)
			}
		}
	}
	x32 := run(call{arch: a.audit, nr: x32SyscallBit | getpid})
	switch a.name {
	case "amd64":
		if x32 != errnoRet(unix.EPERM) {
			t.Errorf("x32 getpid: got %#x, want EPERM", x32)
		}
		if got := run(call{arch: a.audit, nr: x32SyscallBit + 521}); got != errnoRet(unix.EPERM) { // x32 ptrace
			t.Errorf("x32 ptrace: got %#x, want EPERM", got)
		}
	default:
		if x32 != allow {
			t.Errorf("call %#x: got %#x, want allowed (no x32 here)", x32SyscallBit|getpid, x32)
		}
	}
}

// The builder's own checks, on a made-up architecture.
func TestBuild(t *testing.T) {
	fake := arch{name: "fake", audit: 7, sysnum: func(name string) (uint32, bool) {
		n, ok := map[string]uint32{"a": 1, "b": 2, "c": 1}[name]
		return n, ok
	}}
	if _, err := build(fake, []Rule{{Name: "a", Errno: unix.EPERM}, {Name: "c", Errno: unix.EPERM}}); err == nil || !strings.Contains(err.Error(), "both call 1") {
		t.Errorf("duplicate numbers: %v", err)
	}
	if _, err := build(fake, []Rule{{Name: "a", Cond: &Cond{Arg: 6, AnyBits: 1}}}); err == nil {
		t.Error("argument 6 accepted")
	}
	if _, err := build(fake, []Rule{{Name: "a", Cond: &Cond{Arg: 0, AnyBits: 1, In: []uint32{2}}}}); err == nil {
		t.Error("a condition with two tests accepted")
	}
	prog, err := build(fake, []Rule{
		{Name: "a", Errno: unix.EPERM, Cond: &Cond{Arg: 2, In: []uint32{5}}},
		{Name: "b", Errno: unix.EACCES, Cond: &Cond{Arg: 5, NotIn: []uint32{9}}},
		{Name: "missing", Errno: unix.EPERM},
	})
	if err != nil {
		t.Fatal(err)
	}
	run := vm(t, prog)
	for _, tc := range []struct {
		c    call
		want uint32
	}{
		{call{arch: 7, nr: 1, args: [6]uint64{0, 0, 5}}, errnoRet(unix.EPERM)},
		{call{arch: 7, nr: 1, args: [6]uint64{0, 0, 6}}, allow},
		{call{arch: 7, nr: 1, args: [6]uint64{5, 5, 0, 5, 5, 5}}, allow},
		{call{arch: 7, nr: 2, args: [6]uint64{5: 9}}, allow},
		{call{arch: 7, nr: 2, args: [6]uint64{5: 8}}, errnoRet(unix.EACCES)},
		{call{arch: 7, nr: 3}, allow},
		{call{arch: 7, nr: x32SyscallBit | 1, args: [6]uint64{2: 5}}, allow},
		{call{arch: 8, nr: 3}, unix.SECCOMP_RET_KILL_PROCESS},
	} {
		if got := run(tc.c); got != tc.want {
			t.Errorf("%+v: got %#x, want %#x", tc.c, got, tc.want)
		}
	}
}

func TestMarshal(t *testing.T) {
	prog := []unix.SockFilter{{Code: 0x15, Jt: 1, Jf: 2, K: 0xc000003e}, {Code: 6, K: 0x7fff0000}}
	b := Marshal(prog)
	if len(b) != 2*unix.SizeofSockFilter {
		t.Fatalf("%d bytes", len(b))
	}
	if binary.NativeEndian.Uint16(b) != 0x15 || b[2] != 1 || b[3] != 2 || binary.NativeEndian.Uint32(b[4:]) != 0xc000003e ||
		binary.NativeEndian.Uint32(b[12:]) != 0x7fff0000 {
		t.Errorf("encoded %x", b)
	}
}

// File holds the marshalled program, sealed, from its start.
func TestFile(t *testing.T) {
	nativeArch(t)
	f, err := File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	want := Marshal(prog)
	got := make([]byte, len(want)+1)
	n, _ := f.Read(got)
	if string(got[:n]) != string(want) {
		t.Errorf("read %d bytes, want the %d of the program", n, len(want))
	}
	if _, err := f.WriteAt([]byte{0}, 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("write to the sealed filter: %v", err)
	}
}
