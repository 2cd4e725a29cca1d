// Package kubeserver runs a real, single-node Kubernetes cluster for
// tests, on loopback and in private directories: etcd, kube-apiserver
// (TLS, client certificates, ServiceAccount tokens, --authorization-mode=
// Node,RBAC), kube-controller-manager (garbage collector, namespace
// deletion, ServiceAccounts), kube-scheduler, and one node: a kubelet
// with its own containerd instance (own root, state, socket and config),
// CNI bridge networking on a bridge of its own, and a locally built pause
// image. Pods really run, are reachable on their IP from this host, and
// port-forward, exec and logs go through the API server to the kubelet.
//
// The binaries are built from the Go module proxy once per machine and
// cached (see Binaries). The cluster needs Linux, root, containerd, runc,
// the CNI plugins (Debian: containerd, containernetworking-plugins) and
// iproute2; tests ask for them through internal/testing/testenv (Require), so
// they skip on a machine without them and fail under CI=true.
//
// Starting a cluster takes about 10 seconds (control plane 4 s, node 5
// s); a Pod from a local image runs within a second or two. A package
// whose tests share one cluster calls Run from its TestMain and Shared
// from its tests, each test working in its own Namespace; Start gives a
// test a cluster of its own. Clusters of several test binaries run side
// by side.
//
// What a node does to the machine, and undoes in Stop: a bridge bhk-ID
// with a random /24 in 10.128.0.0/9 (no masquerading, no iptables rules;
// the pods reach nothing but this host and each other), cgroups under
// this process's own memory cgroup (.../bhk-ID, in every v1 hierarchy),
// mounts under Dir, shim sockets in /run/containerd/s, and six kernel
// settings the kubelet insists on (vm.overcommit_memory,
// kernel.panic_on_oops, ...), put back when the last cluster on the
// machine stops. A test binary that is killed leaves its node behind;
// the next cluster started on the machine removes it. Nothing of the
// machine's own Docker, containerd or /var/lib/kubelet is touched.
//
// With Options.NetworkPolicy the node also runs a NetworkPolicy enforcer
// (kube-network-policies, see netpol.go): an nftables table of its own
// and, where Docker's chains are present, one rule in Docker's
// DOCKER-USER chain for the cluster's bridge; both go the same way.
//
// This package speaks to the API server with plain net/http (see Do);
// it imports no client-go.
package kubeserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// StorageClass is the cluster's default StorageClass: the
// controller-manager's hostPath provisioner (for tests only), which
// binds a PersistentVolumeClaim at once to a new directory under
// /tmp/hostpath_pv (mode 0750, owned by root; fsGroup does not apply) and
// removes it when the claim goes (reclaim policy Delete).
const StorageClass = "bulkhead-hostpath"

// RuntimeHandler is a second containerd runtime handler of the node (runc,
// like the default), for tests of Pods that name a RuntimeClass: create a
// RuntimeClass with this handler.
const RuntimeHandler = "bulkhead-runc"

// Options tune a cluster.
type Options struct {
	// Logf hears progress and timings (nil: quiet).
	Logf func(format string, args ...any)
	// ExtraAPIServerArgs are appended to kube-apiserver's flags.
	ExtraAPIServerArgs []string
	// NetworkPolicy runs a NetworkPolicy enforcer on the node
	// (kube-network-policies, see netpol.go), so that policies are
	// enforced, not only stored. Start then also needs
	// NetworkPolicyNeeds.
	NetworkPolicy bool
}

// Cluster is a running cluster. Its fields are read-only.
type Cluster struct {
	// Server is the API server's URL (https://127.0.0.1:PORT).
	Server string
	// AdminKubeconfig is the path of a kubeconfig for the cluster admin
	// (a client certificate in group system:masters).
	AdminKubeconfig string
	// CAFile is the cluster CA's certificate (PEM), which signed the API
	// server's serving certificate.
	CAFile string
	// NodeName is the one node's name; NodeIP its address (the gateway of
	// its pod network, on a bridge of its own); PodCIDR the pod network.
	NodeName, NodeIP, PodCIDR string
	// Dir holds the cluster's state, certificates, configuration and logs
	// (Dir/logs/NAME.log); removed by Stop.
	Dir string

	id             string
	logf           func(string, ...any)
	opts           Options
	bins           Bins
	pki            *pki
	admin          *http.Client
	containerdSock string
	bridge         string
	apiAddr        string
	apiArgs        []string

	mu    sync.Mutex
	procs map[string]*proc
}

// proc is a process the cluster started.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// Needs are what a cluster needs from the machine, for testenv.Require.
func Needs() []testenv.Need {
	return []testenv.Need{testenv.Linux, testenv.Root, testenv.Tool("go"), testenv.Tool("containerd"), testenv.Tool("ctr"),
		testenv.Tool("runc"), testenv.Tool("containerd-shim-runc-v2"), testenv.Tool("ip"),
		testenv.Condition(fileExists(cniBinDir+"/bridge") && fileExists(cniBinDir+"/host-local") && fileExists(cniBinDir+"/loopback"),
			"no CNI plugins in "+cniBinDir+" (Debian: containernetworking-plugins)"),
		testenv.Condition(fileExists("/sys/fs/cgroup/memory") || fileExists("/sys/fs/cgroup/cgroup.controllers"), "no cgroup filesystem")}
}

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Start builds the binaries (once per machine), starts a cluster for t
// and stops it when t ends. Without the machine's parts (Needs) the test
// skips through testenv (fails under CI=true).
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testenv.Require(t, Needs()...)
	if opts.NetworkPolicy {
		testenv.Require(t, NetworkPolicyNeeds()...)
	}
	requireTimeForBuild(t)
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout+5*time.Minute)
	defer cancel()
	c, err := New(ctx, opts)
	if c != nil {
		t.Cleanup(func() {
			if t.Failed() {
				c.dumpLogs(t.Logf)
			}
			c.Stop()
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// requireTimeForBuild skips t (fails it under CI=true, where the prebuild
// step builds the binaries first) when the binaries are not built yet and
// the test binary's -timeout leaves too little time for a cold build.
func requireTimeForBuild(t testing.TB) {
	t.Helper()
	if Built() {
		return
	}
	type deadliner interface{ Deadline() (time.Time, bool) }
	if d, ok := t.(deadliner); ok {
		if dl, ok := d.Deadline(); ok && time.Until(dl) < 25*time.Minute {
			testenv.Skip(t, "the test cluster's binaries are not built yet, and a cold build (about 10 minutes on 2 cores) "+
				"may not fit this test binary's -timeout: run `make kube-tools` first")
		}
	}
}

// New builds the binaries if needed and starts a cluster. On error the
// returned cluster (when not nil) holds what had started: Stop it. The
// caller stops a running cluster with Stop.
func New(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	bins, err := Binaries(ctx, opts.Logf)
	if err != nil {
		return nil, err
	}
	id := randHex(4)
	base := filepath.Join(os.TempDir(), "bhk")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("kubeserver: %w", err)
	}
	dir := filepath.Join(base, id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubeserver: %w", err)
	}
	c := &Cluster{Dir: dir, id: id, opts: opts, logf: opts.Logf, bins: bins, procs: map[string]*proc{},
		NodeName: "bhk-" + id, bridge: "bhk-" + id, CAFile: filepath.Join(dir, "pki", "ca.crt")}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return c, fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return c, fmt.Errorf("kubeserver: %w", err)
	}
	cleanNetpolLeftovers(base, c.logf)
	start := time.Now()
	if err := c.startControlPlane(ctx); err != nil {
		return c, err
	}
	c.logf("kubeserver: control plane up in %s (%s)", time.Since(start).Round(time.Millisecond), c.Server)
	t := time.Now()
	if err := c.startNode(ctx); err != nil {
		return c, err
	}
	c.logf("kubeserver: node %s ready in %s (cluster in %s)", c.NodeName, time.Since(t).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if opts.NetworkPolicy {
		if err := c.startNetpol(ctx); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	p, err := newPKI(filepath.Join(c.Dir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	saKey, saPub, err := p.serviceAccountKey()
	if err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.apiAddr = "127.0.0.1:" + strconv.Itoa(ports[2])
	c.Server = "https://" + c.apiAddr

	// etcd: plain HTTP on loopback, no fsync (test data).
	if err := c.spawn("etcd", c.bins.Etcd, "--name=default", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}

	serving, err := p.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	kubeletClient, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	admin, err := p.issue("admin", "bulkhead-admin", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	if c.admin, err = newAdminClient(p.CAPEM, admin); err != nil {
		return err
	}
	c.AdminKubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.AdminKubeconfig, c.Server, p.CAPEM, kubeconfigUser{CertFile: admin.Cert, KeyFile: admin.Key}, ""); err != nil {
		return err
	}
	c.apiArgs = append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[2]),
		"--tls-cert-file=" + serving.Cert, "--tls-private-key-file=" + serving.Key,
		"--client-ca-file=" + p.CAFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none",
		"--kubelet-client-certificate=" + kubeletClient.Cert, "--kubelet-client-key=" + kubeletClient.Key,
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}, c.opts.ExtraAPIServerArgs...)
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	sc := map[string]any{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
		"metadata": map[string]any{"name": StorageClass,
			"annotations": map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		"provisioner": "kubernetes.io/host-path", "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}
	if err := c.Do(ctx, http.MethodPost, "/apis/storage.k8s.io/v1/storageclasses", sc, nil); err != nil {
		return err
	}

	cm, err := p.issue("controller-manager", "system:kube-controller-manager", nil, nil, nil)
	if err != nil {
		return err
	}
	cmConfig := filepath.Join(c.Dir, "controller-manager.kubeconfig")
	if err := writeKubeconfig(cmConfig, c.Server, p.CAPEM, kubeconfigUser{CertFile: cm.Cert, KeyFile: cm.Key}, ""); err != nil {
		return err
	}
	if err := c.spawn("kube-controller-manager", c.bins.ControllerManager,
		"--kubeconfig="+cmConfig,
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--leader-elect=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file="+saKey, "--root-ca-file="+p.CAFile,
		"--cluster-signing-cert-file="+p.CAFile, "--cluster-signing-key-file="+filepath.Join(p.dir, "ca.key"),
		"--enable-hostpath-provisioner=true",
		"--concurrent-gc-syncs=5", "--v=1"); err != nil {
		return err
	}
	sched, err := p.issue("scheduler", "system:kube-scheduler", nil, nil, nil)
	if err != nil {
		return err
	}
	schedConfig := filepath.Join(c.Dir, "scheduler.kubeconfig")
	if err := writeKubeconfig(schedConfig, c.Server, p.CAPEM, kubeconfigUser{CertFile: sched.Cert, KeyFile: sched.Key}, ""); err != nil {
		return err
	}
	return c.spawn("kube-scheduler", c.bins.Scheduler,
		"--kubeconfig="+schedConfig,
		"--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false", "--v=1")
}

// startAPIServer starts kube-apiserver and waits until /readyz says ok.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	if err := c.spawn("kube-apiserver", c.bins.APIServer, c.apiArgs...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !c.running("kube-apiserver") {
			return false, errors.New("kube-apiserver exited (see " + c.logPath("kube-apiserver") + ")")
		}
		return c.Do(ctx, http.MethodGet, "/readyz", nil, nil) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kubeserver: kube-apiserver not ready: %w", err)
	}
	return nil
}

// RestartAPIServer stops kube-apiserver (SIGKILL, as a crash) and starts
// it again on the same address with the same flags, waiting until it is
// ready. Clients see refused connections in between; etcd, the node and
// its Pods stay. On a Shared cluster every test of the binary sees it.
func (c *Cluster) RestartAPIServer(t testing.TB) {
	t.Helper()
	c.StopAPIServer()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
}

// StopAPIServer kills kube-apiserver; StartAPIServer starts it again.
func (c *Cluster) StopAPIServer() { c.kill("kube-apiserver", 0) }

// StartAPIServer starts a stopped kube-apiserver again on the same address
// and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if c.running("kube-apiserver") {
		return errors.New("kubeserver: kube-apiserver is running")
	}
	return c.startAPIServer(ctx)
}

func (c *Cluster) logPath(name string) string { return filepath.Join(c.Dir, "logs", name+".log") }

// spawn starts a process of the cluster, its output appended to its log.
// It dies with the test binary (Pdeathsig) and runs in its own process
// group.
func (c *Cluster) spawn(name, bin string, args ...string) error {
	log, err := os.OpenFile(c.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("kubeserver: start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: log}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return nil
}

func (c *Cluster) running(name string) bool {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill stops a process: SIGTERM and up to grace to exit, then SIGKILL to
// its process group (grace 0: SIGKILL at once).
func (c *Cluster) kill(name string, grace time.Duration) {
	c.mu.Lock()
	p := c.procs[name]
	delete(c.procs, name)
	c.mu.Unlock()
	if p == nil {
		return
	}
	if grace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	p.log.Close()
}

// Stop stops everything the cluster started and removes what it made:
// Pods' containers and their shims, mounts under Dir, cgroups, the bridge,
// the kernel settings the kubelet changed, the directories of dynamically
// provisioned volumes, and Dir. Stopping twice is fine.
func (c *Cluster) Stop() {
	c.stopNetpol()
	c.removeVolumeDirs()
	c.stopNode()
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		c.kill(name, 0)
	}
	if c.admin != nil {
		c.admin.CloseIdleConnections()
	}
	if c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			c.logf("kubeserver: remove %s: %v", c.Dir, err)
		}
	}
}

// hostPathVolumes is where the controller-manager's hostPath provisioner
// puts the volumes it makes (fixed in Kubernetes).
const hostPathVolumes = "/tmp/hostpath_pv/"

// removeVolumeDirs removes the directories of the hostPath volumes still
// in the cluster (those deleted before were removed by the provisioner).
func (c *Cluster) removeVolumeDirs() {
	if c.admin == nil || !c.running("kube-apiserver") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var pvs struct {
		Items []struct {
			Spec struct {
				HostPath *struct{ Path string } `json:"hostPath"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := c.Do(ctx, http.MethodGet, "/api/v1/persistentvolumes", nil, &pvs); err != nil {
		c.logf("kubeserver: list volumes: %v", err)
		return
	}
	for _, pv := range pvs.Items {
		if hp := pv.Spec.HostPath; hp != nil && strings.HasPrefix(filepath.Clean(hp.Path), hostPathVolumes) {
			_ = os.RemoveAll(filepath.Clean(hp.Path))
		}
	}
}

// dumpLogs shows the last errors and warnings of each component's log.
func (c *Cluster) dumpLogs(logf func(string, ...any)) {
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet", "kube-network-policies"} {
		b, err := os.ReadFile(c.logPath(name))
		if err != nil || len(b) == 0 {
			continue
		}
		var keep []string
		for _, line := range strings.Split(string(b), "\n") {
			if len(line) > 0 && (line[0] == 'E' || line[0] == 'W' || line[0] == 'F' || strings.Contains(line, "level=error") ||
				strings.Contains(line, "level=warn") || strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"warn"`)) {
				if len(line) > 600 {
					line = line[:600] + "..."
				}
				keep = append(keep, line)
			}
		}
		if len(keep) > 15 {
			keep = keep[len(keep)-15:]
		}
		if len(keep) > 0 {
			logf("%s log (%s), last errors and warnings:\n%s", name, c.logPath(name), strings.Join(keep, "\n"))
		}
	}
}

func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubeserver: pick a port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
