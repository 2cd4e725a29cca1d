package kubernetes

// The sandbox's NetworkPolicy enforced, not only created: a cluster of its
// own whose node runs a real NetworkPolicy enforcer (kube-network-policies,
// see internal/testing/testservers/kube/netpol.go), and TCP connects between real
// Pods (busybox nc in the sandbox image).

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// targetPort is where the target Pod (the pause program's tiny HTTP
// server) listens.
const targetPort = 8080

// TestNetworkPolicyEnforced: with an enforcer on the node, the sandbox's
// policy admits connections to the daemon's port only from
// Config.HarnessPeers, and lets the sandbox connect nowhere unless
// Config.Egress allows it. Each denial is checked against a control that
// succeeds over the same path, so a connect that fails for another reason
// (the machine's own firewall, a Pod not listening) cannot pass as a
// denial.
func TestNetworkPolicyEnforced(t *testing.T) {
	testenv.Require(t, testenv.Docker)
	c := kubeserver.Start(t, kubeserver.Options{NetworkPolicy: true})
	if err := loadImage(c); err != nil {
		t.Fatalf("the sandbox image: %v", err)
	}
	e := newEnforcedEnv(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Three Pods outside any sandbox: a server, the "harness" that the
	// policy will admit, and a stranger it will not.
	target := e.runPod(ctx, t, "target", kubeserver.PauseImage, []string{"/pause", "serve", fmt.Sprintf(":%d", targetPort)})
	harness := e.runPod(ctx, t, "harness", testImage, []string{"sleep", "3600"})
	stranger := e.runPod(ctx, t, "stranger", testImage, []string{"sleep", "3600"})

	// Control: Pods reach each other where no policy applies.
	e.mustConnect(ctx, t, stranger, target.Status.PodIP, targetPort)

	cfg := e.config(ConnectPortForward)
	cfg.HarnessPeers = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: harness.Status.PodIP + "/32"}}}
	client := e.client(t, e.provider(t, cfg), nil)
	s, err := client.Create(ctx, compute.CreateOptions{SessionID: "np-default"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background()) //nolint:errcheck // best effort; the cluster goes with the test
	sandboxIP := e.sandboxIP(ctx, t, "np-default")
	e.waitEnforced(ctx, t, sandboxIP)

	// Ingress: the harness peer reaches the daemon's port, a stranger does
	// not, and the stranger still reaches the target (the denial is the
	// sandbox's policy, not the network).
	e.mustConnect(ctx, t, harness, sandboxIP, DefaultPort)
	e.mustNotConnect(ctx, t, stranger, sandboxIP, DefaultPort)
	e.mustConnect(ctx, t, stranger, target.Status.PodIP, targetPort)

	// Egress, default config (none): the sandbox cannot reach the target.
	if out, ok := sandboxConnect(ctx, t, s, target.Status.PodIP, targetPort); ok {
		t.Errorf("with no egress configured, the sandbox connected to %s:%d: %s", target.Status.PodIP, targetPort, out)
	} else if !strings.Contains(out, "timed out") {
		t.Errorf("the sandbox's connect to the target failed, but not by being dropped: %s", out)
	}

	// Egress allowed by Config.Egress: another sandbox of a provider that
	// allows the target's address and port reaches it.
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(targetPort)
	cfg2 := cfg
	cfg2.Egress = []networkingv1.NetworkPolicyEgressRule{{
		To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: target.Status.PodIP + "/32"}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
	}}
	client2 := e.client(t, e.provider(t, cfg2), nil)
	s2, err := client2.Create(ctx, compute.CreateOptions{SessionID: "np-egress"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(context.Background()) //nolint:errcheck // best effort
	sandbox2IP := e.sandboxIP(ctx, t, "np-egress")
	e.waitEnforced(ctx, t, sandbox2IP)
	if out, ok := sandboxConnect(ctx, t, s2, target.Status.PodIP, targetPort); !ok {
		t.Errorf("with egress to %s:%d allowed, the sandbox could not connect: %s", target.Status.PodIP, targetPort, out)
	}
	// Only what the rule names: another port of the target is dropped
	// (not refused, as it would be if the connect got through).
	if out, ok := sandboxConnect(ctx, t, s2, target.Status.PodIP, targetPort+1); ok || !strings.Contains(out, "timed out") {
		t.Errorf("egress allowed only to port %d, yet the sandbox's connect to port %d was not dropped: %s", targetPort, targetPort+1, out)
	}
	// Its ingress is the same policy as the first sandbox's.
	e.mustConnect(ctx, t, harness, sandbox2IP, DefaultPort)
	e.mustNotConnect(ctx, t, stranger, sandbox2IP, DefaultPort)
}

// enforcedEnv is a namespace on a cluster of the test's own (the shared
// cluster runs no enforcer).
type enforcedEnv struct {
	*kubeEnv
	rest *rest.Config
}

// newEnforcedEnv makes what newKubeEnv makes, on cluster c: a namespace and
// a ServiceAccount "harness" bound to the provider's required rules.
func newEnforcedEnv(t *testing.T, c *kubeserver.Cluster) *enforcedEnv {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", c.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rules := Config{Connect: ConnectPortForward}.RequiredRules()
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "bulkhead-harness"}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc := c.ServiceAccountKubeconfig(t, ns, "harness")
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bulkhead-harness"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "bulkhead-harness"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "harness", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &enforcedEnv{kubeEnv: &kubeEnv{c: c, ns: ns, admin: admin, kubeconfig: kc}, rest: rc}
}

// runPod runs a Pod of image with command and waits until it runs.
func (e *enforcedEnv) runPod(ctx context.Context, t *testing.T, name, image string, command []string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "main", Image: image, ImagePullPolicy: corev1.PullNever, Command: command}},
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  new(bool),
		},
	}
	if _, err := e.admin.CoreV1().Pods(e.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s ended: %+v", name, p.Status)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s not running: %+v", name, p.Status)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sandboxIP is the Pod IP of session id's sandbox.
func (e *enforcedEnv) sandboxIP(ctx context.Context, t *testing.T, id string) string {
	t.Helper()
	l, err := e.admin.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSession + "=" + sessionLabel(id)})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].Status.PodIP == "" {
		t.Fatalf("session %s: %d pods, want one with an IP", id, len(l.Items))
	}
	return l.Items[0].Status.PodIP
}

// waitEnforced waits until the enforcer checks the connections of the Pod
// at ip (it learns of Pods and policies through watches).
func (e *enforcedEnv) waitEnforced(ctx context.Context, t *testing.T, ip string) {
	t.Helper()
	for {
		ok, err := e.c.NetworkPolicyCovers(ctx, ip)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the enforcer never covered %s", ip)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// connectCommand tries a TCP connect with busybox nc (3 s timeout); it
// exits 0 when connected.
func connectCommand(ip string, port int) string {
	return fmt.Sprintf("nc -w 3 %s %d -e true", ip, port)
}

// podConnect runs the connect in pod (an exec through the API server) and
// reports whether it connected, with nc's output.
func (e *enforcedEnv) podConnect(ctx context.Context, t *testing.T, pod *corev1.Pod, ip string, port int) (string, bool) {
	t.Helper()
	req := e.admin.CoreV1().RESTClient().Post().Resource("pods").Namespace(e.ns).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"sh", "-c", connectCommand(ip, port) + " 2>&1; echo exit=$?"}, Stdout: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(e.rest, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out}); err != nil {
		t.Fatalf("exec in %s: %v: %s", pod.Name, err, out.String())
	}
	s := strings.TrimSpace(out.String())
	return s, strings.HasSuffix(s, "exit=0")
}

func (e *enforcedEnv) mustConnect(ctx context.Context, t *testing.T, from *corev1.Pod, ip string, port int) {
	t.Helper()
	if out, ok := e.podConnect(ctx, t, from, ip, port); !ok {
		t.Errorf("%s (%s) could not connect to %s:%d: %s", from.Name, from.Status.PodIP, ip, port, out)
	}
}

// mustNotConnect wants the connect dropped (timed out), not refused.
func (e *enforcedEnv) mustNotConnect(ctx context.Context, t *testing.T, from *corev1.Pod, ip string, port int) {
	t.Helper()
	out, ok := e.podConnect(ctx, t, from, ip, port)
	if ok {
		t.Errorf("%s (%s) connected to %s:%d, which its policy denies", from.Name, from.Status.PodIP, ip, port)
	} else if !strings.Contains(out, "timed out") {
		t.Errorf("%s's connect to %s:%d failed, but not by being dropped: %s", from.Name, ip, port, out)
	}
}

// sandboxConnect runs the connect inside the sandbox, through its daemon.
func sandboxConnect(ctx context.Context, t *testing.T, s *compute.Session, ip string, port int) (string, bool) {
	t.Helper()
	res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: connectCommand(ip, port), User: "root"}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	return out, res.Exit.ExitCode == 0
}
