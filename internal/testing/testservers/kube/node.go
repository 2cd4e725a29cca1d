package kubeserver

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kernelTunables are the sysctls the kubelet sets at start (unless told
// to fail instead); the cluster puts back the values it found when the
// last cluster on the machine stops.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// startNode starts the node: a bridge and CNI config of its own, a
// containerd instance, the pause image, and the kubelet; it waits until
// the node is Ready and schedulable.
func (c *Cluster) startNode(ctx context.Context) error {
	base := filepath.Dir(c.Dir)
	if err := withMachineLock(base, func() error { return c.saveTunables(base) }); err != nil {
		return err
	}
	if err := c.makeBridge(); err != nil {
		return err
	}
	if err := c.makeCgroups(); err != nil {
		return err
	}
	if err := c.startContainerd(ctx); err != nil {
		return err
	}
	if err := c.importPause(ctx); err != nil {
		return err
	}
	if err := c.startKubelet(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !c.running("kubelet") {
			return false, errors.New("kubelet exited (see " + c.logPath("kubelet") + ")")
		}
		var node struct {
			Spec struct {
				Taints []struct{ Key string } `json:"taints"`
			} `json:"spec"`
			Status struct {
				Conditions []struct{ Type, Status string } `json:"conditions"`
			} `json:"status"`
		}
		if err := c.Do(ctx, http.MethodGet, "/api/v1/nodes/"+c.NodeName, nil, &node); err != nil {
			return false, nil
		}
		for _, t := range node.Spec.Taints {
			if strings.HasPrefix(t.Key, "node.kubernetes.io/") {
				return false, nil
			}
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == "Ready" {
				return cond.Status == "True", nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("kubeserver: node %s not ready: %w", c.NodeName, err)
	}
	// The gvisor RuntimeClass, when runsc and its shim are already built
	// (otherwise RequireGVisor builds them and creates it).
	if gvisorCached() {
		if err := c.createGVisorRuntimeClass(ctx); err != nil {
			return err
		}
	}
	return nil
}

// makeBridge picks a free /24 in 10.128.0.0/9 for the pods and makes the
// bridge that the CNI bridge plugin attaches them to, with the node's
// address (the pods' gateway) on it.
func (c *Cluster) makeBridge() error {
	used := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				used[n.IP.To4().Mask(net.CIDRMask(24, 32)).String()] = true
			}
		}
	}
	var subnet net.IP
	for range 100 {
		cand := net.IPv4(10, byte(128+mathrand.IntN(127)), byte(mathrand.IntN(256)), 0).To4()
		if !used[cand.String()] {
			subnet = cand
			break
		}
	}
	if subnet == nil {
		return errors.New("kubeserver: no free /24 for the pod network")
	}
	c.PodCIDR = subnet.String() + "/24"
	gw := net.IPv4(subnet[0], subnet[1], subnet[2], 1).String()
	c.NodeIP = gw
	for _, args := range [][]string{
		{"link", "add", "name", c.bridge, "type", "bridge"},
		{"addr", "add", gw + "/24", "dev", c.bridge},
		{"link", "set", c.bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("kubeserver: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "dataDir": %q}
  }]
}
`, c.bridge, c.bridge, c.PodCIDR, gw, filepath.Join(c.Dir, "cni", "ipam"))
	if err := os.MkdirAll(filepath.Join(c.Dir, "cni", "net.d"), 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "cni", "net.d", "10-bulkhead.conflist"), []byte(cni), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return nil
}

// cgroupMounts lists the mounted cgroup hierarchies: v1 ones (with the
// controller names) and the v2 one.
type cgroupMount struct {
	dir string
	v2  bool
}

func cgroupMounts() ([]cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("kubeserver: %w", err)
	}
	defer f.Close()
	var ms []cgroupMount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, fl := range fields {
			if fl == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		switch fields[sep+1] {
		case "cgroup":
			ms = append(ms, cgroupMount{dir: unescapeMount(fields[4])})
		case "cgroup2":
			ms = append(ms, cgroupMount{dir: unescapeMount(fields[4]), v2: true})
		}
	}
	return ms, sc.Err()
}

// cgroupV1 reports whether the machine uses cgroup v1 (hybrid included).
func cgroupV1(ms []cgroupMount) bool {
	for _, m := range ms {
		if !m.v2 {
			return true
		}
	}
	return false
}

// makeCgroups makes the cgroup the kubelet puts the pods under
// (cgroupRoot): on cgroup v1 below this process's own memory cgroup (so
// the pods count against the same memory limit), in every hierarchy; on
// cgroup v2 at the top, with the controllers enabled.
func (c *Cluster) makeCgroups() error {
	ms, err := cgroupMounts()
	if err != nil {
		return err
	}
	parent := "/"
	if cgroupV1(ms) {
		if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				parts := strings.SplitN(line, ":", 3)
				if len(parts) == 3 && parts[1] == "memory" {
					parent = parts[2]
				}
			}
		}
	}
	root := filepath.Join(parent, "bhk-"+c.id)
	var made []string
	if err := os.WriteFile(filepath.Join(c.Dir, "cgroup-root"), []byte(root), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	for _, m := range ms {
		if m.v2 && cgroupV1(ms) {
			continue // hybrid: the unified hierarchy holds no controllers
		}
		// mkdir -p, parents first, remembering what was made.
		rel := strings.Split(strings.Trim(root, "/"), "/")
		p := m.dir
		for _, part := range rel {
			parentDir := p
			p = filepath.Join(p, part)
			if err := os.Mkdir(p, 0o755); err != nil {
				if os.IsExist(err) {
					continue
				}
				return fmt.Errorf("kubeserver: cgroup %s: %w", p, err)
			}
			made = append(made, p)
			// A new cpuset cgroup starts with no CPUs and no memory nodes.
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				if b, err := os.ReadFile(filepath.Join(parentDir, file)); err == nil {
					_ = os.WriteFile(filepath.Join(p, file), b, 0o644)
				}
			}
			if m.v2 {
				_ = os.WriteFile(filepath.Join(parentDir, "cgroup.subtree_control"), []byte("+cpu +cpuset +memory +pids +io +hugetlb"), 0o644)
			}
		}
		if m.v2 {
			for _, ctl := range []string{"+cpu", "+cpuset", "+memory", "+pids", "+io", "+hugetlb"} {
				_ = os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte(ctl), 0o644)
			}
		}
	}
	// What was made, for cleanupMachine (parents first).
	if err := os.WriteFile(filepath.Join(c.Dir, "cgroups-made"), []byte(strings.Join(made, "\n")), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return nil
}

func (c *Cluster) cgroupRoot() string {
	b, err := os.ReadFile(filepath.Join(c.Dir, "cgroup-root"))
	if err != nil {
		return ""
	}
	return string(b)
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	d := filepath.Join(c.Dir, "containerd")
	c.containerdSock = filepath.Join(d, "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which a
  # container (like Docker's default) may not have: keep the pods' scores
  # at or above containerd's own.
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[9]q
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[10]s]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[10]s.options]
        Root = %[9]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.containerdSock, c.containerdSock+".ttrpc",
		filepath.Join(d, "opt"), PauseImage, cniBinDir, filepath.Join(c.Dir, "cni", "net.d"), filepath.Join(d, "runc"), RuntimeHandler)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	// gVisor's runtime handler (gvisor.go): a few lines of configuration,
	// usable once runsc and its shim are built.
	gvisor, gerr := c.gvisorContainerdConfig()
	if gerr != nil {
		return gerr
	}
	cfg += gvisor
	conf := filepath.Join(d, "config.toml")
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	// Through env(1), which execs containerd with gVisor's shim on its
	// PATH (gvisor.go).
	if err := c.spawn("containerd", "env", c.containerdPath(), "containerd", "--config", conf); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !c.running("containerd") {
			return false, errors.New("containerd exited (see " + c.logPath("containerd") + ")")
		}
		return exec.CommandContext(ctx, "ctr", "--address", c.containerdSock, "version").Run() == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kubeserver: containerd did not start: %w", err)
	}
	return nil
}

func (c *Cluster) startKubelet() error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	p := c.pki
	client, err := p.issue("kubelet-client", "system:node:"+c.NodeName, []string{"system:nodes"}, nil, nil)
	if err != nil {
		return err
	}
	serving, err := p.issue("kubelet-serving", "system:node:"+c.NodeName, []string{"system:nodes"},
		[]net.IP{net.ParseIP(c.NodeIP)}, []string{c.NodeName})
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(c.Dir, "kubelet.kubeconfig")
	if err := writeKubeconfig(kubeconfig, c.Server, p.CAPEM, kubeconfigUser{CertFile: client.Cert, KeyFile: client.Key}, ""); err != nil {
		return err
	}
	root := filepath.Join(c.Dir, "kubelet")
	logs := filepath.Join(c.Dir, "pod-logs")
	for _, d := range []string{root, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("kubeserver: %w", err)
		}
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %q
port: %d
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %q
tlsPrivateKeyFile: %q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: %q
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: %q
imageServiceEndpoint: %q
podLogsDir: %q
resolvConf: /etc/resolv.conf
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
  imagefs.inodesFree: "1%%"
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
maxPods: 250
# No iptables chains in the machine's own tables.
makeIPTablesUtilChains: false
logging:
  format: text
`, c.NodeIP, ports[0], serving.Cert, serving.Key, p.CAFile, c.cgroupRoot(),
		"unix://"+c.containerdSock, "unix://"+c.containerdSock, logs)
	conf := filepath.Join(c.Dir, "kubelet.yaml")
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return c.spawn("kubelet", c.bins.Kubelet, "--config="+conf, "--kubeconfig="+kubeconfig,
		"--hostname-override="+c.NodeName, "--node-ip="+c.NodeIP, "--root-dir="+root, "--v=1")
}

// stopNode stops the kubelet, removes every container of the node's
// containerd, stops it, and undoes what startNode did to the machine.
func (c *Cluster) stopNode() {
	c.kill("kubelet", 0)
	if c.running("containerd") {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c.removeContainers(ctx)
		cancel()
	}
	c.kill("containerd", 5*time.Second)
	if c.Dir == "" {
		return
	}
	cleanupMachine(c.Dir, c.id, c.cgroupRoot(), c.logf)
	base := filepath.Dir(c.Dir)
	_ = withMachineLock(base, func() error { restoreTunables(base, c.Dir, c.logf); return nil })
}

// removeContainers deletes every task and container of the node's
// containerd, so that their shims exit cleanly.
func (c *Cluster) removeContainers(ctx context.Context) {
	ctr := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.containerdSock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := ctr("containers", "ls", "-q")
	if err != nil {
		c.logf("kubeserver: ctr containers ls: %v: %s", err, out)
		return
	}
	ids := strings.Fields(out)
	for _, id := range ids {
		_, _ = ctr("tasks", "rm", "-f", id)
	}
	if len(ids) > 0 {
		if out, err := ctr(append([]string{"containers", "rm"}, ids...)...); err != nil {
			c.logf("kubeserver: ctr containers rm: %v: %s", err, out)
		}
	}
}

// cleanupMachine undoes, for the cluster in dir, what a node leaves on the
// machine once its processes are gone (or died with a test binary that
// crashed): processes that still name dir (shims), processes in its
// cgroups, mounts under dir, its cgroups and its bridge. It leaves dir.
func cleanupMachine(dir, id, cgroupRoot string, logf func(string, ...any)) {
	for range 3 {
		n := killNaming(dir + "/")
		if cgroupRoot != "" {
			n += killCgroup(cgroupRoot)
		}
		if n == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	unmountUnder(dir, logf)
	removeShimSockets(dir)
	if cgroupRoot != "" {
		removeCgroup(cgroupRoot, logf)
	}
	// The parents made for cgroupRoot, if no other cluster uses them.
	if b, err := os.ReadFile(filepath.Join(dir, "cgroups-made")); err == nil {
		made := strings.Split(string(b), "\n")
		for i := len(made) - 1; i >= 0; i-- {
			if made[i] != "" {
				_ = syscall.Rmdir(made[i])
			}
		}
	}
	// On a hybrid machine runc also makes the path in the unified
	// hierarchy: remove the parents it made there, below the top level.
	if ms, err := cgroupMounts(); err == nil && cgroupV1(ms) && cgroupRoot != "" {
		for _, m := range ms {
			if !m.v2 {
				continue
			}
			for p := filepath.Dir(cgroupRoot); strings.Count(p, "/") > 1; p = filepath.Dir(p) {
				if syscall.Rmdir(filepath.Join(m.dir, p)) != nil {
					break
				}
			}
		}
	}
	bridge := "bhk-" + id
	if _, err := net.InterfaceByName(bridge); err == nil {
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil {
			logf("kubeserver: ip link del %s: %v: %s", bridge, err, out)
		}
	}
}

// removeShimSockets removes the sockets that the shims of dir's
// containerd left in containerd's fixed socket directory when they were
// killed: each is named by the SHA-256 of "ADDRESS/NAMESPACE/ID".
func removeShimSockets(dir string) {
	sock := filepath.Join(dir, "containerd", "containerd.sock")
	tasks := filepath.Join(dir, "containerd", "state", "io.containerd.runtime.v2.task")
	nss, _ := os.ReadDir(tasks)
	for _, ns := range nss {
		ids, _ := os.ReadDir(filepath.Join(tasks, ns.Name()))
		for _, id := range ids {
			sum := sha256.Sum256([]byte(sock + "/" + ns.Name() + "/" + id.Name()))
			_ = os.Remove(filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:])))
		}
	}
}

// killNaming SIGKILLs every process whose command line contains s and
// returns how many it found.
func killNaming(s string) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		n++
	}
	return n
}

// killCgroup SIGKILLs every process in the cgroup tree root (a path
// inside each hierarchy) and returns how many it found.
func killCgroup(root string) int {
	ms, _ := cgroupMounts()
	seen := map[int]bool{}
	for _, m := range ms {
		_ = filepath.WalkDir(filepath.Join(m.dir, root), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] && pid != os.Getpid() {
					seen[pid] = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
	return len(seen)
}

// removeCgroup removes the cgroup tree root in every hierarchy, children
// first, and the empty parents named bhk-*.
func removeCgroup(root string, logf func(string, ...any)) {
	ms, _ := cgroupMounts()
	for _, m := range ms {
		top := filepath.Join(m.dir, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for range 20 { // a process just killed may take a moment to leave
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				logf("kubeserver: remove cgroup %s: %v", d, err)
			}
		}
	}
}

// unmountUnder unmounts (lazily, deepest first) every mount below dir.
func unmountUnder(dir string, logf func(string, ...any)) {
	for range 5 {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return
		}
		var mps []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			if mp := unescapeMount(f[4]); strings.HasPrefix(mp, dir+"/") {
				mps = append(mps, mp)
			}
		}
		if len(mps) == 0 {
			return
		}
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				logf("kubeserver: unmount %s: %v", mp, err)
			}
		}
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// withMachineLock runs f holding the lock shared by every cluster on the
// machine (base/.lock).
func withMachineLock(base string, f func() error) error {
	lock, err := os.OpenFile(filepath.Join(base, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("kubeserver: lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("kubeserver: lock: %w", err)
	}
	return f()
}

// liveClusters lists the other cluster directories in base whose owner
// process is alive; the dead ones (left by a test binary that crashed) are
// cleaned up and removed on the way. The machine lock is held.
func liveClusters(base, self string, logf func(string, ...any)) []string {
	ents, _ := os.ReadDir(base)
	var live []string
	for _, e := range ents {
		d := filepath.Join(base, e.Name())
		if !e.IsDir() || d == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			live = append(live, d)
			continue
		}
		if err != nil {
			if fi, serr := os.Stat(d); serr == nil && time.Since(fi.ModTime()) < time.Minute {
				live = append(live, d) // being created right now
				continue
			}
		}
		cg, _ := os.ReadFile(filepath.Join(d, "cgroup-root"))
		cleanupMachine(d, e.Name(), string(cg), logf)
		_ = os.RemoveAll(d)
		logf("kubeserver: removed the leftovers of a dead cluster in %s", d)
	}
	return live
}

// saveTunables records the kernel settings the kubelet will change, when
// no other cluster runs (base/sysctl.orig, kept if a dead cluster left it).
func (c *Cluster) saveTunables(base string) error {
	if len(liveClusters(base, c.Dir, c.logf)) > 0 {
		return nil
	}
	file := filepath.Join(base, "sysctl.orig")
	if _, err := os.Stat(file); err == nil {
		return nil
	}
	var b strings.Builder
	for _, k := range kernelTunables {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s=%s\n", k, strings.TrimSpace(string(v)))
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return nil
}

// restoreTunables puts back the recorded kernel settings when no other
// cluster runs.
func restoreTunables(base, self string, logf func(string, ...any)) {
	if len(liveClusters(base, self, logf)) > 0 {
		return
	}
	file := filepath.Join(base, "sysctl.orig")
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			logf("kubeserver: restore %s: %v", k, err)
		}
	}
	_ = os.Remove(file)
}
