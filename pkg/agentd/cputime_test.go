package agentd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// statLine is a /proc/<pid>/stat line with the given command name, times
// (utime, stime, cutime, cstime), thread count and start time.
func statLine(comm string, utime, stime, cutime, cstime, threads, start int) string {
	return fmt.Sprintf("42 (%s) S 1 42 42 0 -1 4194304 100 0 0 0 %d %d %d %d 20 0 %d 0 %d 5000000 300 18446744073709551615\n",
		comm, utime, stime, cutime, cstime, threads, start)
}

func TestParseStat(t *testing.T) {
	got, threads, ok := parseStat([]byte(statLine("a (weird) name) x", 3, 4, 5, 6, 2, 777)))
	if !ok || got != (cpuTimes{start: 777, ticks: 18}) || threads != 2 {
		t.Fatalf("parseStat: %+v, %d threads, ok %v", got, threads, ok)
	}
	for _, bad := range []string{"", "42 no parenthesis", "42 (sh) S 1 2 3", "42 (sh) S 1 42 42 0 -1 x 100 0 0 0 1 2 3 4 20 0 1 0 9"} {
		if _, _, ok := parseStat([]byte(bad)); ok {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

// fakeProc is a /proc tree of stat and children files in a directory.
type fakeProc struct {
	t    *testing.T
	root string
}

func (f fakeProc) set(pid, ticks, start int, children ...int) {
	f.t.Helper()
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	if err := os.MkdirAll(filepath.Join(dir, "task", fmt.Sprint(pid)), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(statLine("sh", ticks, 0, 0, 0, 1, start)), 0o644); err != nil {
		f.t.Fatal(err)
	}
	var kids []string
	for _, c := range children {
		kids = append(kids, fmt.Sprint(c))
	}
	if err := os.WriteFile(filepath.Join(dir, "task", fmt.Sprint(pid), "children"), []byte(strings.Join(kids, " ")), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f fakeProc) gone(pid int) {
	if err := os.RemoveAll(filepath.Join(f.root, fmt.Sprint(pid))); err != nil {
		f.t.Fatal(err)
	}
}

// The sampler counts a rise of a known process's CPU time and a new
// descendant's use under a known process; it only measures a process the
// daemon just started, and a reused pid is a new process.
func TestCPUSampler(t *testing.T) {
	p := fakeProc{t, t.TempDir()}
	s := newCPUSampler(p.root)
	p.set(10, 5, 100, 11)
	p.set(11, 7, 101)
	if s.sample([]int{10}) {
		t.Fatal("the first sample of a process counted its start-up")
	}
	if s.sample([]int{10}) {
		t.Fatal("nothing changed, yet use was seen")
	}
	p.set(11, 8, 101) // a descendant works
	if !s.sample([]int{10}) {
		t.Fatal("a descendant's rise was not seen")
	}
	p.set(10, 5, 100, 11, 12) // a new child that already worked
	p.set(12, 1, 150)
	if !s.sample([]int{10}) {
		t.Fatal("a new descendant's use was not seen")
	}
	p.set(10, 5, 100, 11)
	p.gone(12)
	if s.sample([]int{10}) {
		t.Fatal("a child's exit counted as use")
	}
	p.set(10, 2, 999) // pid 10 reused by a process the daemon just started
	if s.sample([]int{10}) {
		t.Fatal("a reused pid was compared with the old process")
	}
	p.set(20, 0, 200, 21) // another new process whose child starts working
	p.set(21, 3, 201)
	if s.sample([]int{10, 20}) {
		t.Fatal("a new process's tree counted")
	}
	p.set(21, 3, 201)
	p.gone(21)
	p.set(20, 0, 200)
	if s.sample([]int{10, 20, 30}) { // 30 does not exist: skipped
		t.Fatal("an exited descendant or a missing process counted")
	}
}

// The real /proc: the test's own process is read.
func TestCPUSamplerReadsProc(t *testing.T) {
	s := newCPUSampler("/proc")
	s.sample([]int{os.Getpid()})
	if _, ok := s.prev[os.Getpid()]; !ok {
		t.Fatal("the test process was not sampled from /proc")
	}
}
