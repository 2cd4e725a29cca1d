package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// The provider talks to the API server through client-go's REST client
// and generic typed client (gentype), over a scheme of its own holding the
// core and networking API groups alone. client-go's generated typed
// clients (k8s.io/client-go/kubernetes/typed/...) all share
// k8s.io/client-go/kubernetes/scheme, which registers every built-in API
// group (56 of them) at init: a program importing even one typed client
// links the code of all their types, about 12 MB of a static binary.

// Clientset is the part of the Kubernetes API the provider uses: Pods,
// Secrets, PersistentVolumeClaims and NetworkPolicies of a namespace, and
// the core group's REST client (exec and port-forward). New builds it on
// client-go's REST client; client-go's own clientsets (the fake one in
// tests) fit it through a small adapter, as their typed clients have these
// methods.
type Clientset interface {
	CoreV1() CoreV1Client
	NetworkingV1() NetworkingV1Client
}

// CoreV1Client is the part of the core/v1 API the provider uses.
type CoreV1Client interface {
	Pods(namespace string) PodClient
	Secrets(namespace string) SecretClient
	PersistentVolumeClaims(namespace string) PersistentVolumeClaimClient
	// RESTClient is the core/v1 REST client (exec, port-forward).
	RESTClient() rest.Interface
}

// NetworkingV1Client is the part of the networking.k8s.io/v1 API the
// provider uses.
type NetworkingV1Client interface {
	NetworkPolicies(namespace string) NetworkPolicyClient
	RESTClient() rest.Interface
}

// objectClient is what the provider does with one kind of object: the
// methods of client-go's typed clients, with their signatures.
type objectClient[T, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// The clients of the kinds the provider uses.
type (
	PodClient                   = objectClient[*corev1.Pod, *corev1.PodList]
	SecretClient                = objectClient[*corev1.Secret, *corev1.SecretList]
	PersistentVolumeClaimClient = objectClient[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList]
	NetworkPolicyClient         = objectClient[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]
)

// apiScheme knows the types of the core and networking groups and the
// meta/v1 options, as client-go's scheme does for every group.
func apiScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			// The registrations are fixed code: an error is a bug.
			panic(fmt.Sprintf("kubernetes: API scheme: %v", err))
		}
	}
	return s
}

// apiCodecs are the scheme and its serializers, made once per clientset
// (a provider keeps no package-level state).
type apiCodecs struct {
	scheme *runtime.Scheme
	codecs serializer.CodecFactory
	params runtime.ParameterCodec
}

func newAPICodecs() apiCodecs {
	s := apiScheme()
	return apiCodecs{scheme: s, codecs: serializer.NewCodecFactory(s), params: runtime.NewParameterCodec(s)}
}

// restClients is the Clientset New builds: the core and networking REST
// clients over one HTTP client (one connection pool) and one client-side
// rate limiter.
type restClients struct {
	core, networking rest.Interface
	params           runtime.ParameterCodec
}

var _ Clientset = (*restClients)(nil)

// newClientset builds the core and networking clients for restCfg, sharing
// one HTTP client and, as kubernetes.NewForConfig does, one client-side
// rate limiter: restCfg's QPS and Burst bound the provider's requests as a
// whole, not each API group's.
func newClientset(restCfg *rest.Config) (*restClients, error) {
	rc := *restCfg
	if rc.RateLimiter == nil && rc.QPS > 0 {
		if rc.Burst <= 0 {
			return nil, fmt.Errorf("%w: burst must be positive when QPS is set", compute.ErrInvalidArgument)
		}
		rc.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(rc.QPS, rc.Burst)
	}
	hc, err := rest.HTTPClientFor(&rc)
	if err != nil {
		return nil, fmt.Errorf("http client: %w", err)
	}
	ac := newAPICodecs()
	group := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rc
		c.GroupVersion, c.APIPath = &gv, apiPath
		c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(ac.scheme, ac.codecs).WithoutConversion()
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		return rest.RESTClientForConfigAndClient(&c, hc)
	}
	core, err := group(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, fmt.Errorf("core/v1 client: %w", err)
	}
	networking, err := group(networkingv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, fmt.Errorf("networking/v1 client: %w", err)
	}
	return &restClients{core: core, networking: networking, params: ac.params}, nil
}

func (c *restClients) CoreV1() CoreV1Client             { return coreClient{c} }
func (c *restClients) NetworkingV1() NetworkingV1Client { return networkingClient{c} }

type coreClient struct{ c *restClients }

func (k coreClient) RESTClient() rest.Interface { return k.c.core }

func (k coreClient) Pods(ns string) PodClient {
	return gentype.NewClientWithList[*corev1.Pod, *corev1.PodList]("pods", k.c.core, k.c.params, ns,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} },
		gentype.PrefersProtobuf[*corev1.Pod]())
}

func (k coreClient) Secrets(ns string) SecretClient {
	return gentype.NewClientWithList[*corev1.Secret, *corev1.SecretList]("secrets", k.c.core, k.c.params, ns,
		func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} },
		gentype.PrefersProtobuf[*corev1.Secret]())
}

func (k coreClient) PersistentVolumeClaims(ns string) PersistentVolumeClaimClient {
	return gentype.NewClientWithList[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList]("persistentvolumeclaims", k.c.core, k.c.params, ns,
		func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} },
		func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} },
		gentype.PrefersProtobuf[*corev1.PersistentVolumeClaim]())
}

type networkingClient struct{ c *restClients }

func (k networkingClient) RESTClient() rest.Interface { return k.c.networking }

func (k networkingClient) NetworkPolicies(ns string) NetworkPolicyClient {
	return gentype.NewClientWithList[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]("networkpolicies", k.c.networking, k.c.params, ns,
		func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} },
		func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} },
		gentype.PrefersProtobuf[*networkingv1.NetworkPolicy]())
}
