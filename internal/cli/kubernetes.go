package cli

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/kubernetes"
)

// kubeFlags configure the kubernetes provider.
type kubeFlags struct {
	kubeconfig, context, namespace, connect, runtimeClass, pullPolicy string
	// harnessCIDRs may reach the daemons' port (NetworkPolicy ingress).
	harnessCIDRs []string
	// pool is the warm pool `sandbox create --pool` claims from.
	pool string
}

// add registers the kubernetes provider's flags.
func (k *kubeFlags) add(pf *pflag.FlagSet) {
	pf.StringVar(&k.kubeconfig, "kubeconfig", "", "kubernetes sandboxes: the kubeconfig (default: $KUBECONFIG, ~/.kube/config, or the in-cluster account); a session remembers it")
	pf.StringVar(&k.context, "kube-context", "", "kubernetes sandboxes: the kubeconfig context to use (default: its current context); a session remembers it")
	pf.StringVar(&k.namespace, "namespace", "", "kubernetes sandboxes: the namespace (default: the kubeconfig context's, else default); a session remembers it")
	pf.StringVar(&k.connect, "kube-connect", string(kubernetes.ConnectPortForward), "kubernetes sandboxes: how to reach the daemon: port-forward (through the API server), pod-ip (from inside the cluster) or exec (a relay through the API server, for gVisor/Kata); a session remembers it")
	pf.StringArrayVar(&k.harnessCIDRs, "kube-harness-cidr", nil, "kubernetes sandboxes: a CIDR the harness connects from, admitted by each sandbox's NetworkPolicy (needed with --kube-connect pod-ip; repeatable)")
	pf.StringVar(&k.runtimeClass, "runtime-class", "", "kubernetes sandboxes: the RuntimeClass of the Pods (gVisor, Kata)")
	pf.StringVar(&k.pullPolicy, "kube-pull-policy", "", "kubernetes sandboxes: the image pull policy of the Pods: Always, IfNotPresent or Never (default IfNotPresent); a session remembers it")
}

// poolUsage documents `sandbox create --pool`.
const poolUsage = "kubernetes sandboxes: claim a ready Pod from this warm pool, kept filled by another process (a Go program with kubernetes.Config.Pools) " +
	"with the default workspace root and run_as user; with none ready the sandbox is created cold"

// kubeClientConfig is the client configuration --kubeconfig and
// --kube-context name (the usual loading rules otherwise).
func (k *kubeFlags) kubeClientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if k.kubeconfig != "" {
		rules.ExplicitPath = k.kubeconfig
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: k.context})
}

// kubernetesConfig returns the provider configuration and the API server's
// REST configuration the flags describe. It resolves the kubeconfig (made
// absolute), the context and the namespace in g.kube, as a new session
// remembers them (see sessionSettings).
func (g *globals) kubernetesConfig() (kubernetes.Config, *rest.Config, error) {
	if len(g.allowDomains) > 0 {
		return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "--allow-domain: kubernetes sandboxes' egress is set by the provider's NetworkPolicy configuration, not by domain")
	}
	labels := map[string]string{}
	for _, l := range g.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "--label %q: want KEY=VALUE", l)
		}
		labels[k] = v
	}
	var pull corev1.PullPolicy
	switch p := corev1.PullPolicy(g.kube.pullPolicy); p {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
		pull = p
	default:
		return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "--kube-pull-policy %q: want Always, IfNotPresent or Never", g.kube.pullPolicy)
	}
	cfg := kubernetes.Config{
		Namespace: g.kube.namespace, Image: g.image, Labels: labels, ImagePullPolicy: pull,
		Connect: kubernetes.Connect(g.kube.connect), RuntimeClassName: g.kube.runtimeClass,
	}
	for _, cidr := range g.kube.harnessCIDRs {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "--kube-harness-cidr %q: %v", cidr, err)
		}
		cfg.HarnessPeers = append(cfg.HarnessPeers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}})
	}
	if g.kube.pool != "" {
		// Claims only: this process keeps no pool filled (Size 0).
		cfg.Pools = []kubernetes.Pool{{Name: g.kube.pool}}
	}
	if g.kube.kubeconfig != "" {
		abs, err := filepath.Abs(g.kube.kubeconfig)
		if err != nil {
			return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "--kubeconfig %s: %v", g.kube.kubeconfig, err)
		}
		g.kube.kubeconfig = abs
	}
	cc := g.kube.kubeClientConfig()
	rc, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "kubernetes: no kubeconfig found: give --kubeconfig (and --kube-context), set $KUBECONFIG, or run inside a cluster")
	}
	if err != nil {
		return kubernetes.Config{}, nil, usageErr(compute.ErrInvalidArgument, "kubernetes: kubeconfig: %v", oneLine(err.Error()))
	}
	if g.kube.context == "" {
		if raw, err := cc.RawConfig(); err == nil {
			g.kube.context = raw.CurrentContext
		}
	}
	if cfg.Namespace == "" {
		if ns, _, err := cc.Namespace(); err == nil {
			cfg.Namespace = ns
		}
		g.kube.namespace = cfg.Namespace
	}
	if g.kube.kubeconfig == "" {
		// Remember $KUBECONFIG when it names one file.
		if env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); env != "" && !strings.ContainsRune(env, os.PathListSeparator) {
			if abs, err := filepath.Abs(env); err == nil {
				g.kube.kubeconfig = abs
			}
		}
	}
	return cfg, rc, nil
}

// kubernetesProvider makes the kubernetes provider the flags describe;
// --label and --image apply as for docker.
func (g *globals) kubernetesProvider(log *zap.Logger) (*kubernetes.Provider, error) {
	cfg, rc, err := g.kubernetesConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.New(cfg, rc, log)
}
