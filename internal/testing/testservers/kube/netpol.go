package kubeserver

// A NetworkPolicy enforcer for the test cluster (Options.NetworkPolicy).
//
// The node's CNI (the plain bridge plugin) ignores NetworkPolicies. With
// the option on, the cluster also runs kube-network-policies
// (sigs.k8s.io/kube-network-policies, by Kubernetes SIG Network): a
// controller that watches Pods, Namespaces and NetworkPolicies, sends the
// first packet of each new connection to or from a Pod selected by a
// policy to user space through a netfilter queue, and accepts or drops it
// by the policies.
//
// It is upstream's controller (pkg/networkpolicy) with a main of our own
// and two small patches, applied at build time to a copy of the module
// that the build's throwaway main module points at (a replace; it is built
// with the cluster's other binaries, in the same go build, build.go):
//
//   - The queue statement. Upstream emits nftables' native `queue`
//     expression, which needs a kernel built with CONFIG_NFT_QUEUE; the
//     Firecracker kernels this project's machines run lack it (adding such
//     a rule fails with ENOENT), but they have the xtables NFQUEUE target
//     and nft_compat. The patch emits the NFQUEUE target (revision 3,
//     same queue, same bypass flag) through nft_compat instead: the same
//     queue, fed by the same rule, in the same table.
//   - NRI. Upstream learns Pod IPs early from the runtime through NRI, on
//     the machine's default NRI socket (/var/run/nri/nri.sock): that would
//     be the machine's containerd, not the node's, so our main turns NRI
//     off (Pod IPs come from the API server), and a patch makes the lookup
//     of an address that is no Pod's return "no Pod" instead of
//     dereferencing the missing NRI plugin.
//
// What it does to the machine, scoped to this cluster:
//
//   - One nftables table of its own, `inet bhk-netpol-ID`, whose chain
//     (postrouting, filter) queues only the packets from or to this node's
//     Pods that a policy selects (a set of their IPs; other clusters'
//     Pods are on other nodes, so in no set of ours), on a netfilter
//     queue number of its own. Established traffic and traffic that
//     root's own sockets on the host send are accepted untouched (upstream
//     does that so that kubelet probes are never blocked): the harness in
//     a test, which runs as root on the host, is therefore not subject to
//     policies; tests probe from Pods.
//   - When Docker's FORWARD chain is present (its policy is DROP, and with
//     br_netfilter it also sees bridged traffic, so Pod-to-Pod traffic on
//     the node's bridge is dropped), one rule in Docker's DOCKER-USER chain
//     (the chain Docker leaves to users) accepting traffic that enters and
//     leaves this cluster's bridge: `-i bhk-ID -o bhk-ID -j ACCEPT`.
//     Without it no Pod reaches another, allowed or not.
//
// Stop removes both (the controller deletes its table when it gets
// SIGTERM; Stop deletes it again in case it could not). A test binary
// that is killed leaves them behind; the next cluster started on the
// machine removes those of clusters whose owner is gone.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// NetworkPolicyVersion is the kube-network-policies module the enforcer is
// built from.
const NetworkPolicyVersion = "v0.8.0"

// netpolModule is kube-network-policies' module path.
const netpolModule = "sigs.k8s.io/kube-network-policies"

// netpolName is the enforcer binary's name, and the directory of its main
// in the build's wrapper module.
const netpolName = "network-policy-enforcer"

// NetworkPolicyNeeds are what the enforcer needs from the machine besides
// the cluster's Needs: the nft command (to inspect and clean up its
// table), the kernel's netfilter queue and its NFQUEUE target.
func NetworkPolicyNeeds() []testenv.Need {
	return []testenv.Need{
		testenv.Tool("nft"),
		testenv.Condition(fileExists("/proc/net/netfilter/nfnetlink_queue"),
			"the kernel has no netfilter queue (/proc/net/netfilter/nfnetlink_queue; CONFIG_NETFILTER_NETLINK_QUEUE)"),
		testenv.Condition(hasNFQueueTarget(), "the kernel has no xtables NFQUEUE target (/proc/net/ip_tables_targets; CONFIG_NETFILTER_XT_TARGET_NFQUEUE)"),
	}
}

func hasNFQueueTarget() bool {
	b, err := os.ReadFile("/proc/net/ip_tables_targets")
	if err != nil {
		return false
	}
	for _, l := range strings.Fields(string(b)) {
		if l == "NFQUEUE" {
			return true
		}
	}
	return false
}

// netpolMain is the enforcer's main: upstream's controller for one node,
// with a kubeconfig, a table name and a queue number of its own, NRI off.
const netpolMain = `// Command kube-network-policies runs kube-network-policies' NetworkPolicy
// controller for one node of a test cluster.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig with rights to watch pods, namespaces and networkpolicies")
	node := flag.String("node-name", "", "the node whose Pods the policies are enforced for")
	table := flag.String("table", "", "the nftables table (family inet) of this controller")
	queue := flag.Int("nfqueue-id", 0, "the netfilter queue number of this controller")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *node == "" || *table == "" || *queue <= 0 || *queue > 65535 {
		fmt.Fprintln(os.Stderr, "usage: kube-network-policies -kubeconfig FILE -node-name NODE -table NAME -nfqueue-id N")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	ctrl, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{QueueID: *queue, NodeName: *node, NFTableName: *table, NRIdisabled: true})
	if err != nil {
		klog.Fatalf("controller: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	factory.Start(ctx.Done())
	// Run deletes the table when it returns.
	err = <-done
	if ctx.Err() == nil {
		klog.Errorf("controller stopped: %v", err)
		os.Exit(1)
	}
}
`

// netpolCompat is added to upstream's package: the NFQUEUE target
// through nft_compat, in place of nftables' native queue expression.
const netpolCompat = `package networkpolicy

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// compatQueue sends the packet to netfilter queue id with the xtables
// NFQUEUE target (revision 3: struct xt_NFQ_info_v3 {queuenum,
// queues_total, flags}) through nft_compat, for kernels built without
// nftables' queue expression (CONFIG_NFT_QUEUE). failOpen sets
// NFQ_FLAG_BYPASS, as the native expression's bypass flag does.
func compatQueue(id int, failOpen bool) expr.Any {
	info := make([]byte, 6)
	binary.NativeEndian.PutUint16(info[0:], uint16(id))
	binary.NativeEndian.PutUint16(info[2:], 1)
	if failOpen {
		binary.NativeEndian.PutUint16(info[4:], 1)
	}
	u := xt.Unknown(info)
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &u}
}
`

// netpolPatches are the replacements made in upstream's
// pkg/networkpolicy/controller.go, each with the number of times its old
// text must occur (else the build fails: the recipe needs updating).
var netpolPatches = []struct {
	old, new string
	n        int
}{
	{old: "\tqueue := &expr.Queue{Num: uint16(c.config.QueueID)}\n\tif c.config.FailOpen {\n\t\tqueue.Flag = expr.QueueFlagBypass\n\t}\n",
		new: "\tqueue := compatQueue(c.config.QueueID, c.config.FailOpen)\n", n: 2},
	{old: "\t\tif len(objs) == 0 {\n\t\t\tpodKey := c.nriPlugin.GetPodFromIP(podIP)\n",
		new: "\t\tif len(objs) == 0 {\n\t\t\tif c.nriPlugin == nil {\n\t\t\t\treturn nil\n\t\t\t}\n\t\t\tpodKey := c.nriPlugin.GetPodFromIP(podIP)\n", n: 1},
}

// patchNetpol points the wrapper module at dir at a patched copy of the
// kube-network-policies version it requires (the go command refuses
// overlays of files in the module cache, hence a copy and a replace).
func patchNetpol(ctx context.Context, dir string) error {
	mod, err := moduleVersion(ctx, dir, netpolModule)
	if err != nil {
		return err
	}
	patchedDir := filepath.Join(dir, "kube-network-policies")
	if err := copyTree(mod.Dir, patchedDir); err != nil {
		return err
	}
	pkgDir := filepath.Join(patchedDir, "pkg", "networkpolicy")
	orig, err := os.ReadFile(filepath.Join(pkgDir, "controller.go"))
	if err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	patched := string(orig)
	for _, p := range netpolPatches {
		if got := strings.Count(patched, p.old); got != p.n {
			return fmt.Errorf("kubeserver: patching %s@%s: %q occurs %d times, not %d: the recipe in netpol.go needs updating",
				netpolModule, mod.Version, firstLineOf(p.old), got, p.n)
		}
		patched = strings.ReplaceAll(patched, p.old, p.new)
	}
	if err := os.WriteFile(filepath.Join(pkgDir, "controller.go"), []byte(patched), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(pkgDir, "zz_bulkhead_nfqueue_compat.go"), []byte(netpolCompat), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	_, err = goCmd(ctx, dir, "mod", "edit", "-replace", netpolModule+"="+patchedDir)
	return err
}

// copyTree copies the regular files and directories under from to to
// (writable: the module cache's copies are read-only).
func copyTree(from, to string) error {
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, b, 0o644)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kubeserver: copy %s: %w", from, err)
	}
	return nil
}

func firstLineOf(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// netpolTable is the nftables table (family inet) of cluster id's enforcer.
func netpolTable(id string) string { return "bhk-netpol-" + id }

// NetworkPolicyTable is the nftables table (family inet) of the cluster's
// enforcer ("" without Options.NetworkPolicy).
func (c *Cluster) NetworkPolicyTable() string {
	if !c.opts.NetworkPolicy {
		return ""
	}
	return netpolTable(c.id)
}

// startNetpol starts the enforcer (built with the cluster's other
// binaries) and waits until its table is in place and its queue is bound.
func (c *Cluster) startNetpol(ctx context.Context) error {
	bin := c.bins.NetworkPolicy
	base := filepath.Dir(c.Dir)
	var queue int
	if err := withMachineLock(base, func() error {
		var err error
		queue, err = freeQueue()
		if err != nil {
			return err
		}
		return c.allowBridgeForward()
	}); err != nil {
		return err
	}
	t := time.Now()
	table := netpolTable(c.id)
	if err := c.spawn("kube-network-policies", bin, "-kubeconfig="+c.AdminKubeconfig, "-node-name="+c.NodeName,
		"-table="+table, "-nfqueue-id="+strconv.Itoa(queue), "-v=2"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !c.running("kube-network-policies") {
			return false, errors.New("kube-network-policies exited (see " + c.logPath("kube-network-policies") + ")")
		}
		if exec.CommandContext(ctx, "nft", "list", "table", "inet", table).Run() != nil {
			return false, nil
		}
		bound, err := boundQueues()
		return bound[queue], err
	})
	if err != nil {
		return fmt.Errorf("kubeserver: the NetworkPolicy enforcer did not start: %w", err)
	}
	c.logf("kubeserver: NetworkPolicy enforcer kube-network-policies %s up in %s (table inet %s, queue %d)",
		NetworkPolicyVersion, time.Since(t).Round(time.Millisecond), table, queue)
	return nil
}

// stopNetpol stops the enforcer and removes its table and forward rule.
func (c *Cluster) stopNetpol() {
	if !c.opts.NetworkPolicy || c.id == "" {
		return
	}
	c.kill("kube-network-policies", 5*time.Second)
	removeNetpol(c.id, c.logf)
}

// removeNetpol removes what cluster id's enforcer put on the machine: its
// table and its DOCKER-USER rule (each only if there).
func removeNetpol(id string, logf func(string, ...any)) {
	table := netpolTable(id)
	if tables, err := netpolTables(); err == nil && tables[id] {
		if out, err := exec.Command("nft", "delete", "table", "inet", table).CombinedOutput(); err != nil {
			logf("kubeserver: nft delete table inet %s: %v: %s", table, err, strings.TrimSpace(string(out)))
		}
	}
	if ids, err := forwardRules(); err == nil && ids[id] {
		if out, err := exec.Command("iptables", append([]string{"-w", "-D"}, forwardRule(id)...)...).CombinedOutput(); err != nil {
			logf("kubeserver: iptables -D %s: %v: %s", strings.Join(forwardRule(id), " "), err, strings.TrimSpace(string(out)))
		}
	}
}

// forwardRule is the DOCKER-USER rule that lets cluster id's Pods reach
// each other across Docker's FORWARD policy (DROP).
func forwardRule(id string) []string {
	return []string{"DOCKER-USER", "-i", "bhk-" + id, "-o", "bhk-" + id, "-j", "ACCEPT"}
}

// allowBridgeForward adds the cluster's forward rule when Docker's
// DOCKER-USER chain exists. The machine lock is held.
func (c *Cluster) allowBridgeForward() error {
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil
	}
	if exec.Command("iptables", "-w", "-S", "DOCKER-USER").Run() != nil {
		return nil // no Docker chains: nothing drops forwarded traffic on their behalf
	}
	if out, err := exec.Command("iptables", append([]string{"-w", "-I"}, forwardRule(c.id)...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("kubeserver: iptables -I %s: %w: %s", strings.Join(forwardRule(c.id), " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

var (
	netpolTableRe = regexp.MustCompile(`^table inet bhk-netpol-([0-9a-f]{8})$`)
	forwardRuleRe = regexp.MustCompile(`^-A DOCKER-USER -i bhk-([0-9a-f]{8}) -o bhk-([0-9a-f]{8}) -j ACCEPT$`)
)

// netpolTables lists the cluster ids that have an enforcer table.
func netpolTables() (map[string]bool, error) {
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kubeserver: nft list tables: %w: %s", err, strings.TrimSpace(string(out)))
	}
	ids := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if m := netpolTableRe.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			ids[m[1]] = true
		}
	}
	return ids, nil
}

// forwardRules lists the cluster ids that have a DOCKER-USER rule.
func forwardRules() (map[string]bool, error) {
	out, err := exec.Command("iptables", "-w", "-S", "DOCKER-USER").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kubeserver: iptables -S DOCKER-USER: %w: %s", err, strings.TrimSpace(string(out)))
	}
	ids := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if m := forwardRuleRe.FindStringSubmatch(strings.TrimSpace(l)); m != nil && m[1] == m[2] {
			ids[m[1]] = true
		}
	}
	return ids, nil
}

// cleanNetpolLeftovers removes the enforcer tables and forward rules of
// clusters whose owner process is gone (a test binary that was killed).
// It takes the machine lock.
func cleanNetpolLeftovers(base string, logf func(string, ...any)) {
	_, nftErr := exec.LookPath("nft")
	_, iptErr := exec.LookPath("iptables")
	if nftErr != nil && iptErr != nil {
		return
	}
	_ = withMachineLock(base, func() error {
		ids := map[string]bool{}
		if nftErr == nil {
			if t, err := netpolTables(); err == nil {
				for id := range t {
					ids[id] = true
				}
			}
		}
		if iptErr == nil {
			if r, err := forwardRules(); err == nil {
				for id := range r {
					ids[id] = true
				}
			}
		}
		for id := range ids {
			if !clusterAlive(filepath.Join(base, id)) {
				removeNetpol(id, logf)
				logf("kubeserver: removed the NetworkPolicy enforcer leftovers of dead cluster %s", id)
			}
		}
		return nil
	})
}

// clusterAlive reports whether the cluster in dir is running or being
// created (the test as liveClusters makes it).
func clusterAlive(dir string) bool {
	fi, err := os.Stat(dir)
	if err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
	if err != nil {
		return time.Since(fi.ModTime()) < time.Minute
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// boundQueues lists the netfilter queue numbers a process listens on.
func boundQueues() (map[int]bool, error) {
	f, err := os.Open("/proc/net/netfilter/nfnetlink_queue")
	if err != nil {
		return nil, fmt.Errorf("kubeserver: %w", err)
	}
	defer f.Close()
	q := map[int]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 0 {
			if n, err := strconv.Atoi(fs[0]); err == nil {
				q[n] = true
			}
		}
	}
	return q, sc.Err()
}

// freeQueue picks a queue number no process listens on, away from the
// low numbers other software uses by default (kube-network-policies 100).
func freeQueue() (int, error) {
	bound, err := boundQueues()
	if err != nil {
		return 0, err
	}
	for range 100 {
		if n := 20000 + mathrand.IntN(40000); !bound[n] {
			return n, nil
		}
	}
	return 0, errors.New("kubeserver: no free netfilter queue number")
}

// NetworkPolicyCovers reports whether the cluster's enforcer has ip among
// the Pods whose new connections it checks (its set of the node's Pods
// that a policy selects): a test waits for this after creating a policy,
// since the enforcer learns of Pods and policies through watches.
func (c *Cluster) NetworkPolicyCovers(ctx context.Context, ip string) (bool, error) {
	if !c.opts.NetworkPolicy {
		return false, errors.New("kubeserver: the cluster runs no NetworkPolicy enforcer (Options.NetworkPolicy)")
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "set", "inet", netpolTable(c.id), "podips-v4").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("kubeserver: nft list set inet %s podips-v4: %w: %s", netpolTable(c.id), err, strings.TrimSpace(string(out)))
	}
	return regexp.MustCompile(`[{\s,]` + regexp.QuoteMeta(ip) + `[\s,}]`).Match(out), nil
}
