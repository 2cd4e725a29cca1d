// Package kubernetes runs Bulkhead sandboxes as Kubernetes Pods, through the
// API server with client-go.
//
// Each sandbox is a Pod running a Bulkhead image whose entrypoint is
// sandbox-agentd (bulkhead/sandbox:dev by default, the Docker provider's
// images; `make image` builds them). Per sandbox the provider creates:
//
//	Pod            bulkhead-<key>         the daemon, listening on Config.Port
//	Secret         bulkhead-<key>-token   the sandbox's token (owned by the Pod)
//	NetworkPolicy  bulkhead-<key>         ingress from the harness only; egress per config
//	PVC            bulkhead-ws-<session>  only for a volume-backed workspace
//
// # The token
//
// The token (32 random bytes, hex) lives in a Secret owned by the Pod, so
// garbage collection removes it with the Pod (Destroy also deletes it
// explicitly). The Secret is created before the Pod, so the kubelet mounts
// it at once (created after, it was missing when the kubelet first looked,
// and the kubelet's retries at 0.5, 1, 2 s doubled the start-up), and made
// the Pod's once the Pod exists, as the NetworkPolicy is; Reap adopts or
// deletes one a crash left without an owner. The Secret is mounted, as a file, into an init container
// only; that container copies it into a memory-backed emptyDir shared with
// the daemon's container at /run/bulkhead, where sandbox-agentd reads and
// removes it (--token-file), as it does everywhere else. The daemon's
// container never mounts the Secret, the token is never in an environment
// variable, argv, label or annotation, and the Pod gets no service-account
// token (automountServiceAccountToken: false). The harness reads the token
// back from the Secret to reattach, so the API server is the only state a
// restarted harness needs.
//
// # Labels and state
//
// Labels name the sandbox (bulkhead.dev/sandbox=1, bulkhead.dev/key), its
// session (bulkhead.dev/session, a label-safe form; the exact id is in an
// annotation) and the owner (Config.Labels, which List and Reap require), so
// `harness sandbox ls` and Reap find what any harness made. The lifetime
// (created-at, TTL, idle timeout, expires-at) and the last activity are
// annotations; Reap deletes expired sandboxes. Deletion is foreground and
// idempotent. A state handed to Reattach, Destroy or Launch (as Prior) is
// checked against what it names before anything is changed: a Pod created
// or claimed for another session, or a workspace PVC (marked
// bulkhead.dev/workspace-volume=1 and with its session's label) made for
// another session or not by the provider, is refused with
// compute.ErrInvalidArgument.
//
// # Reaching the daemon
//
// Config.Connect chooses the way: ConnectPodIP dials the Pod's IP (a harness
// running inside the cluster); ConnectPortForward tunnels through the API
// server's portforward subresource (WebSocket, falling back to SPDY; from
// outside the cluster); ConnectExec relays the connection through the exec
// subresource into the Pod (`nc` in the image talks to the daemon over the
// Pod's loopback), for RuntimeClasses such as gVisor or Kata where the
// kubelet's port-forward cannot reach the sandbox's network stack.
// Config.AgentDialOptions adds gRPC dial options (interceptors, a stats
// handler) to every daemon client the provider makes, whichever the way:
// `make bench` counts the daemon calls of exec_command over port-forward
// with them.
//
// # RBAC
//
// The provider needs this Role in its namespace (and nothing cluster-wide):
//
//	pods:                       get list watch create delete patch update
//	pods/portforward:           create get      (ConnectPortForward)
//	pods/exec:                  create get      (ConnectExec)
//	pods/log:                   get             (start-up failures; optional)
//	secrets:                    get list create delete patch (patch: owner, warm pool claims; list: Reap)
//	networkpolicies (networking.k8s.io): get list create delete patch (unless NetworkPolicy is disabled; list: Reap)
//	persistentvolumeclaims:     get create delete watch (volume-backed workspaces only)
//
// RequiredRules returns it as rbac/v1 PolicyRules. A missing permission
// fails with an error wrapping compute.ErrPermissionDenied that names the
// verb and the resource.
//
// # NetworkPolicy
//
// Each sandbox gets a NetworkPolicy selecting its Pod: ingress only to the
// daemon's port and only from Config.HarnessPeers (a pod/namespace selector
// or CIDR naming where the harness runs; none means no ingress from the
// Pod network at all, which still lets port-forward and exec through: they
// enter through the kubelet, not the Pod network), and egress only to
// Config.Egress (default: none, DNS included). Enforcement is the CNI's job.
// Users of agent-sandbox's managed policies: those admit ingress only from
// its sandbox-router, so a harness dialling the daemon by Pod IP needs a rule
// of its own admitting it.
//
// # Warm pools
//
// See Pool.
package kubernetes

import (
	"fmt"
	"path"
	"strings"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// ProviderName is the provider's name in compute state.
const ProviderName = "kubernetes"

// DefaultImage is the image sandboxes run when Config.Image is empty.
const DefaultImage = "bulkhead/sandbox:dev"

// DefaultPort is the daemon's TCP port inside the Pod.
const DefaultPort = 7070

// DefaultCapabilities are the capabilities the daemon's container keeps
// (all others are dropped), as in the Docker provider: the daemon runs
// processes as other users (SETUID, SETGID), creates and chowns their files
// (CHOWN, DAC_OVERRIDE, FOWNER, FSETID) and signals their process groups
// (KILL).
var DefaultCapabilities = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"}

// DefaultPoolCooldown is Config.PoolCooldown's default.
const DefaultPoolCooldown = 5 * time.Minute

// Defaults for the resource limits (a Config field of zero means these; a
// negative one means no limit).
const (
	DefaultMemory   int64 = 1 << 30 // bytes
	DefaultMilliCPU int64 = 1000
)

// Connect says how the harness reaches a sandbox's daemon.
type Connect string

const (
	// ConnectPodIP dials the Pod's IP: for a harness inside the cluster.
	ConnectPodIP Connect = "pod-ip"
	// ConnectPortForward tunnels through the API server's portforward
	// subresource (WebSocket, falling back to SPDY): from outside the
	// cluster. Unreliable under gVisor and Kata RuntimeClasses.
	ConnectPortForward Connect = "port-forward"
	// ConnectExec relays each connection through the exec subresource to
	// `nc` inside the Pod, which connects to the daemon over the Pod's
	// loopback: from outside the cluster, whatever the RuntimeClass.
	ConnectExec Connect = "exec"
)

// DeletePolicy says what Destroy removes.
type DeletePolicy int

const (
	// DeleteAll removes the Pod, its Secret and NetworkPolicy, and the
	// workspace PVC.
	DeleteAll DeletePolicy = iota
	// DeleteSandbox removes the Pod, its Secret and NetworkPolicy and keeps
	// the workspace PVC, so a later Launch with the sandbox's state as
	// Prior mounts it again.
	DeleteSandbox
)

// Config configures a Provider.
type Config struct {
	// Namespace holds the provider's objects (default: the kubeconfig's
	// namespace, else "default").
	Namespace string
	// Image is the sandbox image (default DefaultImage). Its entrypoint
	// must be sandbox-agentd, unless AgentdPath is set.
	Image string
	// ImagePullPolicy (default IfNotPresent).
	ImagePullPolicy corev1.PullPolicy
	// AgentdPath, when set, overrides the image's entrypoint.
	AgentdPath string
	// Port is the daemon's TCP port in the Pod (default DefaultPort).
	Port int
	// Connect is how the harness reaches the daemon (default
	// ConnectPortForward).
	Connect Connect
	// RuntimeClassName, when set, names a RuntimeClass (gVisor, Kata).
	RuntimeClassName string
	// ServiceAccountName runs the Pods as this account (its token is not
	// mounted either way; default: the namespace's default account).
	ServiceAccountName string
	// NodeSelector and Tolerations place the Pods.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// Memory is the memory limit in bytes (0: DefaultMemory; <0: none).
	Memory int64
	// MilliCPU is the CPU limit in thousandths of a CPU (0:
	// DefaultMilliCPU; <0: none).
	MilliCPU int64
	// Disk caps what a sandbox writes to its node's disk, in bytes (0 or
	// <0: no cap): the sandbox container's ephemeral-storage limit (its
	// writable layer and logs, and with them the Pod's emptyDirs: the
	// kubelet evicts a Pod whose total use passes the sum of its
	// containers' limits), the workspace emptyDir's sizeLimit, and the
	// storage request of a workspace PVC (VolumeWorkspace; the volume's
	// provisioner decides whether that size is enforced). The kubelet
	// enforces ephemeral storage by evicting the Pod, at its periodic
	// measurement (every few seconds to a minute), not by failing a write:
	// a session then finds its Pod gone, and its errors say it was evicted
	// and why. A disk cap is never dropped: a cluster whose kubelets run
	// without LocalStorageCapacityIsolation has none.
	Disk int64
	// RunAsUser, when set, runs the daemon as this non-root uid with
	// runAsNonRoot and no capabilities at all. Such a daemon cannot create
	// accounts or switch users: manifests must then name no run_as user
	// and no users, and Launch refuses those that do. Default: root in the
	// container (with DefaultCapabilities only), so manifests' accounts
	// work.
	RunAsUser *int64
	// Capabilities the daemon's container keeps (nil: DefaultCapabilities).
	Capabilities []corev1.Capability
	// Labels are put on every object the provider creates; List and Reap
	// only see Pods carrying all of them (the owner).
	Labels map[string]string
	// AgentdArgs are extra sandbox-agentd flags.
	AgentdArgs []string
	// NetworkPolicy: false creates none (default true: one per sandbox).
	NetworkPolicy *bool
	// HarnessPeers may reach the daemon's port over the Pod network
	// (ConnectPodIP needs one: the harness's pod/namespace selector or
	// CIDR).
	HarnessPeers []networkingv1.NetworkPolicyPeer
	// Egress are the NetworkPolicy egress rules of the sandboxes (none:
	// no egress at all, DNS included).
	Egress []networkingv1.NetworkPolicyEgressRule
	// DeletePolicy says what Destroy removes (default DeleteAll).
	DeletePolicy DeletePolicy
	// StorageClassName and VolumeSize shape workspace PVCs (default: the
	// cluster's default class, 1Gi).
	StorageClassName *string
	VolumeSize       resource.Quantity
	// ReadyTimeout bounds the wait for a Pod to run and its daemon to
	// serve (default 2m: an image pull may be part of it).
	ReadyTimeout time.Duration
	// StopTimeout is the Pod's termination grace period (default 15s).
	StopTimeout time.Duration
	// Pools are the warm pools this provider keeps filled (StartPools) and
	// claims from (CreateOptions.Pool).
	Pools []Pool
	// PoolCooldown is how long a warm pool is left alone after a claim
	// found that its image's daemon predates SystemService.RotateToken (so
	// none of its Pods can be handed out): no claim is made from it, its
	// refill is paused, and one Error log says so; sessions are created
	// cold meanwhile. Afterwards one claim tries the pool again (a rebuilt
	// image under the same reference is then used; a still old one starts
	// another cooldown). A pool whose template names another image than
	// the failed one is not held back. The cooldown is this Provider's
	// (each harness process finds out for itself). Default
	// DefaultPoolCooldown.
	PoolCooldown time.Duration
	// QPS and Burst are the client-side rate limits of the API client the
	// provider builds from a kubeconfig (default 50 and 100).
	QPS   float32
	Burst int
	// AgentDialOptions are extra gRPC dial options for every daemon client
	// the provider makes (Launch, a warm pool claim, Reattach), appended
	// after the provider's own: interceptors that count or time the daemon
	// calls (grpc.WithChainUnaryInterceptor, WithChainStreamInterceptor), a
	// stats handler, default call options. They must not replace the
	// connection: a grpc.WithContextDialer here would bypass Connect.
	AgentDialOptions []grpc.DialOption
}

// CreateOptions are per-sandbox overrides, given as LaunchSpec.Options
// (*CreateOptions or CreateOptions). Zero fields keep the Config's value.
type CreateOptions struct {
	Image    string
	Memory   int64
	MilliCPU int64
	// Disk is the disk cap in bytes (see Config.Disk; 0: the Config's).
	Disk int64
	// AgentdArgs are appended to Config.AgentdArgs.
	AgentdArgs []string
	// VolumeWorkspace puts the workspace on a PersistentVolumeClaim
	// (bulkhead-ws-<session>) instead of an emptyDir, so it can outlive the
	// Pod (DeleteSandbox).
	VolumeWorkspace bool
	// Pool claims a ready Pod from the named warm pool; with none ready,
	// or a session the pool cannot serve, the sandbox is created cold.
	Pool string
}

// Pool is a warm pool: Size ready Pods made from Template, waiting for a
// claim. Create claims one with an optimistic update of the Pod (its
// resourceVersion): of two harnesses claiming the same Pod, one wins and the
// other gets a conflict and tries the next Pod, so no Pod is ever claimed
// twice. Claimed Pods are replaced in the background (StartPools).
//
// Tokens: each pool Pod gets its own random token in its own Secret at
// creation, like a cold sandbox: no token is shared between Pods, and none
// is in the image or the Pod spec. The claimer reads the claimed Pod's
// Secret (only holders of `get secrets` in the namespace can: the harness
// role), then makes a fresh token for the session, stages it in the Secret
// under a second key ("next", written at the Secret's resourceVersion),
// hands it to the daemon with SystemService.RotateToken (authenticated
// with the pool token, which the daemon refuses from then on) and finally
// promotes it to the Secret's token, where a later Reattach finds it. A
// harness that dies between those steps leaves a state Reattach finishes
// from any process. Pool Secrets are therefore not immutable, and the
// Role needs `patch secrets`. The session's token, manifest, files and
// environment all arrive after the claim over the daemon's API, never
// baked into the warm Pod. A session the template cannot serve (another workspace root or
// run_as user) is created cold. A pool whose image's daemon cannot rotate
// tokens (it predates RotateToken) is held back for Config.PoolCooldown
// after a claim finds out. A state naming a pool Pod that was not claimed
// for its session (unclaimed, or claimed by another session) is refused,
// with ErrInvalidArgument and nothing changed, by Reattach, by Destroy and
// as Launch's Prior alike: only a claim gives a session a pool Pod.
type Pool struct {
	// Name is the pool's name (a label value).
	Name string
	// Size is how many ready, unclaimed Pods the pool keeps.
	Size int
	// Template is what every Pod of the pool is made from.
	Template PoolTemplate
}

// PoolTemplate is a pool Pod's shape.
type PoolTemplate struct {
	// Options apply as for a cold sandbox (Pool and VolumeWorkspace must be
	// unset).
	Options CreateOptions
	// WorkspaceRoot is the workspace root (default manifest.DefaultRoot);
	// sessions whose manifest names another are created cold.
	WorkspaceRoot string
	// RunAs is the default run_as user of the pool's daemons (default
	// compute.DefaultRunAsName); sessions with another are created cold.
	RunAs string
}

// Names of the things in the Pod.
const (
	containerName   = "agentd"
	initName        = "token"
	runDir          = "/run/bulkhead"
	secretMountDir  = "/var/run/bulkhead-secret"
	tokenKey        = "token"
	runVolume       = "run"
	secretVolume    = "token"
	workspaceVolume = "workspace"
)

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// withDefaults fills in the defaults and checks the configuration.
func (c Config) withDefaults() (Config, error) {
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Port < 1 || c.Port > 65535 {
		return c, fmt.Errorf("kubernetes: %w: port %d", compute.ErrInvalidArgument, c.Port)
	}
	switch c.Connect {
	case "":
		c.Connect = ConnectPortForward
	case ConnectPodIP, ConnectPortForward, ConnectExec:
	default:
		return c, fmt.Errorf("kubernetes: %w: connect %q (want %s, %s or %s)", compute.ErrInvalidArgument, c.Connect, ConnectPodIP, ConnectPortForward, ConnectExec)
	}
	if c.Connect == ConnectPodIP && boolOr(c.NetworkPolicy, true) && len(c.HarnessPeers) == 0 {
		return c, fmt.Errorf("kubernetes: %w: connect %s with a NetworkPolicy needs HarnessPeers (where the harness runs), or the policy denies the harness too", compute.ErrInvalidArgument, ConnectPodIP)
	}
	if c.RunAsUser != nil && *c.RunAsUser == 0 {
		return c, fmt.Errorf("kubernetes: %w: RunAsUser 0: leave it unset to run the daemon as root", compute.ErrInvalidArgument)
	}
	if c.Capabilities == nil {
		c.Capabilities = DefaultCapabilities
	}
	if c.RunAsUser != nil {
		c.Capabilities = nil
	}
	if c.DeletePolicy != DeleteAll && c.DeletePolicy != DeleteSandbox {
		return c, fmt.Errorf("kubernetes: %w: unknown delete policy %d", compute.ErrInvalidArgument, c.DeletePolicy)
	}
	if c.VolumeSize.IsZero() {
		c.VolumeSize = resource.MustParse("1Gi")
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 2 * time.Minute
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 15 * time.Second
	}
	switch {
	case c.PoolCooldown == 0:
		c.PoolCooldown = DefaultPoolCooldown
	case c.PoolCooldown < 0:
		return c, fmt.Errorf("kubernetes: %w: negative pool cooldown %s", compute.ErrInvalidArgument, c.PoolCooldown)
	}
	if c.QPS <= 0 {
		c.QPS = 50
	}
	if c.Burst <= 0 {
		c.Burst = 100
	}
	for k, v := range c.Labels {
		if strings.HasPrefix(k, labelPrefix) {
			return c, fmt.Errorf("kubernetes: %w: label %q: the %s prefix is reserved", compute.ErrInvalidArgument, k, labelPrefix)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return c, fmt.Errorf("kubernetes: %w: label key %q: %s", compute.ErrInvalidArgument, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return c, fmt.Errorf("kubernetes: %w: label %s value %q: %s", compute.ErrInvalidArgument, k, v, strings.Join(errs, "; "))
		}
	}
	for _, a := range c.AgentdArgs {
		if strings.Contains(a, "token") || strings.Contains(a, "listen") {
			return c, fmt.Errorf("kubernetes: %w: AgentdArgs %q: the provider sets the token and the listen address itself", compute.ErrInvalidArgument, a)
		}
	}
	seen := map[string]bool{}
	for i, p := range c.Pools {
		if errs := validation.IsValidLabelValue(p.Name); p.Name == "" || len(errs) > 0 {
			return c, fmt.Errorf("kubernetes: %w: pool name %q", compute.ErrInvalidArgument, p.Name)
		}
		if seen[p.Name] {
			return c, fmt.Errorf("kubernetes: %w: two pools named %q", compute.ErrInvalidArgument, p.Name)
		}
		seen[p.Name] = true
		if p.Size < 0 {
			return c, fmt.Errorf("kubernetes: %w: pool %s: negative size", compute.ErrInvalidArgument, p.Name)
		}
		if p.Template.Options.Pool != "" || p.Template.Options.VolumeWorkspace {
			return c, fmt.Errorf("kubernetes: %w: pool %s: a template cannot name a pool or a volume workspace", compute.ErrInvalidArgument, p.Name)
		}
		if p.Template.WorkspaceRoot == "" {
			c.Pools[i].Template.WorkspaceRoot = manifest.DefaultRoot
		}
		if p.Template.RunAs == "" && c.RunAsUser == nil {
			c.Pools[i].Template.RunAs = compute.DefaultRunAsName
		}
		if err := checkRoot(c.Pools[i].Template.WorkspaceRoot); err != nil {
			return c, err
		}
	}
	return c, nil
}

func checkRoot(root string) error {
	if !path.IsAbs(root) || path.Clean(root) != root || root == "/" || root == runDir || strings.HasPrefix(root, runDir+"/") {
		return fmt.Errorf("kubernetes: %w: workspace root %q", compute.ErrInvalidArgument, root)
	}
	return nil
}

// pool returns the named pool.
func (c Config) pool(name string) (Pool, bool) {
	for _, p := range c.Pools {
		if p.Name == name {
			return p, true
		}
	}
	return Pool{}, false
}

// limit turns a configured limit into the Pod's: 0 means the default,
// negative means none (0 returned).
func limit(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// settings is the Config with one sandbox's CreateOptions applied.
type settings struct {
	image            string
	memory, milliCPU int64
	disk             int64 // bytes; 0: no cap
	args             []string
	volume           bool
	pool             string
}

func (c Config) settings(opts any) (settings, error) {
	s := settings{image: c.Image, memory: c.Memory, milliCPU: c.MilliCPU, disk: c.Disk, args: append([]string(nil), c.AgentdArgs...)}
	o, err := compute.OptionsAs[CreateOptions]("kubernetes", "*kubernetes.CreateOptions", opts)
	if err != nil {
		return s, err
	}
	if o != nil {
		if o.Image != "" {
			s.image = o.Image
		}
		if o.Memory != 0 {
			s.memory = o.Memory
		}
		if o.MilliCPU != 0 {
			s.milliCPU = o.MilliCPU
		}
		if o.Disk != 0 {
			s.disk = o.Disk
		}
		s.args = append(s.args, o.AgentdArgs...)
		s.volume = o.VolumeWorkspace
		s.pool = o.Pool
	}
	s.memory = limit(s.memory, DefaultMemory)
	s.milliCPU = limit(s.milliCPU, DefaultMilliCPU)
	s.disk = max(s.disk, 0)
	for _, a := range s.args {
		if strings.Contains(a, "token") || strings.Contains(a, "listen") {
			return s, fmt.Errorf("kubernetes: %w: AgentdArgs %q: the provider sets the token and the listen address itself", compute.ErrInvalidArgument, a)
		}
	}
	if s.pool != "" {
		if _, ok := c.pool(s.pool); !ok {
			return s, fmt.Errorf("kubernetes: %w: no pool named %q", compute.ErrInvalidArgument, s.pool)
		}
	}
	return s, nil
}

// RequiredRules are the namespaced RBAC rules the provider needs with this
// configuration (see the package documentation).
func (c Config) RequiredRules() []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch", "update"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "delete", "patch"}},
	}
	switch c.Connect {
	case ConnectPortForward, "":
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create", "get"}})
	case ConnectExec:
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}})
	}
	if boolOr(c.NetworkPolicy, true) {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "create", "delete", "patch"}})
	}
	rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "create", "delete", "watch"}})
	return rules
}
