package kubernetes

// Unit tests over client-go's fake clientset: the objects the provider
// makes, its error mapping, cleanup after failed launches, List and Reap.
// What needs Pods that really run is in cluster_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Any full clientset (client-go's and its fake) can be handed to
// NewWithClient through an adapter: its typed clients have the methods
// the provider uses.
var _ Clientset = clientGo(kubernetes.Interface(nil))

func fakeProvider(t *testing.T, cfg Config, objs ...runtime.Object) (*Provider, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset(objs...)
	if cfg.Namespace == "" {
		cfg.Namespace = "ns"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 5 * time.Second
	}
	p, err := NewWithClient(cfg, clientGo(cs), nil, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return p, cs
}

func TestPodSpecKeepsTheTokenOutOfTheDaemonsContainer(t *testing.T) {
	p, _ := fakeProvider(t, Config{RuntimeClassName: "gvisor", Labels: map[string]string{"owner": "team-a"}})
	set, err := p.cfg.settings(nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := p.podFor(podParams{key: "0123456789abcdef", set: set, root: "/workspace", runAs: "sandbox", labels: map[string]string{LabelKey: "0123456789abcdef"}})
	spec := pod.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the Pod mounts a service-account token")
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("service links put environment variables into the Pod")
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restart policy %s", spec.RestartPolicy)
	}
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "gvisor" {
		t.Errorf("runtime class %v", spec.RuntimeClassName)
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 1 {
		t.Fatalf("containers %d, init containers %d", len(spec.Containers), len(spec.InitContainers))
	}
	c := spec.Containers[0]
	for _, ctr := range append([]corev1.Container{c}, spec.InitContainers...) {
		if len(ctr.Env) > 0 || len(ctr.EnvFrom) > 0 {
			t.Errorf("container %s has environment variables: %v %v", ctr.Name, ctr.Env, ctr.EnvFrom)
		}
		if ctr.SecurityContext == nil || ctr.SecurityContext.AllowPrivilegeEscalation == nil || *ctr.SecurityContext.AllowPrivilegeEscalation {
			t.Errorf("container %s may escalate privileges", ctr.Name)
		}
		if caps := ctr.SecurityContext.Capabilities; caps == nil || len(caps.Drop) != 1 || caps.Drop[0] != "ALL" {
			t.Errorf("container %s does not drop all capabilities", ctr.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		if m.Name == secretVolume {
			t.Error("the daemon's container mounts the token Secret")
		}
	}
	if got := c.SecurityContext.Capabilities.Add; len(got) != len(DefaultCapabilities) {
		t.Errorf("capabilities added %v, want %v", got, DefaultCapabilities)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--token-file /run/bulkhead/token", "--workspace /workspace", "--default-user sandbox", "--listen tcp://0.0.0.0:7070"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	var secretOK, runMem bool
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secretName("0123456789abcdef") && *v.Secret.DefaultMode == 0o400 {
			secretOK = true
		}
		if v.Name == runVolume && v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
			runMem = true
		}
	}
	if !secretOK || !runMem {
		t.Errorf("volumes: secret %v, memory run dir %v", secretOK, runMem)
	}

	// A non-root daemon: runAsNonRoot, no capabilities, no default account.
	uid := int64(1000)
	p2, _ := fakeProvider(t, Config{RunAsUser: &uid})
	pod = p2.podFor(podParams{key: "0123456789abcdef", set: set, root: "/workspace"})
	sc := pod.Spec.Containers[0].SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || *sc.RunAsUser != 1000 || len(sc.Capabilities.Add) != 0 {
		t.Errorf("non-root security context %+v", sc)
	}
	if p2.DefaultRunAs() != nil {
		t.Error("a non-root daemon offers a default account it cannot create")
	}
	_, err = p2.Launch(context.Background(), compute.LaunchSpec{SessionID: "s", Manifest: &manifest.Manifest{RunAs: "analyst", Users: []manifest.User{{Name: "analyst"}}}})
	if !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Errorf("a manifest with accounts on a non-root daemon: %v", err)
	}
}

func TestNetworkPolicyDeniesAllButTheHarness(t *testing.T) {
	p, _ := fakeProvider(t, Config{})
	np := p.policyFor("0123456789abcdef", nil)
	if len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0 || len(np.Spec.PolicyTypes) != 2 {
		t.Fatalf("default policy: %+v", np.Spec)
	}
	if np.Spec.PodSelector.MatchLabels[LabelKey] != "0123456789abcdef" {
		t.Errorf("selector %v", np.Spec.PodSelector)
	}
	harness := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "harness"}}}
	egress := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}}}}
	p, _ = fakeProvider(t, Config{HarnessPeers: []networkingv1.NetworkPolicyPeer{harness}, Egress: []networkingv1.NetworkPolicyEgressRule{egress}})
	np = p.policyFor("0123456789abcdef", nil)
	if len(np.Spec.Ingress) != 1 || np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app"] != "harness" ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != DefaultPort {
		t.Errorf("ingress %+v", np.Spec.Ingress)
	}
	if len(np.Spec.Egress) != 1 || np.Spec.Egress[0].To[0].IPBlock.CIDR != "10.0.0.0/8" {
		t.Errorf("egress %+v", np.Spec.Egress)
	}
}

// TestForbiddenNamesVerbAndResource: a Role without a verb gives an error
// that says which verb on which resource is missing.
func TestForbiddenNamesVerbAndResource(t *testing.T) {
	p, cs := fakeProvider(t, Config{})
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "system:serviceaccount:ns:h" cannot create resource "pods"`))
	})
	_, err := p.Launch(context.Background(), compute.LaunchSpec{SessionID: "s1"})
	if !errors.Is(err, compute.ErrPermissionDenied) || !strings.Contains(err.Error(), `"create" "pods"`) {
		t.Fatalf("err = %v", err)
	}
	// Nothing is left: the NetworkPolicy made first is removed.
	if nps, _ := cs.NetworkingV1().NetworkPolicies("ns").List(context.Background(), metav1.ListOptions{}); len(nps.Items) != 0 {
		t.Errorf("left %d network policies", len(nps.Items))
	}
}

// TestFailedLaunchLeavesNothing: a launch that fails after creating the
// Pod (here the Secret's create) removes the Pod and the policy.
func TestFailedLaunchLeavesNothing(t *testing.T) {
	p, cs := fakeProvider(t, Config{})
	cs.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is restarting")
	})
	_, err := p.Launch(context.Background(), compute.LaunchSpec{SessionID: "s1"})
	if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
		t.Fatalf("err = %v (want a retryable ErrUnavailable)", err)
	}
	ctx := context.Background()
	pods, _ := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	nps, _ := cs.NetworkingV1().NetworkPolicies("ns").List(ctx, metav1.ListOptions{})
	secs, _ := cs.CoreV1().Secrets("ns").List(ctx, metav1.ListOptions{})
	if len(pods.Items)+len(nps.Items)+len(secs.Items) != 0 {
		t.Errorf("left %d pods, %d policies, %d secrets", len(pods.Items), len(nps.Items), len(secs.Items))
	}
}

// TestPodFailingAtStartIsARetryableError: a Pod whose container cannot
// start ends the launch with a clear, retryable error, and is removed.
func TestPodFailingAtStartIsARetryableError(t *testing.T) {
	p, cs := fakeProvider(t, Config{})
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		pod.Status.Phase = corev1.PodFailed
		pod.Status.Reason = "Evicted"
		pod.Status.Message = "The node was low on resource: memory."
		return true, pod, cs.Tracker().Create(corev1.SchemeGroupVersion.WithResource("pods"), pod, "ns")
	})
	_, err := p.Launch(context.Background(), compute.LaunchSpec{SessionID: "s1"})
	if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) || !strings.Contains(err.Error(), "Evicted") {
		t.Fatalf("err = %v", err)
	}
}

func sandboxPod(key, session string, ann map[string]string, extra map[string]string) *corev1.Pod {
	l := map[string]string{LabelSandbox: "1", LabelKey: key, LabelSession: sessionLabel(session)}
	for k, v := range extra {
		l[k] = v
	}
	a := map[string]string{AnnotationSession: session, AnnotationWorkspace: "/workspace"}
	for k, v := range ann {
		a[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(key), Namespace: "ns", UID: types.UID("uid-" + key), Labels: l, Annotations: a},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: "img"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"},
	}
}

// orphanPolicy is a sandbox NetworkPolicy without its Pod (no owner).
func orphanPolicy(key, owner string, created time.Time) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{
		Name: policyName(key), Namespace: "ns", CreationTimestamp: metav1.NewTime(created),
		Labels: map[string]string{LabelSandbox: "1", LabelKey: key, "owner": owner},
	}}
}

func TestListReapAndDestroy(t *testing.T) {
	now := time.Now()
	old := now.Add(-2 * time.Hour).UTC().Format(time.RFC3339Nano)
	fresh := now.UTC().Format(time.RFC3339Nano)
	objs := []runtime.Object{
		sandboxPod("aaaaaaaaaaaaaaaa", "expired", map[string]string{AnnotationCreatedAt: old, AnnotationTTL: "1h"}, map[string]string{"owner": "me"}),
		sandboxPod("bbbbbbbbbbbbbbbb", "live", map[string]string{AnnotationCreatedAt: fresh, AnnotationTTL: "1h"}, map[string]string{"owner": "me"}),
		sandboxPod("cccccccccccccccc", "idle", map[string]string{AnnotationCreatedAt: old, AnnotationIdleTimeout: "10m", AnnotationLastActive: old}, map[string]string{"owner": "me"}),
		sandboxPod("dddddddddddddddd", "", nil, map[string]string{"owner": "me", LabelPool: "p", LabelClaimed: "false"}),
		sandboxPod("eeeeeeeeeeeeeeee", "someone-else", map[string]string{AnnotationCreatedAt: old, AnnotationTTL: "1h"}, map[string]string{"owner": "you"}),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName("aaaaaaaaaaaaaaaa"), Namespace: "ns"}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: policyName("aaaaaaaaaaaaaaaa"), Namespace: "ns"}},
		// Policies a crashed launch left without their Pod: the provider's
		// old one goes; a young one (a launch in progress) and another
		// owner's stay.
		orphanPolicy("ffffffffffffffff", "me", now.Add(-time.Hour)),
		orphanPolicy("1111111111111111", "me", now.Add(-time.Minute)),
		orphanPolicy("2222222222222222", "you", now.Add(-time.Hour)),
	}
	p, cs := fakeProvider(t, Config{Labels: map[string]string{"owner": "me"}}, objs...)
	ctx := context.Background()
	list, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sessions []string
	for _, i := range list {
		sessions = append(sessions, i.SessionID)
	}
	if strings.Join(sessions, ",") != "expired,live,idle" {
		t.Fatalf("listed %v (want the owner's sandboxes, no unclaimed pool pod)", sessions)
	}
	reaped, err := compute.NewClient(p, compute.ClientOptions{Now: func() time.Time { return now }}).Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(reaped) != 2 {
		t.Fatalf("reaped %d, want 2", len(reaped))
	}
	pods, _ := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 3 {
		t.Errorf("%d pods left, want 3", len(pods.Items))
	}
	if _, err := cs.CoreV1().Secrets("ns").Get(ctx, secretName("aaaaaaaaaaaaaaaa"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the reaped sandbox's secret: %v", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies("ns").Get(ctx, policyName("aaaaaaaaaaaaaaaa"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the reaped sandbox's policy: %v", err)
	}
	for key, want := range map[string]bool{"ffffffffffffffff": false, "1111111111111111": true, "2222222222222222": true} {
		_, err := cs.NetworkingV1().NetworkPolicies("ns").Get(ctx, policyName(key), metav1.GetOptions{})
		if got := err == nil; got != want {
			t.Errorf("orphan policy %s kept = %v (%v), want %v", key, got, err, want)
		}
	}
	// Destroy is idempotent.
	for range 2 {
		if err := p.Destroy(ctx, reaped[0].State); err != nil {
			t.Fatal(err)
		}
	}
	// Reattach to a destroyed sandbox: ErrNotFound, so a resume rebuilds.
	if _, err := p.Reattach(ctx, compute.LaunchSpec{}, reaped[0].State); !errors.Is(err, compute.ErrNotFound) {
		t.Errorf("reattach to a destroyed sandbox: %v", err)
	}
}

func TestReattachToADeadPodIsNotFound(t *testing.T) {
	pod := sandboxPod("aaaaaaaaaaaaaaaa", "s", nil, nil)
	pod.Status.Phase = corev1.PodFailed
	pod.Status.Reason = "Evicted"
	p, _ := fakeProvider(t, Config{}, pod)
	raw, _ := json.Marshal(stateOf(pod))
	_, err := p.Reattach(context.Background(), compute.LaunchSpec{}, raw)
	if !errors.Is(err, compute.ErrNotFound) || !strings.Contains(err.Error(), "Evicted") {
		t.Fatalf("err = %v", err)
	}
}

func TestVolumeDeletePolicy(t *testing.T) {
	for _, tc := range []struct {
		policy DeletePolicy
		kept   bool
	}{{DeleteAll, false}, {DeleteSandbox, true}} {
		pod := sandboxPod("aaaaaaaaaaaaaaaa", "s", map[string]string{AnnotationVolume: VolumeName("s")}, nil)
		// The marks Launch puts on a workspace claim (Destroy checks them).
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: VolumeName("s"), Namespace: "ns",
			Labels: map[string]string{LabelWorkspaceVolume: "1", LabelSession: sessionLabel("s")}}}
		p, cs := fakeProvider(t, Config{DeletePolicy: tc.policy}, pod, pvc)
		raw, _ := json.Marshal(stateOf(pod))
		if err := p.Destroy(context.Background(), raw); err != nil {
			t.Fatal(err)
		}
		_, err := cs.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), VolumeName("s"), metav1.GetOptions{})
		if kept := err == nil; kept != tc.kept {
			t.Errorf("policy %d: claim kept %v, want %v", tc.policy, kept, tc.kept)
		}
		if tc.kept {
			// Launching the session anew without its prior state refuses to
			// take over the kept claim.
			_, err := p.Launch(context.Background(), compute.LaunchSpec{SessionID: "s", Options: &CreateOptions{VolumeWorkspace: true}})
			if !errors.Is(err, compute.ErrAlreadyExists) {
				t.Errorf("launch over a kept claim: %v", err)
			}
		}
	}
}

func TestConfigChecks(t *testing.T) {
	for name, cfg := range map[string]Config{
		"reserved label":  {Labels: map[string]string{"bulkhead.dev/x": "1"}},
		"bad label value": {Labels: map[string]string{"owner": "a b"}},
		"token arg":       {AgentdArgs: []string{"--token-file=/x"}},
		"connect":         {Connect: "carrier-pigeon"},
		"pool template":   {Pools: []Pool{{Name: "p", Size: 1, Template: PoolTemplate{Options: CreateOptions{VolumeWorkspace: true}}}}},
		"root uid":        {RunAsUser: new(int64)},
		"pod-ip, no peer": {Connect: ConnectPodIP},
	} {
		if _, err := NewWithClient(cfg, clientGo(fake.NewClientset()), nil, nil); !errors.Is(err, compute.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestNewBuildsOneClientForBothGroups checks the clients New builds (not
// the fake clientset): core/v1 and networking/v1 requests reach the API
// server with the harness's user agent, and draw on one rate limiter so
// Config.QPS bounds the provider as a whole.
func TestNewBuildsOneClientForBothGroups(t *testing.T) {
	var (
		mu     sync.Mutex
		paths  []string
		agents = map[string]bool{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		agents[r.UserAgent()] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/namespaces/ns/pods":
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","items":[]}`))
		case "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies":
			_, _ = w.Write([]byte(`{"kind":"NetworkPolicyList","apiVersion":"networking.k8s.io/v1","items":[]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)

	p, err := New(Config{Namespace: "ns"}, &rest.Config{Host: srv.URL}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := p.API().CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("core/v1: %v", err)
	}
	if _, err := p.API().NetworkingV1().NetworkPolicies("ns").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("networking/v1: %v", err)
	}
	if _, err := p.API().CoreV1().Secrets("ns").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get of a missing Secret: %v, want NotFound", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 3 {
		t.Errorf("requests %q, want 3", paths)
	}
	if len(agents) != 1 || !agents["bulkhead-harness"] {
		t.Errorf("user agents %v, want only bulkhead-harness", agents)
	}
	core, nw := p.API().CoreV1().RESTClient().GetRateLimiter(), p.API().NetworkingV1().RESTClient().GetRateLimiter()
	if core == nil || core != nw {
		t.Errorf("rate limiters core/v1 %p, networking/v1 %p: want one shared limiter", core, nw)
	}
}

func TestNewRejectsAMissingRESTConfig(t *testing.T) {
	if _, err := New(Config{Namespace: "ns"}, nil, nil); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("New(nil rest config): %v, want ErrInvalidArgument", err)
	}
}

func TestStateRoundTrip(t *testing.T) {
	st := State{Version: StateVersion, Namespace: "ns", Pod: podName("0123456789abcdef"), Key: "0123456789abcdef", SessionID: "s"}
	raw, err := st.encode()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(raw)), "token") {
		t.Errorf("state mentions a token: %s", raw)
	}
	if got, err := DecodeState(raw); err != nil || got != st {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	bad := st
	bad.Pod = "someone-elses-pod"
	raw, _ = bad.encode()
	if _, err := DecodeState(raw); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("a state naming another pod: %v", err)
	}
	for _, id := range []string{"abc", "UPPER_case.id", strings.Repeat("x", 80), "a/b c"} {
		if l := sessionLabel(id); len(l) > 63 || l == "" {
			t.Errorf("session label of %q: %q", id, l)
		}
		if v := VolumeName(id); len(v) > 63 || strings.ToLower(v) != v {
			t.Errorf("volume name of %q: %q", id, v)
		}
	}
}

func resourceMust(s string) resource.Quantity { return resource.MustParse(s) }
