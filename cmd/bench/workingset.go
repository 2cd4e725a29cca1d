package main

// Idle working set: of the pages an idle process has resident, which does
// it touch? Writing "1" to /proc/PID/clear_refs clears the referenced bit
// of every page it maps; after a wait, the "Referenced:" lines of
// /proc/PID/smaps sum the pages used since. Resident but unreferenced file
// pages are mostly the kernel's fault-around reading the binary ahead of
// what start-up touched.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// workingSetWait is how long an idle process is watched after its
// referenced bits were cleared.
const workingSetWait = 5 * time.Second

// pageUse is resident and referenced memory, in KiB, split into anonymous
// mappings (heap, stacks, the Go runtime's arenas, .bss) and file-backed
// ones (for a static binary: the executable's text, rodata and data).
// Within a private file mapping, written (copied) pages count as file.
type pageUse struct {
	anonRSS, anonRef int64
	fileRSS, fileRef int64
}

func (u pageUse) ref() int64 { return u.anonRef + u.fileRef }
func (u pageUse) rss() int64 { return u.anonRSS + u.fileRSS }

func (u pageUse) String() string {
	return fmt.Sprintf("%.1f MiB referenced of %.1f MiB resident (anon %.1f of %.1f, file %.1f of %.1f)",
		kib(u.ref()), kib(u.rss()), kib(u.anonRef), kib(u.anonRSS), kib(u.fileRef), kib(u.fileRSS))
}

func kib(n int64) float64 { return float64(n) / 1024 }

// parseSmaps sums Rss and Referenced over the mappings of an smaps file,
// a mapping being anonymous when its header's inode is 0.
//
// The kernel counts a page as referenced when this process's page table
// entry says so, or when the page itself is marked accessed, which
// another process mapping the same file (another start of the same
// binary, every user of libc) does too: the bench starts no other
// process of the binary measured while it waits.
func parseSmaps(smaps []byte) (pageUse, error) {
	var u pageUse
	file, seen := false, false
	s := bufio.NewScanner(bytes.NewReader(smaps))
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if isMappingHeader(f) {
			file, seen = f[4] != "0", true
			continue
		}
		if !seen || len(f) < 2 || (f[0] != "Rss:" && f[0] != "Referenced:") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return pageUse{}, fmt.Errorf("smaps: %q: %w", line, err)
		}
		switch {
		case f[0] == "Rss:" && file:
			u.fileRSS += n
		case f[0] == "Rss:":
			u.anonRSS += n
		case file:
			u.fileRef += n
		default:
			u.anonRef += n
		}
	}
	if err := s.Err(); err != nil {
		return pageUse{}, err
	}
	if !seen {
		return pageUse{}, fmt.Errorf("smaps: no mapping")
	}
	return u, nil
}

// isMappingHeader reports whether the fields of an smaps line are a
// mapping's header ("start-end perms offset dev inode [path]") rather
// than one of its "Key: value" lines.
func isMappingHeader(f []string) bool {
	if len(f) < 5 || strings.HasSuffix(f[0], ":") {
		return false
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok || !isHex(lo) || !isHex(hi) || len(f[1]) != 4 {
		return false
	}
	_, err := strconv.ParseUint(f[4], 10, 64)
	return err == nil
}

func isHex(s string) bool {
	_, err := strconv.ParseUint(s, 16, 64)
	return s != "" && err == nil
}

// clearRefs clears the referenced bits of every page pid maps.
func clearRefs(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("1"), 0)
}

// readPageUse reads pid's smaps.
func readPageUse(pid int) (pageUse, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return pageUse{}, err
	}
	return parseSmaps(b)
}

// idleWorkingSets clears the referenced bits of each pid at once, waits
// wait, and reads what each referenced since. A process whose bits could
// not be cleared (another user's, without the right) gets an error, said
// as "n/a (why)" in the table, and does not fail the others.
func idleWorkingSets(pids []int, wait time.Duration) ([]pageUse, []error) {
	uses, errs := make([]pageUse, len(pids)), make([]error, len(pids))
	for i, pid := range pids {
		errs[i] = clearRefs(pid)
	}
	time.Sleep(wait)
	for i, pid := range pids {
		if errs[i] == nil {
			uses[i], errs[i] = readPageUse(pid)
		}
	}
	return uses, errs
}

// workingSetCell is a table cell: the figure, or n/a with the reason.
func workingSetCell(u pageUse, err error) string {
	if err != nil {
		return "n/a (" + err.Error() + ")"
	}
	return u.String()
}

// workingSetRows are the idle working set of the daemon (pid) beside
// grpcfloor's (floorPID; 0: no floor) over two windows of workingSetWait
// one after the other: the first, right after start-up, includes the
// daemon giving memory back once start-up's calls are over
// (--reclaim-idle); the second is the steady idle state.
func workingSetRows(pid, floorPID int) []row {
	pids := []int{pid}
	if floorPID != 0 {
		pids = append(pids, floorPID)
	}
	var rows []row
	for i, when := range []string{"first", "next"} {
		uses, errs := idleWorkingSets(pids, workingSetWait)
		r := row{
			figure: fmt.Sprintf("sandbox-agentd idle working set, %s %s: pages referenced since clearing the referenced bits (/proc/PID/clear_refs), client connected", when, workingSetWait),
			value:  workingSetCell(uses[0], errs[0]),
		}
		if i == 0 {
			r.figure += " (includes the reclaim after start-up's calls)"
		}
		if floorPID != 0 {
			r.baseline = workingSetCell(uses[1], errs[1]) + " (grpcfloor)"
			if errs[0] == nil && errs[1] == nil {
				r.ratio = refRatio(uses[0], uses[1])
			}
		}
		rows = append(rows, r)
		if errs[0] != nil && (floorPID == 0 || errs[1] != nil) {
			break // n/a once is enough
		}
	}
	return rows
}

// refRatio compares referenced totals: a ratio, or the difference when the
// baseline touched next to nothing (a ratio to a few KiB says nothing).
func refRatio(u, base pageUse) string {
	if base.ref() < 256 {
		return fmt.Sprintf("%+.1f MiB", kib(u.ref()-base.ref()))
	}
	return fmt.Sprintf("%.2fx", float64(u.ref())/float64(base.ref()))
}
