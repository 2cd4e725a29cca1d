package kubernetes

// The token Secret comes before its Pod (issue #32: created after it, the
// kubelet retried the missing Secret's volume at 0.5, 1, 2 s), without an
// owner until the Pod exists; a failed Pod create deletes it, and Reap
// adopts or deletes one a crash left unowned.

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

var (
	secretsGVR  = corev1.SchemeGroupVersion.WithResource("secrets")
	policiesGVR = networkingv1.SchemeGroupVersion.WithResource("networkpolicies")
	podsGVR     = corev1.SchemeGroupVersion.WithResource("pods")
)

// checkSecretBeforePod makes every Pod create check that the Pod's token
// Secret and NetworkPolicy exist already, the Secret without an owner
// yet, and answers with created (nil: the tracker's create).
func checkSecretBeforePod(t *testing.T, cs *fake.Clientset, created func(pod *corev1.Pod, sec *corev1.Secret) (*corev1.Pod, error)) {
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		key := pod.Labels[LabelKey]
		obj, err := cs.Tracker().Get(secretsGVR, "ns", secretName(key))
		if err != nil {
			t.Errorf("pod %s created before its Secret (%v)", pod.Name, err)
			return false, nil, nil
		}
		sec := obj.(*corev1.Secret)
		if len(sec.OwnerReferences) != 0 {
			t.Errorf("the Secret has an owner before its Pod exists: %v", sec.OwnerReferences)
		}
		if sec.Labels[LabelSandbox] != "1" || sec.Labels[LabelKey] != key || sec.Labels["owner"] != "me" {
			t.Errorf("the Secret's labels %v do not let Reap find it", sec.Labels)
		}
		if _, err := cs.Tracker().Get(policiesGVR, "ns", policyName(key)); err != nil {
			t.Errorf("pod %s created before its NetworkPolicy (%v)", pod.Name, err)
		}
		if created == nil {
			return false, nil, nil
		}
		got, err := created(pod, sec)
		return true, got, err
	})
}

// checkOwnedBy checks that the Secret and the NetworkPolicy of key are
// owned by the Pod whose UID is uid.
func checkOwnedBy(ctx context.Context, t *testing.T, cs *fake.Clientset, key string, uid types.UID) {
	t.Helper()
	sec, err := cs.CoreV1().Secrets("ns").Get(ctx, secretName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np, err := cs.NetworkingV1().NetworkPolicies("ns").Get(ctx, policyName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, refs := range map[string][]metav1.OwnerReference{"secret": sec.OwnerReferences, "network policy": np.OwnerReferences} {
		if len(refs) != 1 || refs[0].UID != uid || refs[0].Kind != "Pod" || refs[0].Name != podName(key) {
			t.Errorf("the %s's owners: %+v (want the pod %s)", what, refs, uid)
		}
	}
}

// TestLaunchCreatesTheSecretBeforeThePod: a cold launch creates the
// NetworkPolicy, then the token Secret (unowned, labelled), then the Pod,
// and then makes the Pod the owner of both; the daemon takes the token
// the Secret holds.
func TestLaunchCreatesTheSecretBeforeThePod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, port := relayedDaemon(t)
	p, cs := fakeProvider(t, Config{Connect: ConnectPodIP, Port: port, Labels: map[string]string{"owner": "me"},
		HarnessPeers: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "127.0.0.1/32"}}}})
	var uid types.UID
	checkSecretBeforePod(t, cs, func(pod *corev1.Pod, sec *corev1.Secret) (*corev1.Pod, error) {
		// The Pod's daemon starts with the Secret's token.
		if err := d.Client.RotateToken(ctx, string(sec.Data[tokenKey])); err != nil {
			return nil, err
		}
		uid = types.UID("uid-" + pod.Labels[LabelKey])
		pod.UID = uid
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
		return pod, cs.Tracker().Create(podsGVR, pod, "ns")
	})
	sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if uid == "" {
		t.Fatal("no pod was created")
	}
	st := sb.(*sandbox).state
	checkOwnedBy(ctx, t, cs, st.Key, uid)
	if sec, _ := cs.CoreV1().Secrets("ns").Get(ctx, secretName(st.Key), metav1.GetOptions{}); sec.Immutable == nil || !*sec.Immutable {
		t.Error("a cold sandbox's Secret is mutable")
	}
	var order []string
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" || a.GetVerb() == "patch" {
			order = append(order, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	if len(order) != 5 || order[0] != "create networkpolicies" || order[1] != "create secrets" || order[2] != "create pods" {
		t.Errorf("API writes %q; want the policy, the Secret, the Pod, then the two owner patches", order)
	}
}

// TestPoolPodSecretComesFirst: a warm pool Pod's Secret (mutable) is
// created before the Pod too, and owned by it once it exists.
func TestPoolPodSecretComesFirst(t *testing.T) {
	ctx := context.Background()
	p, cs := fakeProvider(t, Config{Labels: map[string]string{"owner": "me"}, Pools: []Pool{{Name: "warm", Size: 1}}})
	var uid types.UID
	checkSecretBeforePod(t, cs, func(pod *corev1.Pod, _ *corev1.Secret) (*corev1.Pod, error) {
		uid = types.UID("uid-" + pod.Labels[LabelKey])
		pod.UID = uid
		return pod, cs.Tracker().Create(podsGVR, pod, "ns")
	})
	if n, err := p.FillPool(ctx, "warm"); err != nil || n != 1 {
		t.Fatalf("FillPool = %d, %v", n, err)
	}
	pods, _ := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods", len(pods.Items))
	}
	key := pods.Items[0].Labels[LabelKey]
	checkOwnedBy(ctx, t, cs, key, uid)
	if sec, _ := cs.CoreV1().Secrets("ns").Get(ctx, secretName(key), metav1.GetOptions{}); sec.Immutable == nil || *sec.Immutable {
		t.Error("a warm pool Pod's Secret is immutable: a claim cannot rotate its token")
	}
}

// TestFailedPodCreateDeletesTheSecret: when the Pod's create fails (after
// the Secret's), the launch (and a pool's refill) deletes the Secret and
// the NetworkPolicy it made, and says why.
func TestFailedPodCreateDeletesTheSecret(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		run  func(p *Provider) error
	}{
		{"launch", func(p *Provider) error { _, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "s1"}); return err }},
		{"pool", func(p *Provider) error { _, err := p.FillPool(ctx, "warm"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, cs := fakeProvider(t, Config{Labels: map[string]string{"owner": "me"}, Pools: []Pool{{Name: "warm", Size: 1}}})
			checkSecretBeforePod(t, cs, func(*corev1.Pod, *corev1.Secret) (*corev1.Pod, error) {
				return nil, apierrors.NewServiceUnavailable("etcd is restarting")
			})
			err := tc.run(p)
			if !errors.Is(err, compute.ErrUnavailable) {
				t.Fatalf("err = %v (want ErrUnavailable)", err)
			}
			if podCreates(cs) != 1 {
				t.Fatalf("%d pod creates", podCreates(cs))
			}
			pods, _ := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
			nps, _ := cs.NetworkingV1().NetworkPolicies("ns").List(ctx, metav1.ListOptions{})
			secs, _ := cs.CoreV1().Secrets("ns").List(ctx, metav1.ListOptions{})
			if len(pods.Items)+len(nps.Items)+len(secs.Items) != 0 {
				t.Errorf("left %d pods, %d policies, %d secrets", len(pods.Items), len(nps.Items), len(secs.Items))
			}
		})
	}
}

// TestReapOrphanSecrets: Reap deletes a token Secret (and a policy) that
// a crashed launch left unowned without its Pod, once older than
// orphanAge; gives one whose Pod exists (a crash between the Pod's create
// and the owner patches) to that Pod; and leaves young ones (a launch in
// progress), owned ones, other owners' and objects not named for their key.
func TestReapOrphanSecrets(t *testing.T) {
	now := time.Now()
	old, young := now.Add(-orphanAge-time.Minute), now.Add(-orphanAge/2)
	meta := func(name, key, owner string, created time.Time) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: "ns", CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{LabelSandbox: "1", LabelKey: key, "owner": owner}}
	}
	secret := func(key, owner string, created time.Time) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: meta(secretName(key), key, owner, created), Data: map[string][]byte{tokenKey: []byte("t")}}
	}
	policy := func(key, owner string, created time.Time) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: meta(policyName(key), key, owner, created)}
	}
	const (
		gone     = "aaaaaaaaaaaaaaaa" // the crash came before the Pod's create
		running  = "bbbbbbbbbbbbbbbb" // ... between the Pod's create and the owner patches
		starting = "cccccccccccccccc" // a launch in progress
		others   = "dddddddddddddddd" // another owner's
		owned    = "eeeeeeeeeeeeeeee" // owned by a Pod (garbage collection's)
		misnamed = "ffffffffffffffff"
	)
	pod := sandboxPod(running, "s1", nil, map[string]string{"owner": "me"})
	ownedSecret := secret(owned, "me", old)
	ownedSecret.OwnerReferences = ownedBy(sandboxPod(owned, "s2", nil, nil))
	odd := secret(misnamed, "me", old)
	odd.Name = "user-secret"
	p, cs := fakeProvider(t, Config{Labels: map[string]string{"owner": "me"}},
		pod,
		secret(gone, "me", old), policy(gone, "me", old),
		secret(running, "me", old), policy(running, "me", old),
		secret(starting, "me", young), policy(starting, "me", young),
		secret(others, "you", old), policy(others, "you", old),
		ownedSecret, odd,
	)
	ctx := context.Background()
	if _, err := compute.NewClient(p, compute.ClientOptions{Now: func() time.Time { return now }}).Reap(ctx); err != nil {
		t.Fatal(err)
	}
	secretKept := func(name string) bool {
		_, err := cs.CoreV1().Secrets("ns").Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	policyKept := func(key string) bool {
		_, err := cs.NetworkingV1().NetworkPolicies("ns").Get(ctx, policyName(key), metav1.GetOptions{})
		return err == nil
	}
	for name, want := range map[string]bool{
		secretName(gone): false, secretName(running): true, secretName(starting): true,
		secretName(others): true, secretName(owned): true, "user-secret": true,
	} {
		if got := secretKept(name); got != want {
			t.Errorf("secret %s kept = %v, want %v", name, got, want)
		}
	}
	for key, want := range map[string]bool{gone: false, running: true, starting: true, others: true} {
		if got := policyKept(key); got != want {
			t.Errorf("policy of %s kept = %v, want %v", key, got, want)
		}
	}
	checkOwnedBy(ctx, t, cs, running, pod.UID)
	if sec, _ := cs.CoreV1().Secrets("ns").Get(ctx, secretName(starting), metav1.GetOptions{}); len(sec.OwnerReferences) != 0 {
		t.Errorf("a young Secret was adopted: %v", sec.OwnerReferences)
	}

	// A Role from before the Secret came first (no `list secrets`): the
	// policies are still reaped, and the error names the verb.
	p2, cs2 := fakeProvider(t, Config{Labels: map[string]string{"owner": "me"}}, secret(gone, "me", old), policy(gone, "me", old))
	cs2.PrependReactor("list", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), "", errors.New("RBAC: list secrets"))
	})
	err := p2.ReapOrphans(ctx, now)
	if !errors.Is(err, compute.ErrPermissionDenied) {
		t.Errorf("reap without list secrets: %v", err)
	}
	if _, err := cs2.NetworkingV1().NetworkPolicies("ns").Get(ctx, policyName(gone), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the orphan policy without list secrets: %v", err)
	}
}
