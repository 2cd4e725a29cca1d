package local

// Resource caps: a local sandbox (its daemon, or bubblewrap or runsc
// around it, and everything they start) can run under a CPU, memory and
// process-count cap, enforced by the kernel's cgroup controllers, as a
// Docker container's are (the disk cap is disk.go's: a file system of
// the sandbox's own). Each controller is used where the host offers
// it: in the cgroup v2 hierarchy (the sandbox's cgroup of cgroup.go, with
// memory.max, memory.swap.max, cpu.max, pids.max) when the controller is
// bound there, else in the cgroup v1 hierarchy that holds it (a cgroup of
// the sandbox's own in each: memory.limit_in_bytes and
// memory.memsw.limit_in_bytes, cpu.cfs_quota_us and cpu.cfs_period_us,
// pids.max). Hybrid hosts (v1 controllers, an empty v2 hierarchy at
// /sys/fs/cgroup/unified) cap through v1, pure v2 hosts through v2.
//
// A sandbox is in its capped cgroups before it can run anything of its
// own, let alone fork:
//   - v2: the process is cloned into its cgroup (clone3 with
//     CLONE_INTO_CGROUP, SysProcAttr.UseCgroupFD): it never runs outside.
//   - v1 has no such clone. The process is started as /bin/sh (the
//     host's, trusted) blocked reading its standard input, a pipe from
//     the harness; the harness writes its pid into cgroup.procs of every
//     v1 cgroup of the sandbox and only then writes a line to the pipe,
//     upon which the shell execs the sandbox's real command (bwrap, runsc
//     or the daemon) in place, same pid, standard input /dev/null again.
//     Until then the process is a builtin `read` that forks nothing; if
//     the harness fails (or dies) before the line, the shell reads EOF
//     and exits without exec. Descendants inherit the cgroups from then on.
//
// Caps asked for are never dropped: when a controller is missing, mounted
// read-only or not this harness's to use (no root), the sandbox is not
// created (compute.ErrFailedPrecondition naming what is missing).
//
// The sandbox's v1 cgroups are recorded in its private directory (one
// path a line in cgroupsV1File, written before they are made, as the v2
// cgroup's record is) and killed and removed with the sandbox, by this
// harness or a later one (Destroy, Reap, a relaunch in the directory).
//
// gVisor: runsc runs with --ignore-cgroups in the sandbox's cgroups, so
// the caps bound the sentry and gofer, and through them everything the
// sandbox does (its memory is the sentry's, its CPU the sentry's threads').
// The sandbox's own processes are not host processes: their count is
// capped inside gVisor by RLIMIT_NPROC in the OCI spec (per uid, as Linux
// counts it: the run_as account's processes and threads, which cannot
// raise it), while the host pids cap, with room for the sentry's threads
// and its platform's stub processes (gvisorHostProcesses), is a backstop.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Resources caps one local sandbox: everything it runs (its daemon, the
// isolation wrapper, the commands it runs and their descendants)
// together. Zero fields cap nothing. Caps need cgroup controllers this
// harness may use (in practice a root harness); a sandbox whose caps
// cannot be applied is not created.
type Resources struct {
	// CPUs is the CPU time the sandbox may use, in CPUs: 0.5 is half of
	// one CPU's time, 2 two CPUs' (the CFS bandwidth quota over a 100 ms
	// period). At least 0.01.
	CPUs float64
	// Memory is the memory limit in bytes (its processes' memory and the
	// page cache and kernel memory charged to it), with no swap on top.
	// Over it, the kernel reclaims and then kills a process of the
	// sandbox. At least MinMemory.
	Memory int64
	// MaxProcesses bounds the sandbox's processes and threads: a fork past
	// it fails (EAGAIN).
	MaxProcesses int64
	// Disk caps, in bytes, what the sandbox writes to the host's disk:
	// its workspace, homes, accounts and socket directory live on a file
	// system of that size of its own (an ext4 image on a loop device, see
	// disk.go), where a write past it fails (ENOSPC). At least MinDisk.
	// Needs a root harness, mkfs.ext4 and loop devices. A sandbox keeps
	// the disk it was made with when it is replaced.
	Disk int64
}

// MinMemory is the smallest memory cap: the daemon needs some to start.
const MinMemory = 16 << 20

// CreateOptions are one local sandbox's options
// (compute.CreateOptions.ProviderOptions). A non-zero field of Resources
// replaces Config.Resources's; a negative one lifts that cap.
type CreateOptions struct {
	Resources Resources
}

// IsZero reports whether r caps nothing.
func (r Resources) IsZero() bool { return r == Resources{} }

// check refuses caps no kernel can apply.
func (r Resources) check() error {
	switch {
	case math.IsNaN(r.CPUs) || math.IsInf(r.CPUs, 0) || r.CPUs < 0 || r.CPUs > 1<<20:
		return fmt.Errorf("%w: local sandbox CPU cap %v: want a number of CPUs, e.g. 0.5", compute.ErrInvalidArgument, r.CPUs)
	case r.CPUs > 0 && r.CPUs < 0.01:
		return fmt.Errorf("%w: local sandbox CPU cap %v: at least 0.01", compute.ErrInvalidArgument, r.CPUs)
	case r.Memory < 0 || r.MaxProcesses < 0 || r.Disk < 0:
		return fmt.Errorf("%w: local sandbox caps must not be negative", compute.ErrInvalidArgument)
	case r.Memory > 0 && r.Memory < MinMemory:
		return fmt.Errorf("%w: local sandbox memory cap %d bytes: at least %d (the daemon needs some)", compute.ErrInvalidArgument, r.Memory, MinMemory)
	case r.Disk > 0 && (r.Disk < MinDisk || r.Disk > maxDisk):
		return fmt.Errorf("%w: local sandbox disk cap %d bytes: from %d (room for the file system's own metadata) to %d", compute.ErrInvalidArgument, r.Disk, MinDisk, int64(maxDisk))
	}
	return nil
}

// merge applies o (a sandbox's CreateOptions) over r (the Config's).
func (r Resources) merge(o Resources) Resources {
	pick := func(base, over int64) int64 {
		switch {
		case over < 0:
			return 0
		case over > 0:
			return over
		}
		return base
	}
	r.Memory, r.MaxProcesses, r.Disk = pick(r.Memory, o.Memory), pick(r.MaxProcesses, o.MaxProcesses), pick(r.Disk, o.Disk)
	switch {
	case o.CPUs < 0:
		r.CPUs = 0
	case o.CPUs > 0 || math.IsNaN(o.CPUs):
		r.CPUs = o.CPUs
	}
	return r
}

// resources resolves a sandbox's caps: Config.Resources with the launch's
// CreateOptions over them.
func (p *Provider) resources(opts any) (Resources, error) {
	o, err := compute.OptionsAs[CreateOptions](ProviderName, "*local.CreateOptions", opts)
	if err != nil {
		return Resources{}, err
	}
	r := p.cfg.Resources
	if o != nil {
		r = r.merge(o.Resources)
	}
	if err := r.check(); err != nil {
		return Resources{}, err
	}
	return r, nil
}

// Controller names, as the kernel spells them.
const (
	ctrlCPU     = "cpu"
	ctrlCPUAcct = "cpuacct"
	ctrlCPUSet  = "cpuset"
	ctrlMemory  = "memory"
	ctrlPids    = "pids"
)

// controllers are the controllers r needs.
func (r Resources) controllers() []string {
	var out []string
	if r.CPUs > 0 {
		out = append(out, ctrlCPU)
	}
	if r.Memory > 0 {
		out = append(out, ctrlMemory)
	}
	if r.MaxProcesses > 0 {
		out = append(out, ctrlPids)
	}
	return out
}

// what names a controller's cap in messages.
func capName(ctrl string) string {
	switch ctrl {
	case ctrlCPU:
		return "CPU"
	case ctrlPids:
		return "process"
	}
	return ctrl
}

// cpuPeriod is the CFS bandwidth period, in microseconds.
const cpuPeriod = 100_000

// cpuQuota is the CFS quota of a CPU cap, per cpuPeriod, in microseconds
// (at least the kernel's minimum of 1 ms).
func cpuQuota(cpus float64) int64 {
	return max(int64(math.Round(cpus*cpuPeriod)), 1000)
}

// cgroupV1Mount is a cgroup v1 hierarchy in /proc/self/mountinfo.
type cgroupV1Mount struct {
	point       string
	root        string
	controllers []string
	readOnly    bool
}

// knownControllers are the cgroup v1 controllers (a v1 mount's super
// options name them among other options, such as name=systemd).
var knownControllers = []string{"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb", "memory",
	"misc", "net_cls", "net_prio", "perf_event", "pids", "rdma"}

// parseCgroup1Mounts returns the cgroup v1 hierarchies of a
// /proc/<pid>/mountinfo text that hold controllers.
func parseCgroup1Mounts(mountinfo []byte) []cgroupV1Mount {
	var out []cgroupV1Mount
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+3 >= len(fields) || fields[sep+1] != "cgroup" {
			continue
		}
		ro := slices.Contains(strings.Split(fields[5], ","), "ro")
		var ctrls []string
		for _, o := range strings.Split(fields[sep+3], ",") {
			switch {
			case o == "ro":
				ro = true
			case slices.Contains(knownControllers, o) && !slices.Contains(ctrls, o):
				ctrls = append(ctrls, o)
			}
		}
		point, root := unescapeMountinfo(fields[4]), unescapeMountinfo(fields[3])
		if len(ctrls) == 0 || !filepath.IsAbs(point) || !filepath.IsAbs(root) {
			continue
		}
		out = append(out, cgroupV1Mount{point: filepath.Clean(point), root: filepath.Clean(root), controllers: ctrls, readOnly: ro})
	}
	return out
}

// parseOwnCgroupsV1 returns the harness's cgroup in each v1 hierarchy of a
// /proc/<pid>/cgroup text, by controller ("4:memory:/a" gives memory: /a).
func parseOwnCgroupsV1(procCgroup []byte) map[string]string {
	out := map[string]string{}
	for line := range strings.SplitSeq(string(procCgroup), "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok || id == "0" {
			continue
		}
		ctrls, path, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(path, "/") || strings.HasSuffix(path, " (deleted)") {
			continue
		}
		for c := range strings.SplitSeq(ctrls, ",") {
			if slices.Contains(knownControllers, c) {
				out[c] = filepath.Clean(path)
			}
		}
	}
	return out
}

// cgroupV1Place is the harness's own cgroup in one v1 hierarchy: where a
// sandbox's cgroup of that hierarchy is made.
type cgroupV1Place struct {
	mount       string // the hierarchy's mount point
	dir         string // the harness's cgroup there, as a directory
	controllers []string
	readOnly    bool
}

// findCgroupV1Places locates the harness's cgroup in every v1 hierarchy
// with controllers, from the texts of /proc/self/mountinfo and
// /proc/self/cgroup (below the mount whose root holds it, the longest such
// root; writable mounts first).
func findCgroupV1Places(mountinfo, procCgroup []byte) []cgroupV1Place {
	own := parseOwnCgroupsV1(procCgroup)
	mounts := parseCgroup1Mounts(mountinfo)
	var out []cgroupV1Place
	seen := map[string]bool{}
	for _, m := range mounts {
		key := strings.Join(m.controllers, ",")
		path, ok := own[m.controllers[0]]
		if !ok || seen[key] {
			continue
		}
		var best *cgroupV1Mount
		for i, c := range mounts {
			if strings.Join(c.controllers, ",") != key || (c.root != "/" && path != c.root && !strings.HasPrefix(path, c.root+"/")) {
				continue
			}
			if best == nil || (best.readOnly && !c.readOnly) || (best.readOnly == c.readOnly && len(c.root) > len(best.root)) {
				best = &mounts[i]
			}
		}
		if best == nil {
			continue
		}
		seen[key] = true
		rel := strings.TrimPrefix(path, best.root)
		out = append(out, cgroupV1Place{mount: best.point, dir: filepath.Join(best.point, rel), controllers: best.controllers, readOnly: best.readOnly})
	}
	return out
}

// cgroupHost is what the harness sees of the host's cgroups.
type cgroupHost struct {
	v2    cgroupPlace // the harness's cgroup v2 directory (dir "" when none)
	v2Err error       // why there is none
	// v2Controllers are the controllers the harness's v2 cgroup has (its
	// cgroup.controllers), which it can give its children.
	v2Controllers []string
	v1            []cgroupV1Place
}

// detectCgroupHost reads the harness's cgroups (a variable: tests stand
// in hosts without controllers).
var detectCgroupHost = readCgroupHost

// readCgroupHost reads the harness's cgroups from /proc/self.
func readCgroupHost() (cgroupHost, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return cgroupHost{}, fmt.Errorf("read mount table: %w", err)
	}
	procCgroup, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupHost{}, fmt.Errorf("read own cgroup: %w", err)
	}
	h := cgroupHost{v1: findCgroupV1Places(mountinfo, procCgroup)}
	if h.v2, h.v2Err = findCgroupPlace(mountinfo, procCgroup); h.v2Err == nil {
		h.v2Err = isCgroup2Dir(h.v2.dir)
	}
	if h.v2Err != nil {
		h.v2 = cgroupPlace{}
	} else if data, err := os.ReadFile(filepath.Join(h.v2.dir, "cgroup.controllers")); err == nil {
		h.v2Controllers = strings.Fields(string(data))
	}
	return h, nil
}

// capPlan says where a sandbox's caps go.
type capPlan struct {
	v2 []string        // controllers capped in the sandbox's v2 cgroup
	v1 []cgroupV1Place // v1 hierarchies the sandbox gets a cgroup in, each once
}

// planCaps places the controllers need names: in the v2 hierarchy when it
// has the controller, else in the v1 hierarchy holding it. With the CPU
// capped in v1, a separate cpuacct hierarchy is joined too (accounting
// only: the sandbox's CPU use can be read there). It fails, naming what is
// missing, when a controller is nowhere usable.
func planCaps(need []string, h cgroupHost) (capPlan, error) {
	var plan capPlan
	var missing []string
	addV1 := func(pl cgroupV1Place) {
		if !slices.ContainsFunc(plan.v1, func(q cgroupV1Place) bool { return q.mount == pl.mount }) {
			plan.v1 = append(plan.v1, pl)
		}
	}
	cpuInV1 := false
	for _, c := range need {
		if h.v2.dir != "" && slices.Contains(h.v2Controllers, c) {
			plan.v2 = append(plan.v2, c)
			continue
		}
		i := slices.IndexFunc(h.v1, func(pl cgroupV1Place) bool { return slices.Contains(pl.controllers, c) })
		switch {
		case i >= 0 && h.v1[i].readOnly:
			missing = append(missing, fmt.Sprintf("the %s cap needs the cgroup v1 %s hierarchy, but %s is mounted read-only", capName(c), c, h.v1[i].mount))
		case i >= 0:
			addV1(h.v1[i])
			cpuInV1 = cpuInV1 || c == ctrlCPU
		default:
			where := "the cgroup v2 hierarchy"
			if h.v2.dir != "" {
				where += " (" + h.v2.dir + "/cgroup.controllers)"
			} else if h.v2Err != nil {
				where += " (" + h.v2Err.Error() + ")"
			}
			missing = append(missing, fmt.Sprintf("the %s cap needs the %s controller, which neither %s nor a mounted cgroup v1 hierarchy offers", capName(c), c, where))
		}
	}
	if len(missing) > 0 {
		return capPlan{}, fmt.Errorf("%w: local sandbox caps cannot be applied here: %s", compute.ErrFailedPrecondition, strings.Join(missing, "; "))
	}
	if cpuInV1 {
		if i := slices.IndexFunc(h.v1, func(pl cgroupV1Place) bool { return slices.Contains(pl.controllers, ctrlCPUAcct) }); i >= 0 && !h.v1[i].readOnly {
			addV1(h.v1[i])
		}
	}
	return plan, nil
}

// CheckResources reports whether this host and process can cap local
// sandboxes as r asks (without making anything): nil, or an error
// wrapping compute.ErrFailedPrecondition naming what is missing (or
// compute.ErrInvalidArgument for caps no kernel applies). A service checks
// its caps with it at start rather than at its first sandbox.
func CheckResources(r Resources) error {
	if err := r.check(); err != nil {
		return err
	}
	if r.Disk > 0 {
		if err := checkDiskCap(); err != nil {
			return err
		}
	}
	need := r.controllers()
	if len(need) == 0 {
		return nil
	}
	h, err := detectCgroupHost()
	if err != nil {
		return fmt.Errorf("%w: local sandbox caps: %w", compute.ErrFailedPrecondition, err)
	}
	plan, err := planCaps(need, h)
	if err != nil {
		return err
	}
	var denied []string
	for _, pl := range plan.v1 {
		if err := unix.Access(pl.dir, unix.W_OK); err != nil {
			denied = append(denied, fmt.Sprintf("%s (%v)", pl.dir, err))
		}
	}
	if len(plan.v2) > 0 {
		if err := unix.Access(h.v2.dir, unix.W_OK); err != nil {
			denied = append(denied, fmt.Sprintf("%s (%v)", h.v2.dir, err))
		}
		// Controllers not yet given to the children of a cgroup that
		// holds processes cannot be (see delegateV2).
		sub, _ := os.ReadFile(filepath.Join(h.v2.dir, "cgroup.subtree_control"))
		procs, _ := os.ReadFile(filepath.Join(h.v2.dir, "cgroup.procs"))
		for _, c := range plan.v2 {
			if !slices.Contains(strings.Fields(string(sub)), c) && len(bytes.TrimSpace(procs)) > 0 && h.v2.dir != h.v2.mount {
				return fmt.Errorf("%w: local sandbox caps: the cgroup v2 %s controller is not enabled for the children of the harness's cgroup %s, "+
					"which cannot enable it while it holds processes (the harness); run the harness in the hierarchy's root cgroup, or on a host whose cgroup v1 hierarchies hold the controller",
					compute.ErrFailedPrecondition, c, h.v2.dir)
			}
		}
	}
	if len(denied) > 0 {
		return fmt.Errorf("%w: local sandbox caps need cgroups this process may create; it may not below %s (run the harness as root, or in cgroups delegated to it)",
			compute.ErrFailedPrecondition, strings.Join(denied, ", "))
	}
	return nil
}

// cgroupsV1File is the private directory's record of the sandbox's cgroup
// v1 directories, one absolute path a line.
const cgroupsV1File = "cgroups-v1"

// sandboxCgroups are the cgroups a sandbox is started in.
type sandboxCgroups struct {
	v2     string   // its cgroup v2 directory (cgroup.go), "" when none
	v2Caps bool     // v2 holds caps: the sandbox must start in it
	v1     []string // its cgroup v1 directories, with caps
}

// makeSandboxCgroups makes the cgroups of the sandbox in dir with the caps
// of r, recording them in dir first. Without caps it is makeCgroup: a
// sandbox without a v2 cgroup runs without one (note says why). With caps,
// it fails (compute.ErrFailedPrecondition, leaving nothing) unless every
// cap is in place.
func makeSandboxCgroups(dir string, r Resources) (cgs sandboxCgroups, note error, err error) {
	need := r.controllers()
	if len(need) == 0 {
		cg, err := makeCgroup(dir)
		return sandboxCgroups{v2: cg}, err, nil
	}
	h, err := detectCgroupHost()
	if err != nil {
		return cgs, nil, fmt.Errorf("%w: local sandbox caps: %w", compute.ErrFailedPrecondition, err)
	}
	plan, err := planCaps(need, h)
	if err != nil {
		return cgs, nil, err
	}
	name, err := newCgroupName(dir)
	if err != nil {
		return cgs, nil, err
	}
	fail := func(err error) (sandboxCgroups, error, error) {
		ctx, cancel := context.WithTimeout(context.Background(), cgroupKillTimeout)
		defer cancel()
		_ = removeSandboxCgroups(ctx, dir, cgs)
		return sandboxCgroups{}, nil, fmt.Errorf("%w: local sandbox caps: %w", compute.ErrFailedPrecondition, err)
	}
	if h.v2Err != nil {
		note = h.v2Err
	} else if cg, err := makeCgroupIn(dir, h.v2, name); err != nil {
		if len(plan.v2) > 0 {
			return fail(err)
		}
		note = err
	} else {
		cgs.v2 = cg
	}
	if len(plan.v2) > 0 {
		cgs.v2Caps = true
		if err := delegateV2(h.v2.dir, plan.v2); err != nil {
			return fail(err)
		}
		if err := writeCaps(cgs.v2, plan.v2, r, false); err != nil {
			return fail(err)
		}
	}
	if len(plan.v1) > 0 {
		var paths []string
		for _, pl := range plan.v1 {
			paths = append(paths, filepath.Join(pl.dir, name))
		}
		// Recorded before they are made: a crash in between leaves at
		// worst a record of nothing.
		if err := writeFileAtomic(filepath.Join(dir, cgroupsV1File), []byte(strings.Join(paths, "\n")+"\n"), 0o600); err != nil {
			return fail(fmt.Errorf("record the sandbox's cgroups: %w", err))
		}
		for i, pl := range plan.v1 {
			if err := os.Mkdir(paths[i], 0o755); err != nil {
				return fail(fmt.Errorf("create cgroup: %w", err))
			}
			cgs.v1 = append(cgs.v1, paths[i])
			if slices.Contains(pl.controllers, ctrlCPUSet) {
				if err := inheritCPUSet(paths[i]); err != nil {
					return fail(err)
				}
			}
			var ctrls []string
			for _, c := range need {
				if slices.Contains(pl.controllers, c) {
					ctrls = append(ctrls, c)
				}
			}
			if err := writeCaps(paths[i], ctrls, r, true); err != nil {
				return fail(err)
			}
		}
	}
	return cgs, note, nil
}

// makeCgroupIn is makeCgroup with a given name, below the v2 place pl.
func makeCgroupIn(dir string, pl cgroupPlace, name string) (string, error) {
	path := filepath.Join(pl.dir, name)
	record := filepath.Join(dir, cgroupFile)
	if err := writeFileAtomic(record, []byte(path+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("record the sandbox's cgroup: %w", err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		_ = os.Remove(record)
		return "", fmt.Errorf("create cgroup: %w", err)
	}
	return path, nil
}

// delegateV2 makes sure the children of the v2 cgroup parent (the
// harness's own) get the controllers ctrls (its cgroup.subtree_control),
// enabling the missing ones. The kernel refuses that for a cgroup that
// holds processes, unless it is the hierarchy's root.
func delegateV2(parent string, ctrls []string) error {
	data, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	have := strings.Fields(string(data))
	for _, c := range ctrls {
		if slices.Contains(have, c) {
			continue
		}
		if err := writeCgroupFile(parent, "cgroup.subtree_control", "+"+c); err != nil {
			return fmt.Errorf("the cgroup v2 %s controller is not enabled for the children of %s, and enabling it failed (%w): "+
				"the kernel lets a cgroup other than the root give controllers to its children only while it holds no process, and the harness's own "+
				"cgroup holds the harness; run the harness in the hierarchy's root cgroup, or on a host whose cgroup v1 hierarchies hold the controller", c, parent, err)
		}
	}
	return nil
}

// writeCaps writes the caps of r for ctrls into the cgroup at path (v1:
// one hierarchy's cgroup, else the v2 cgroup).
func writeCaps(path string, ctrls []string, r Resources, v1 bool) error {
	w := func(file, value string) error {
		if err := writeCgroupFile(path, file, value); err != nil {
			return fmt.Errorf("cgroup %s: set %s to %s: %w", path, file, value, err)
		}
		return nil
	}
	// optional writes a file the kernel may not offer (swap accounting
	// off, no swap).
	optional := func(file, value string) error {
		if _, err := os.Stat(filepath.Join(path, file)); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return w(file, value)
	}
	for _, c := range ctrls {
		var err error
		switch {
		case c == ctrlMemory && v1:
			// The memory+swap limit must not be below the memory limit:
			// set the memory limit first.
			mem := strconv.FormatInt(r.Memory, 10)
			if err = w("memory.limit_in_bytes", mem); err == nil {
				err = optional("memory.memsw.limit_in_bytes", mem)
			}
		case c == ctrlMemory:
			if err = w("memory.max", strconv.FormatInt(r.Memory, 10)); err == nil {
				err = optional("memory.swap.max", "0")
			}
		case c == ctrlCPU && v1:
			if err = w("cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err == nil {
				err = w("cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(r.CPUs), 10))
			}
		case c == ctrlCPU:
			err = w("cpu.max", fmt.Sprintf("%d %d", cpuQuota(r.CPUs), cpuPeriod))
		case c == ctrlPids:
			err = w("pids.max", strconv.FormatInt(r.MaxProcesses, 10))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// inheritCPUSet gives a new v1 cgroup of a hierarchy with the cpuset
// controller its parent's CPUs and memory nodes (a cgroup with none takes
// no process).
func inheritCPUSet(path string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(path, f))
		if err != nil || strings.TrimSpace(string(cur)) != "" {
			continue
		}
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(path), f))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		if err := writeCgroupFile(path, f, strings.TrimSpace(string(parent))); err != nil {
			return fmt.Errorf("cgroup %s: %s: %w", path, f, err)
		}
	}
	return nil
}

// joinCgroupsV1 moves the process pid into each v1 cgroup of paths.
func joinCgroupsV1(pid int, paths []string) error {
	for _, p := range paths {
		if err := writeCgroupFile(p, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("move the sandbox into cgroup %s: %w", p, err)
		}
	}
	return nil
}

// gateScript is the v1 start gate's shell program (see the top of this
// file): wait for the harness's line on standard input, then become the
// sandbox's command with /dev/null as standard input; without the line
// (EOF: the harness failed or died), exit without running it.
const gateScript = `read -r _ || exit 125; exec "$@" </dev/null`

// gateShell is the shell the v1 start gate runs.
const gateShell = "/bin/sh"

// gateArgv wraps argv in the v1 start gate.
func gateArgv(argv []string) []string {
	return append([]string{gateShell, "-c", gateScript, "bulkhead-cgroup-gate"}, argv...)
}

// checkCgroupV1Record checks a recorded v1 cgroup path by its form alone:
// an absolute, clean path strictly below one of the v1 mounts, named as
// one of dir's sandbox cgroups.
func checkCgroupV1Record(path string, mounts []cgroupV1Mount, dir string) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return fmt.Errorf("recorded cgroup %q is not a clean absolute path", path)
	}
	suffix, ok := strings.CutPrefix(filepath.Base(path), cgroupStem(dir))
	if !ok || len(suffix) != 16 || strings.Trim(suffix, "0123456789abcdef") != "" {
		return fmt.Errorf("recorded cgroup %q is not named as one of this sandbox's", path)
	}
	for _, m := range mounts {
		if strings.HasPrefix(path, strings.TrimSuffix(m.point, "/")+"/") {
			return nil
		}
	}
	return fmt.Errorf("recorded cgroup %q is not below a cgroup v1 mount", path)
}

// recordedCgroupsV1 reads the v1 cgroups recorded in dir and validates
// each (its form, then: a directory of a cgroup v1 file system reached
// without symbolic links). Cgroups that no longer exist are left out; a
// record that does not pass is an error.
func recordedCgroupsV1(dir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(dir, cgroupsV1File))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the sandbox's cgroup record: %w", err)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	mounts := parseCgroup1Mounts(mountinfo)
	var out []string
	for _, path := range strings.Fields(string(data)) {
		if err := checkCgroupV1Record(path, mounts, dir); err != nil {
			return nil, err
		}
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("recorded cgroup: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("recorded cgroup %s is not a directory", path)
		}
		if real, err := filepath.EvalSymlinks(path); err != nil || real != path {
			return nil, fmt.Errorf("recorded cgroup %s is reached through a symbolic link (%s, %v)", path, real, err)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			return nil, fmt.Errorf("recorded cgroup %s is not on a cgroup v1 file system (%v)", path, err)
		}
		out = append(out, path)
	}
	return out, nil
}

// killCgroupV1 kills every process in the v1 cgroup at path and its
// descendants (v1 has no cgroup.kill: SIGKILL to every listed process
// until none is left, at most cgroupKillTimeout), and removes it. A cgroup
// that no longer exists is not an error.
func killCgroupV1(ctx context.Context, path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(cgroupKillTimeout)
	for {
		pids := cgroupPIDs(path)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds processes %v %s after SIGKILL", path, pids, cgroupKillTimeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill cgroup %s: processes %v left: %w", path, pids, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return removeCgroupTree(ctx, path, deadline)
}

// removeSandboxCgroups kills and removes the cgroups of cgs and the
// records in dir (for a launch that failed before its sandbox ran).
func removeSandboxCgroups(ctx context.Context, dir string, cgs sandboxCgroups) error {
	var errs []error
	if cgs.v2 != "" {
		errs = append(errs, killCgroup(ctx, cgs.v2))
	}
	for _, p := range cgs.v1 {
		errs = append(errs, killCgroupV1(ctx, p))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, f := range []string{cgroupFile, cgroupsV1File} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Under gVisor the host pids cap bounds runsc's own processes and
// threads (runsc, the gofer, the sentry and its platform's stub
// processes), which the sandbox's process count drives but does not
// equal: it is the sandbox's cap, doubled, plus gvisorHostThreads.
const gvisorHostThreads = 256

// gvisorHostProcesses is the host pids cap of a gVisor sandbox whose
// processes are capped at n inside.
func gvisorHostProcesses(n int64) int64 { return 2*n + gvisorHostThreads }
