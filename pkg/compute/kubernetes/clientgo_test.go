package kubernetes

import (
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"
)

// clientGo adapts a client-go clientset (the fake one in the unit tests) to
// Clientset: its typed clients have the methods the provider uses. It is
// test code because client-go's typed clients link every API group (see
// client.go).
func clientGo(cs kubernetes.Interface) Clientset { return clientGoSet{cs} }

type clientGoSet struct{ cs kubernetes.Interface }

func (c clientGoSet) CoreV1() CoreV1Client { return clientGoCore{c.cs.CoreV1()} }

func (c clientGoSet) NetworkingV1() NetworkingV1Client {
	return clientGoNetworking{c.cs.NetworkingV1()}
}

type clientGoCore struct{ c corev1client.CoreV1Interface }

func (k clientGoCore) Pods(ns string) PodClient       { return k.c.Pods(ns) }
func (k clientGoCore) Secrets(ns string) SecretClient { return k.c.Secrets(ns) }
func (k clientGoCore) RESTClient() rest.Interface     { return k.c.RESTClient() }

func (k clientGoCore) PersistentVolumeClaims(ns string) PersistentVolumeClaimClient {
	return k.c.PersistentVolumeClaims(ns)
}

type clientGoNetworking struct {
	c networkingv1client.NetworkingV1Interface
}

func (k clientGoNetworking) NetworkPolicies(ns string) NetworkPolicyClient {
	return k.c.NetworkPolicies(ns)
}
func (k clientGoNetworking) RESTClient() rest.Interface { return k.c.RESTClient() }
