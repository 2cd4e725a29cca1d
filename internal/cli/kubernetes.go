package cli

import (
	"net/netip"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/kubernetes"
)

// kubeFlags configure the kubernetes provider.
type kubeFlags struct {
	kubeconfig, namespace, connect, runtimeClass string
	// harnessCIDRs may reach the daemons' port (NetworkPolicy ingress).
	harnessCIDRs []string
}

// add registers the kubernetes provider's flags.
func (k *kubeFlags) add(pf *pflag.FlagSet) {
	pf.StringVar(&k.kubeconfig, "kubeconfig", "", "kubernetes sandboxes: the kubeconfig (default: $KUBECONFIG, ~/.kube/config, or the in-cluster account)")
	pf.StringVar(&k.namespace, "namespace", "", "kubernetes sandboxes: the namespace (default: the kubeconfig context's, else default)")
	pf.StringVar(&k.connect, "kube-connect", string(kubernetes.ConnectPortForward), "kubernetes sandboxes: how to reach the daemon: port-forward (through the API server), pod-ip (from inside the cluster) or exec (a relay through the API server, for gVisor/Kata)")
	pf.StringArrayVar(&k.harnessCIDRs, "kube-harness-cidr", nil, "kubernetes sandboxes: a CIDR the harness connects from, admitted by each sandbox's NetworkPolicy (needed with --kube-connect pod-ip; repeatable)")
	pf.StringVar(&k.runtimeClass, "runtime-class", "", "kubernetes sandboxes: the RuntimeClass of the Pods (gVisor, Kata)")
}

// kubernetesProvider makes the kubernetes provider the flags describe;
// --label and --image apply as for docker.
func (g *globals) kubernetesProvider(log *zap.Logger) (*kubernetes.Provider, error) {
	if len(g.allowDomains) > 0 {
		return nil, usageErr(compute.ErrInvalidArgument, "--allow-domain: kubernetes sandboxes' egress is set by the provider's NetworkPolicy configuration, not by domain")
	}
	labels := map[string]string{}
	for _, l := range g.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, usageErr(compute.ErrInvalidArgument, "--label %q: want KEY=VALUE", l)
		}
		labels[k] = v
	}
	cfg := kubernetes.Config{
		Namespace: g.kube.namespace, Image: g.image, Labels: labels,
		Connect: kubernetes.Connect(g.kube.connect), RuntimeClassName: g.kube.runtimeClass,
	}
	for _, cidr := range g.kube.harnessCIDRs {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			return nil, usageErr(compute.ErrInvalidArgument, "--kube-harness-cidr %q: %v", cidr, err)
		}
		cfg.HarnessPeers = append(cfg.HarnessPeers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}})
	}
	return kubernetes.NewFromKubeconfig(cfg, g.kube.kubeconfig, log)
}
