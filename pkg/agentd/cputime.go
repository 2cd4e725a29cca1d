package agentd

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// maxSampledTasks bounds the processes one CPU sample reads: the daemon's
// processes (at most MaxProcesses) and their descendants, breadth first.
// A sandbox with more loses sight of the deepest ones, not its sample.
const maxSampledTasks = 4096

// statBufBytes is enough for any /proc/<pid>/stat (the command name is at
// most 64 bytes, the 52 numbers at most 21 digits each).
const statBufBytes = 2048

// cpuSampler tells whether the processes the daemon runs used CPU time
// between two samples. A sample reads /proc/<pid>/stat of each process it
// runs and, through /proc/<pid>/task/<tid>/children, of their
// descendants: user and system time, plus that of their children already
// waited for (so a child that ran and was reaped between two samples still
// counts). A process's count rising since the previous sample is use; so
// is a descendant that appeared since it, under a process sampled before,
// having used any time. A process the daemon started since the previous
// sample is only measured (its start is activity of its own), so that a
// process that only sleeps is never counted. Pids are matched with their
// start time, so a reused pid is a new process.
type cpuSampler struct {
	procRoot string // "/proc"

	mu    sync.Mutex
	prev  map[int]cpuTimes // the previous sample, by pid
	next  map[int]cpuTimes
	queue []sampleItem
	buf   [statBufBytes]byte
}

// cpuTimes is one process's sampled times, in clock ticks.
type cpuTimes struct {
	start uint64 // start time since boot, telling a reused pid apart
	ticks uint64 // utime + stime + cutime + cstime
}

// sampleItem is a process to sample: one the daemon runs (root), or a
// descendant of one; known says whether the process the daemon runs at
// the top of its tree was sampled the previous time.
type sampleItem struct {
	pid   int
	root  bool
	known bool
}

func newCPUSampler(procRoot string) *cpuSampler {
	return &cpuSampler{procRoot: procRoot, prev: map[int]cpuTimes{}, next: map[int]cpuTimes{}}
}

// sample reads the trees under roots (the pids of the processes the daemon
// runs) and reports whether any of them used CPU time since the previous
// sample. Processes that cannot be read (exited meanwhile) are skipped.
func (s *cpuSampler) sample(roots []int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.next)
	used := false
	q := s.queue[:0]
	for _, pid := range roots {
		q = append(q, sampleItem{pid: pid, root: true})
	}
	for i := 0; i < len(q) && len(s.next) < maxSampledTasks; i++ {
		it := q[i]
		if _, seen := s.next[it.pid]; seen {
			continue
		}
		t, threads, ok := s.readStat(it.pid)
		if !ok {
			continue
		}
		s.next[it.pid] = t
		old, had := s.prev[it.pid]
		had = had && old.start == t.start
		switch {
		case had && t.ticks > old.ticks:
			used = true
		case !had && it.known && t.ticks > 0:
			used = true // a new descendant of a sampled process
		}
		known := it.known
		if it.root {
			known = had
		}
		q = s.appendChildren(q, it.pid, threads, known)
	}
	s.queue = q[:0]
	s.prev, s.next = s.next, s.prev
	return used
}

// readStat reads a process's times and thread count.
func (s *cpuSampler) readStat(pid int) (cpuTimes, int, bool) {
	b, ok := s.read(fmt.Sprintf("%s/%d/stat", s.procRoot, pid))
	if !ok {
		return cpuTimes{}, 0, false
	}
	return parseStat(b)
}

// appendChildren appends pid's children to q: those of its main thread,
// and, for a process with more threads, those of every thread.
func (s *cpuSampler) appendChildren(q []sampleItem, pid, threads int, known bool) []sampleItem {
	tids := []string{strconv.Itoa(pid)}
	if threads > 1 {
		if ents, err := os.ReadDir(fmt.Sprintf("%s/%d/task", s.procRoot, pid)); err == nil {
			tids = tids[:0]
			for _, e := range ents {
				tids = append(tids, e.Name())
			}
		}
	}
	for _, tid := range tids {
		b, err := os.ReadFile(fmt.Sprintf("%s/%d/task/%s/children", s.procRoot, pid, tid))
		if err != nil {
			continue // exited, or a kernel without CONFIG_PROC_CHILDREN: the leaders alone
		}
		for f := range bytes.FieldsSeq(b) {
			if c, err := strconv.Atoi(string(f)); err == nil && c > 0 {
				q = append(q, sampleItem{pid: c, known: known})
			}
		}
	}
	return q
}

// read reads a small file into s.buf.
func (s *cpuSampler) read(path string) ([]byte, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	n, err := f.Read(s.buf[:])
	if err != nil || n == 0 {
		return nil, false
	}
	return s.buf[:n], true
}

// parseStat parses /proc/<pid>/stat (proc(5)): after the command name in
// parentheses, which may itself hold spaces and parentheses, come the
// fields from state (3) on; utime, stime, cutime and cstime are 14 to 17,
// num_threads 20, starttime 22.
func parseStat(b []byte) (cpuTimes, int, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return cpuTimes{}, 0, false
	}
	var f [20]uint64 // fields 3..22
	n := 0
	for w := range bytes.FieldsSeq(b[i+1:]) {
		if n == len(f) {
			break
		}
		if n > 0 { // field 3, the state, is a letter
			v, err := strconv.ParseInt(string(w), 10, 64)
			if err != nil {
				return cpuTimes{}, 0, false
			}
			f[n] = uint64(max(v, 0)) // cutime and cstime are signed
		}
		n++
	}
	if n < len(f) {
		return cpuTimes{}, 0, false
	}
	field := func(k int) uint64 { return f[k-3] }
	return cpuTimes{start: field(22), ticks: field(14) + field(15) + field(16) + field(17)}, int(field(20)), true
}
