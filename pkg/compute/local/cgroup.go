package local

// Cgroups: every local sandbox (its daemon, or bwrap around it, and all
// their descendants) runs in a cgroup v2 directory of its own when the
// harness can make one, so that ending the sandbox ends everything it
// started, even processes that left the daemon's process groups or outlive
// a SIGKILLed daemon. Without cgroup v2 (or the right to use it) sandboxes
// run as before, without one, unless they are capped (caps.go: CPU, memory
// and process caps, through v2 or v1 controllers, which are never done
// without).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupFile is the private directory's record of the sandbox's cgroup: its
// absolute path, so that a later harness process finds it again.
const cgroupFile = "cgroup"

// cgroupPrefix starts the name of every sandbox cgroup.
const cgroupPrefix = "bulkhead-"

// cgroupKillTimeout bounds the wait for a killed cgroup to empty.
const cgroupKillTimeout = 10 * time.Second

// cgroupMount is a cgroup2 file system in /proc/self/mountinfo.
type cgroupMount struct {
	point    string // where it is mounted
	root     string // the cgroup (in the harness's view) mounted there
	readOnly bool
}

// cgroupPlace is where the harness sits in the cgroup v2 hierarchy.
type cgroupPlace struct {
	mount string // the cgroup2 mount point used
	dir   string // the harness's own cgroup, as a directory below mount
}

// parseCgroup2Mounts returns the cgroup2 file systems listed in a
// /proc/<pid>/mountinfo text.
func parseCgroup2Mounts(mountinfo []byte) []cgroupMount {
	var out []cgroupMount
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - type source super-options
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		ro := slices.Contains(strings.Split(fields[5], ","), "ro")
		if sep+3 < len(fields) && slices.Contains(strings.Split(fields[sep+3], ","), "ro") {
			ro = true
		}
		point, root := unescapeMountinfo(fields[4]), unescapeMountinfo(fields[3])
		if !filepath.IsAbs(point) || !filepath.IsAbs(root) {
			continue // not what the kernel writes
		}
		out = append(out, cgroupMount{point: filepath.Clean(point), root: filepath.Clean(root), readOnly: ro})
	}
	return out
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// parseOwnCgroup returns the cgroup v2 path of a /proc/<pid>/cgroup text
// (its "0::<path>" line).
func parseOwnCgroup(procCgroup []byte) (string, error) {
	for line := range strings.SplitSeq(string(procCgroup), "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok || id != "0" {
			continue
		}
		ctrl, path, ok := strings.Cut(rest, ":")
		if !ok || ctrl != "" {
			continue
		}
		if strings.HasSuffix(path, " (deleted)") {
			return "", fmt.Errorf("the harness's cgroup %s was removed", strings.TrimSuffix(path, " (deleted)"))
		}
		if !strings.HasPrefix(path, "/") {
			return "", fmt.Errorf("unexpected cgroup v2 path %q", path)
		}
		return filepath.Clean(path), nil
	}
	return "", errors.New("the harness is in no cgroup v2 hierarchy (no 0:: line in /proc/self/cgroup)")
}

// findCgroupPlace locates the harness's own cgroup v2 directory from the
// texts of /proc/self/mountinfo and /proc/self/cgroup: below the writable
// cgroup2 mount whose root holds it (the longest such root).
func findCgroupPlace(mountinfo, procCgroup []byte) (cgroupPlace, error) {
	mounts := parseCgroup2Mounts(mountinfo)
	if len(mounts) == 0 {
		return cgroupPlace{}, errors.New("no cgroup2 file system is mounted")
	}
	own, err := parseOwnCgroup(procCgroup)
	if err != nil {
		return cgroupPlace{}, err
	}
	var best *cgroupMount
	readOnly := ""
	for i, m := range mounts {
		root := filepath.Clean(m.root)
		if root != "/" && own != root && !strings.HasPrefix(own, root+"/") {
			continue
		}
		if m.readOnly {
			readOnly = m.point
			continue
		}
		if best == nil || len(root) > len(filepath.Clean(best.root)) {
			best = &mounts[i]
		}
	}
	if best == nil {
		if readOnly != "" {
			return cgroupPlace{}, fmt.Errorf("cgroup2 at %s is mounted read-only", readOnly)
		}
		return cgroupPlace{}, fmt.Errorf("no cgroup2 mount holds the harness's cgroup %s", own)
	}
	rel := strings.TrimPrefix(own, filepath.Clean(best.root))
	return cgroupPlace{mount: filepath.Clean(best.point), dir: filepath.Join(best.point, rel)}, nil
}

// detectCgroupPlace finds the harness's own cgroup v2 directory and checks
// that it is one.
func detectCgroupPlace() (cgroupPlace, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return cgroupPlace{}, fmt.Errorf("read mount table: %w", err)
	}
	procCgroup, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupPlace{}, fmt.Errorf("read own cgroup: %w", err)
	}
	pl, err := findCgroupPlace(mountinfo, procCgroup)
	if err != nil {
		return cgroupPlace{}, err
	}
	if err := isCgroup2Dir(pl.dir); err != nil {
		return cgroupPlace{}, err
	}
	return pl, nil
}

// isCgroup2Dir checks that path is a directory of a cgroup2 file system.
func isCgroup2Dir(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("%s is not on a cgroup2 file system", path)
	}
	return nil
}

// cgroupNamePart reports whether a sandbox directory's name can go into
// its cgroup's name as it is: 1-128 characters of [A-Za-z0-9._-], starting
// with a letter or digit (every session id is one).
func cgroupNamePart(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '.' || s[0] == '_' || s[0] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// cgroupStem is the start of the names of dir's sandbox cgroups
// ("bulkhead-<directory name>-"); a random suffix completes each.
func cgroupStem(dir string) string {
	base := filepath.Base(dir)
	if !cgroupNamePart(base) {
		base = "sandbox"
	}
	return cgroupPrefix + base + "-"
}

// newCgroupName returns a fresh name for a cgroup of dir's sandbox: unique,
// so sandboxes of the same session id in different state directories (or a
// replacement and a remnant of its predecessor) never share one.
func newCgroupName(dir string) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("cgroup name: %w", err)
	}
	return cgroupStem(dir) + hex.EncodeToString(b), nil
}

// checkCgroupRecord checks a recorded cgroup path by its form alone: an
// absolute, clean path strictly below one of mounts whose name is one of
// dir's sandbox cgroups. It touches no file.
func checkCgroupRecord(path string, mounts []cgroupMount, dir string) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return fmt.Errorf("recorded cgroup %q is not a clean absolute path", path)
	}
	name := filepath.Base(path)
	suffix, ok := strings.CutPrefix(name, cgroupStem(dir))
	if !ok || len(suffix) != 16 || strings.Trim(suffix, "0123456789abcdef") != "" {
		return fmt.Errorf("recorded cgroup %q is not named as one of this sandbox's", path)
	}
	for _, m := range mounts {
		point := filepath.Clean(m.point)
		if strings.HasPrefix(path, strings.TrimSuffix(point, "/")+"/") {
			return nil
		}
	}
	return fmt.Errorf("recorded cgroup %q is not below a cgroup2 mount", path)
}

// recordedCgroup reads the cgroup recorded in dir and validates it: a
// directory of a cgroup2 file system, strictly below a cgroup2 mount, named
// as one of dir's sandbox cgroups, reached without symbolic links. It
// returns "" and no error when nothing is recorded or the recorded cgroup
// no longer exists.
func recordedCgroup(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, cgroupFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the sandbox's cgroup record: %w", err)
	}
	path := strings.TrimSpace(string(data))
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mount table: %w", err)
	}
	if err := checkCgroupRecord(path, parseCgroup2Mounts(mountinfo), dir); err != nil {
		return "", err
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("recorded cgroup: %w", err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("recorded cgroup %s is not a directory", path)
	}
	if real, err := filepath.EvalSymlinks(path); err != nil || real != path {
		return "", fmt.Errorf("recorded cgroup %s is reached through a symbolic link (%s, %v)", path, real, err)
	}
	if err := isCgroup2Dir(path); err != nil {
		return "", err
	}
	return path, nil
}

// makeCgroup creates a fresh cgroup for the sandbox in dir below the
// harness's own and records it in dir (before creating it: a crash in
// between leaves at worst a record of nothing). On failure nothing is left
// and the error says why the sandbox must do without.
func makeCgroup(dir string) (string, error) {
	pl, err := detectCgroupPlace()
	if err != nil {
		return "", err
	}
	name, err := newCgroupName(dir)
	if err != nil {
		return "", err
	}
	return makeCgroupIn(dir, pl, name)
}

// killCgroup kills every process in the cgroup at path and its descendant
// cgroups (cgroup.kill; where the kernel has none, SIGKILL to every listed
// process until none is left), waits until it is empty (at most
// cgroupKillTimeout, less if ctx ends) and removes it. A cgroup that no
// longer exists is not an error.
func killCgroup(ctx context.Context, path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	viaFile := true
	if err := writeCgroupFile(path, "cgroup.kill", "1"); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", path, err)
		}
		if _, serr := os.Lstat(path); errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
		viaFile = false // before Linux 5.14
	}
	deadline := time.Now().Add(cgroupKillTimeout)
	for {
		populated, err := cgroupPopulated(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kill cgroup %s: %w", path, err)
		}
		if !populated {
			break
		}
		if !viaFile {
			for _, pid := range cgroupPIDs(path) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds processes %v %s after SIGKILL", path, cgroupPIDs(path), cgroupKillTimeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill cgroup %s: processes %v left: %w", path, cgroupPIDs(path), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return removeCgroupTree(ctx, path, deadline)
}

// writeCgroupFile writes value to an existing control file of a cgroup.
func writeCgroupFile(cgroup, name, value string) error {
	f, err := os.OpenFile(filepath.Join(cgroup, name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(value)
	return errors.Join(werr, f.Close())
}

// cgroupPopulated reads the "populated" key of a cgroup's cgroup.events
// (true while the cgroup or a descendant holds a process).
func cgroupPopulated(path string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(path, "cgroup.events"))
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return strings.TrimSpace(v) != "0", nil
		}
	}
	return false, fmt.Errorf("no populated key in %s/cgroup.events", path)
}

// cgroupPIDs lists the processes of a cgroup and its descendants.
func cgroupPIDs(path string) []int {
	var out []int
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for f := range strings.FieldsSeq(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}

// removeCgroupTree removes an empty cgroup and its descendant cgroups,
// deepest first, retrying while the kernel still reports one busy.
func removeCgroupTree(ctx context.Context, path string, deadline time.Time) error {
	var dirs []string
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("remove cgroup %s: %w", d, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}
