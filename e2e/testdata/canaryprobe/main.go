// Command canaryprobe is the secret-canary attack the e2e tests run inside
// a sandbox: for every process it can see, it tries to read the
// environment, the command line, the memory (every readable mapping) and
// the open files, and looks for the canary's prefix; of itself, the
// environment and the command line. It prints what it could read and
// where the canary was found, never the canary itself.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Per-process read bounds, so the probe ends in seconds.
const (
	maxMemBytes  = 512 << 20
	maxFileBytes = 16 << 20
)

func main() {
	// Built at run time so this process's own command line and the
	// probe's binary do not hold the prefix in one piece.
	prefix := []byte(strings.Join([]string{"bulkhead", "canary", ""}, "-"))
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		fmt.Println("probe error:", err)
		os.Exit(1)
	}
	var seen, envRead, memRead, fdRead int
	var found []string
	// This process's own environment and command line: a credential put
	// into the sandbox's environment reaches every process started there,
	// this one too (a shell may exec it in its own place, leaving no other
	// process that holds it). Its memory is not searched: the prefix is in
	// it.
	if env, err := os.ReadFile("/proc/self/environ"); err == nil && bytes.Contains(env, prefix) {
		found = append(found, fmt.Sprintf("pid %d (self) environ", self))
	}
	if cmdline, err := os.ReadFile("/proc/self/cmdline"); err == nil && bytes.Contains(cmdline, prefix) {
		found = append(found, fmt.Sprintf("pid %d (self) cmdline", self))
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		seen++
		dir := filepath.Join("/proc", e.Name())
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		name := strings.TrimSpace(string(comm))
		where := fmt.Sprintf("pid %d (%s)", pid, name)
		env, envErr := os.ReadFile(filepath.Join(dir, "environ"))
		if envErr == nil {
			envRead++
			if bytes.Contains(env, prefix) {
				found = append(found, where+" environ")
			}
		}
		if cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && bytes.Contains(cmdline, prefix) {
			found = append(found, where+" cmdline")
		}
		memN, memErr := scanMem(dir, prefix)
		if memErr == nil {
			memRead++
			if memN > 0 {
				found = append(found, where+" mem")
			}
		}
		fdN, fdErr := scanFDs(dir, prefix)
		if fdErr == nil {
			fdRead++
			if fdN > 0 {
				found = append(found, where+" fd")
			}
		}
		if name == "harness" || name == "sandbox-agentd" {
			fmt.Printf("saw %s: environ %s, mem %s, fd %s\n", where, verdict(envErr), verdict(memErr), verdict(fdErr))
		}
	}
	fmt.Printf("probe: uid %d, processes seen %d, environ readable %d, mem readable %d, fds readable %d\n",
		os.Getuid(), seen, envRead, memRead, fdRead)
	if len(found) == 0 {
		fmt.Println("canary found: none")
		return
	}
	for _, f := range found {
		fmt.Println("canary found: " + f)
	}
}

func verdict(err error) string {
	if err == nil {
		return "READABLE"
	}
	return "denied"
}

// scanMem reads every readable mapping of the process through its mem
// file and reports how many contain prefix.
func scanMem(dir string, prefix []byte) (int, error) {
	mem, err := os.Open(filepath.Join(dir, "mem"))
	if err != nil {
		return 0, err
	}
	defer mem.Close()
	maps, err := os.Open(filepath.Join(dir, "maps"))
	if err != nil {
		return 0, err
	}
	defer maps.Close()
	hits, total := 0, 0
	buf := make([]byte, 1<<20)
	sc := bufio.NewScanner(maps)
	readable := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start || start > 1<<62 {
			continue
		}
		var tail []byte
		for off := start; off < end && total < maxMemBytes; {
			n := min(uint64(len(buf)), end-off)
			got, err := mem.ReadAt(buf[:n], int64(off))
			if got <= 0 || err != nil && got == 0 {
				break
			}
			readable = true
			total += got
			chunk := append(tail, buf[:got]...)
			if bytes.Contains(chunk, prefix) {
				hits++
				break
			}
			tail = append([]byte(nil), chunk[max(0, len(chunk)-len(prefix)):]...)
			off += uint64(got)
		}
	}
	if !readable {
		return 0, syscall.EACCES
	}
	return hits, nil
}

// scanFDs reads the regular files the process holds open.
func scanFDs(dir string, prefix []byte) (int, error) {
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		return 0, err
	}
	hits := 0
	for _, fd := range fds {
		f, err := os.OpenFile(filepath.Join(dir, "fd", fd.Name()), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			data := make([]byte, min(fi.Size(), maxFileBytes))
			n, _ := f.ReadAt(data, 0)
			if bytes.Contains(data[:n], prefix) {
				hits++
			}
		}
		f.Close()
	}
	return hits, nil
}
