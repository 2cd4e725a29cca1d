package kubernetes

// The checks of a state a caller hands in (Reattach, Destroy, Launch's
// Prior) against what it names, beyond warm pool claims (pool_unit_test.go):
// cold Pods of another session, and workspace PVCs not made for the
// state's session. Over the fake clientset.

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// createdClaim is the workspace PVC Launch creates for session, read off
// a launch stopped at its Pod's create: the tests judge the marks Launch
// really sets.
func createdClaim(t *testing.T, session string) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := fake.NewClientset()
	stopLaunchAtPodCreate(cs)
	p, _ := observedProvider(t, Config{NetworkPolicy: new(bool)}, cs)
	_, err := p.Launch(ctx, compute.LaunchSpec{SessionID: session, Options: &CreateOptions{VolumeWorkspace: true}})
	if !errors.Is(err, compute.ErrUnavailable) {
		t.Fatalf("the launch was meant to stop at its pod's create: %v", err)
	}
	for _, a := range cs.Actions() {
		if ca, ok := a.(k8stesting.CreateAction); ok && a.GetResource().Resource == "persistentvolumeclaims" {
			return ca.GetObject().(*corev1.PersistentVolumeClaim).DeepCopy()
		}
	}
	t.Fatal("the launch created no workspace claim")
	return nil
}

// olderClaim is createdClaim as an earlier version of the provider made
// it: the same labels, no annotation.
func olderClaim(t *testing.T, session string) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := createdClaim(t, session)
	pvc.Annotations = nil
	return pvc
}

// volumePod is a cold sandbox Pod of session on the workspace PVC volume,
// with its Secret, and its state as the provider records it.
func volumePod(t *testing.T, key, session, volume string) (*corev1.Pod, *corev1.Secret, State) {
	t.Helper()
	pod := sandboxPod(key, session, map[string]string{AnnotationVolume: volume}, nil)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Namespace: "ns", ResourceVersion: "1"}}
	return pod, sec, stateOf(pod)
}

// encodeState is st encoded.
func encodeState(t *testing.T, st State) json.RawMessage {
	t.Helper()
	raw, err := st.encode()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// claimCase is a workspace PVC a state may name: the PVC (nil: gone), the
// state's session, and the refusal expected ("": the PVC is the state's).
type claimCase struct {
	name            string
	claim           func(t *testing.T) *corev1.PersistentVolumeClaim
	volume          string // the PVC the state names
	state           string // the state's session id
	caller          string // the launching session's ("": the state's)
	wantErrContains string
}

// claimCases are the PVCs a state of session s1 (or of a crafted id)
// names, foreign and its own.
func claimCases() []claimCase {
	collide := sessionLabel("a/b") // a session id equal to the label of "a/b"
	return []claimCase{
		{name: "another session's", volume: VolumeName("other"), state: "s1",
			claim:           func(t *testing.T) *corev1.PersistentVolumeClaim { return createdClaim(t, "other") },
			wantErrContains: `workspace claim ` + VolumeName("other") + ` was not made for session "s1" (it was made for another session; refusing to `},
		{name: "another session's, made by an earlier version", volume: VolumeName("other"), state: "s1",
			claim:           func(t *testing.T) *corev1.PersistentVolumeClaim { return olderClaim(t, "other") },
			wantErrContains: `was not made for session "s1" (it was made for another session`},
		{name: "another session's of the same label", volume: VolumeName("a/b"), state: collide,
			claim:           func(t *testing.T) *corev1.PersistentVolumeClaim { return createdClaim(t, "a/b") },
			wantErrContains: `was not made for session "` + collide + `"`},
		{name: "not a workspace claim", volume: "data", state: "s1",
			claim: func(*testing.T) *corev1.PersistentVolumeClaim {
				return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns", Labels: map[string]string{"app": "db"}}}
			},
			wantErrContains: `claim data is not a workspace claim of the provider (it has no ` + LabelWorkspaceVolume + `=1 label; refusing to `},
		{name: "a workspace claim of no session", volume: "ws", state: "s1",
			claim: func(*testing.T) *corev1.PersistentVolumeClaim {
				return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "ws", Namespace: "ns", Labels: map[string]string{LabelWorkspaceVolume: "1"}}}
			},
			wantErrContains: `workspace claim ws was not made for session "s1" (it records no session`},
		{name: "its own", volume: VolumeName("s1"), state: "s1",
			claim: func(t *testing.T) *corev1.PersistentVolumeClaim { return createdClaim(t, "s1") }},
		{name: "its own, made by an earlier version", volume: VolumeName("s1"), state: "s1",
			claim: func(t *testing.T) *corev1.PersistentVolumeClaim { return olderClaim(t, "s1") }},
		{name: "gone", volume: VolumeName("s1"), state: "s1"},
	}
}

// checkClaimRefused checks a refusal over a PVC: ErrInvalidArgument (not
// ErrNotFound) saying want and "refusing to "+op, after reads only, with
// the PVC and, when there is one, the Pod and its Secret as they were.
func checkClaimRefused(ctx context.Context, t *testing.T, cs *fake.Clientset, err error, want, op string, pvc *corev1.PersistentVolumeClaim, pod *corev1.Pod, sec *corev1.Secret) {
	t.Helper()
	if err == nil {
		t.Fatalf("a state naming workspace claim %s was accepted", pvc.Name)
	}
	if !errors.Is(err, compute.ErrInvalidArgument) || errors.Is(err, compute.ErrNotFound) ||
		!strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "refusing to "+op) {
		t.Fatalf("want invalid argument saying %q and refusing to %s, got %v", want, op, err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" {
			t.Errorf("a refusal did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	got, err := cs.CoreV1().PersistentVolumeClaims("ns").Get(ctx, pvc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the refused claim: %v", err)
	}
	if !maps.Equal(got.Labels, pvc.Labels) || !maps.Equal(got.Annotations, pvc.Annotations) {
		t.Errorf("the refused claim changed: %v %v", got.Labels, got.Annotations)
	}
	if pod == nil {
		return
	}
	if _, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the pod of the refused state: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("ns").Get(ctx, sec.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the Secret of the refused state: %v", err)
	}
}

// TestDestroyRefusesAWorkspaceClaimNotTheSessions: under DeleteAll,
// Destroy of a state naming a workspace PVC not made for the state's
// session (another session's, whether made by this version or an earlier
// one, or carrying the label of the state's session but another's exact
// id; or a PVC the provider did not make at all) is refused with
// ErrInvalidArgument after reads only, with the Pod or without it:
// nothing is deleted. The session's own PVC (as Launch makes it now, or
// as earlier versions did) and a gone one are destroyed as before.
func TestDestroyRefusesAWorkspaceClaimNotTheSessions(t *testing.T) {
	for _, tc := range claimCases() {
		for _, podGone := range []bool{false, true} {
			name := tc.name
			if podGone {
				name += ", pod gone"
			}
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				pod, sec, st := volumePod(t, "00112233aabbccdd", tc.state, tc.volume)
				objs := []runtime.Object{sec}
				if !podGone {
					objs = append(objs, pod)
				}
				var pvc *corev1.PersistentVolumeClaim
				if tc.claim != nil {
					pvc = tc.claim(t)
					objs = append(objs, pvc)
				}
				cs := fake.NewClientset(objs...)
				p, _ := observedProvider(t, Config{NetworkPolicy: new(bool), DeletePolicy: DeleteAll}, cs)

				cs.ClearActions()
				err := p.Destroy(ctx, encodeState(t, st))
				if tc.wantErrContains != "" {
					if podGone {
						pod = nil
					}
					checkClaimRefused(ctx, t, cs, err, tc.wantErrContains, "destroy it", pvc, pod, sec)
					return
				}
				if err != nil {
					t.Fatalf("destroy of the session's own claim: %v", err)
				}
				if _, err := cs.CoreV1().PersistentVolumeClaims("ns").Get(ctx, tc.volume, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("the destroyed claim: %v", err)
				}
				if _, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("the destroyed pod: %v", err)
				}
			})
		}
	}
}

// TestDestroyKeepingTheClaimDoesNotReadIt: under DeleteSandbox Destroy
// leaves the PVC alone, so it neither reads nor judges it: a state naming
// another session's PVC destroys its Pod and leaves the PVC.
func TestDestroyKeepingTheClaimDoesNotReadIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pvc := createdClaim(t, "other")
	pod, sec, st := volumePod(t, "00112233aabbccdd", "s1", pvc.Name)
	cs := fake.NewClientset(pod, sec, pvc)
	p, _ := observedProvider(t, Config{NetworkPolicy: new(bool), DeletePolicy: DeleteSandbox}, cs)
	cs.ClearActions()
	if err := p.Destroy(ctx, encodeState(t, st)); err != nil {
		t.Fatal(err)
	}
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "persistentvolumeclaims" {
			t.Errorf("destroy keeping the claim did %s it", a.GetVerb())
		}
	}
	if _, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the destroyed pod: %v", err)
	}
}

// mountedClaims are the workspace PVCs the Pods created since the last
// ClearActions mount.
func mountedClaims(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetResource().Resource != "pods" {
			continue
		}
		for _, v := range ca.GetObject().(*corev1.Pod).Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				out = append(out, v.PersistentVolumeClaim.ClaimName)
			}
		}
	}
	return out
}

// TestLaunchRefusesAPriorWorkspaceClaimNotTheSessions: Launch with a
// VolumeWorkspace and a Prior naming a workspace PVC not made for the
// session is refused with ErrInvalidArgument after reads only: nothing is
// deleted, created or mounted, and the Prior's Pod stays. A Prior of the
// state's session launched by another session is refused the same way
// over its PVC. The session's own PVC is mounted again (no PVC created);
// a gone one is created anew under the Prior's name, as before. (The
// test stops the launch at its Pod's create.)
func TestLaunchRefusesAPriorWorkspaceClaimNotTheSessions(t *testing.T) {
	cases := claimCases()
	cases = append(cases, claimCase{name: "the state's, launched by another session", volume: VolumeName("s1"), state: "s1", caller: "s2",
		claim:           func(t *testing.T) *corev1.PersistentVolumeClaim { return createdClaim(t, "s1") },
		wantErrContains: `workspace claim ` + VolumeName("s1") + ` was not made for session "s2" (it was made for another session; refusing to `})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pod, sec, st := volumePod(t, "00112233aabbccdd", tc.state, tc.volume)
			objs := []runtime.Object{pod, sec}
			var pvc *corev1.PersistentVolumeClaim
			if tc.claim != nil {
				pvc = tc.claim(t)
				objs = append(objs, pvc)
			}
			cs := fake.NewClientset(objs...)
			stopLaunchAtPodCreate(cs)
			p, _ := observedProvider(t, Config{NetworkPolicy: new(bool)}, cs)
			caller := tc.caller
			if caller == "" {
				caller = tc.state
			}

			cs.ClearActions()
			sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: caller, Prior: encodeState(t, st), Options: &CreateOptions{VolumeWorkspace: true}})
			if sb != nil {
				_ = sb.Close()
				t.Fatal("the launch was meant to stop at its pod's create")
			}
			if tc.wantErrContains != "" {
				checkClaimRefused(ctx, t, cs, err, tc.wantErrContains, "mount it", pvc, pod, sec)
				return
			}
			if !errors.Is(err, compute.ErrUnavailable) || podCreates(cs) != 1 {
				t.Fatalf("the launch did not get to create its pod (%d creates): %v", podCreates(cs), err)
			}
			if got := mountedClaims(cs); len(got) != 1 || got[0] != tc.volume {
				t.Errorf("the new pod mounts %v, want the prior's %s", got, tc.volume)
			}
			if _, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the replaced pod: %v", err)
			}
			created := 0
			for _, a := range cs.Actions() {
				if a.GetVerb() == "create" && a.GetResource().Resource == "persistentvolumeclaims" {
					created++
				}
			}
			if want := map[bool]int{true: 0, false: 1}[pvc != nil]; created != want {
				t.Errorf("%d claims created, want %d", created, want)
			}
			if pvc != nil {
				if _, err := cs.CoreV1().PersistentVolumeClaims("ns").Get(ctx, tc.volume, metav1.GetOptions{}); err != nil {
					t.Errorf("the kept claim after the stopped launch: %v", err)
				}
			}
		})
	}
}

// TestColdPodOfAnotherSessionIsRefused: a state naming a cold Pod (of no
// pool) created for another session than the state's, or the state of a
// cold Pod handed in by another session, is refused by Reattach, Destroy
// and Launch (as Prior) with ErrInvalidArgument after the Pod's read:
// nothing is deleted, created or attached to. A cold Pod that records no
// session (not one any version of the provider made) is not refused.
func TestColdPodOfAnotherSessionIsRefused(t *testing.T) {
	const key = "aaaaaaaaaaaaaaaa"
	for _, tc := range []struct {
		name            string
		created         string // the Pod's session ("": no annotation)
		state, caller   string
		ops             []string
		wantErrContains string
	}{
		{name: "another session's", created: "other", state: "s1", caller: "s1", ops: []string{"reattach", "destroy it", "replace it"},
			wantErrContains: `pod bulkhead-` + key + ` was not created for session "s1" (it was created for another session; refusing to `},
		{name: "another session's, caller names none", created: "other", state: "s1", ops: []string{"reattach"},
			wantErrContains: `was not created for session "s1"`},
		{name: "the state's, handed in by another session", created: "s1", state: "s1", caller: "s2", ops: []string{"reattach", "replace it"},
			wantErrContains: `was not created for session "s2" (it was created for another session; refusing to `},
		{name: "no session recorded", state: "s1", caller: "s1", ops: []string{"reattach", "destroy it", "replace it"}},
	} {
		for _, op := range tc.ops {
			t.Run(tc.name+"/"+op, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				pod := sandboxPod(key, tc.created, nil, nil)
				if tc.created == "" {
					delete(pod.Annotations, AnnotationSession)
					delete(pod.Labels, LabelSession)
				}
				sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Namespace: "ns", ResourceVersion: "1"}}
				cs := fake.NewClientset(pod, sec)
				stopLaunchAtPodCreate(cs)
				p, _ := observedProvider(t, Config{NetworkPolicy: new(bool)}, cs)
				raw := handMadeState(t, pod, tc.state)

				cs.ClearActions()
				var err error
				switch op {
				case "reattach":
					var sb compute.Sandbox
					if sb, err = p.Reattach(ctx, compute.LaunchSpec{SessionID: tc.caller}, raw); sb != nil {
						_ = sb.Close()
						t.Fatal("reattached to a pod with no daemon")
					}
				case "destroy it":
					err = p.Destroy(ctx, raw)
				case "replace it":
					_, err = p.Launch(ctx, compute.LaunchSpec{SessionID: tc.caller, Prior: raw})
				}
				if tc.wantErrContains != "" {
					checkRefusedUntouched(ctx, t, cs, err, tc.wantErrContains, pod, sec)
					if !strings.Contains(err.Error(), "refusing to "+op) {
						t.Errorf("the refusal does not say it refused to %s: %v", op, err)
					}
					return
				}
				switch {
				case op == "reattach" && errors.Is(err, compute.ErrInvalidArgument):
					t.Fatalf("reattach refused a pod that records no session: %v", err)
				case op == "destroy it" && err != nil:
					t.Fatalf("destroy of a pod that records no session: %v", err)
				case op == "replace it" && (!errors.Is(err, compute.ErrUnavailable) || podCreates(cs) != 1):
					t.Fatalf("the launch did not get to create its pod (%d creates): %v", podCreates(cs), err)
				}
			})
		}
	}
}
