package kubernetes

// RBAC, warm pools and faults against the real cluster.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// TestMissingVerbIsAClearError: a Role without `create secrets` fails the
// launch with ErrPermissionDenied naming the verb and the resource, and
// leaves nothing behind.
func TestMissingVerbIsAClearError(t *testing.T) {
	var rules []rbacv1.PolicyRule
	for _, r := range (Config{}).RequiredRules() {
		if len(r.Resources) == 1 && r.Resources[0] == "secrets" {
			r.Verbs = []string{"get", "delete"}
		}
		rules = append(rules, r)
	}
	e := newKubeEnv(t, rules)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := e.client(t, e.provider(t, e.config(ConnectPortForward)), nil).Create(ctx, compute.CreateOptions{SessionID: "rbac"})
	if !errors.Is(err, compute.ErrPermissionDenied) || !strings.Contains(err.Error(), `"create" "secrets"`) {
		t.Fatalf("err = %v; want permission denied naming create secrets", err)
	}
	t.Logf("the error: %v", err)
	waitNothingLeft(t, e)
}

// waitNothingLeft waits (watching) until the namespace holds no sandbox
// object: a failed launch deletes what it made, the Pod last to go.
func waitNothingLeft(t *testing.T, e *kubeEnv) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		left := e.all(t)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", left)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		w, err := e.admin.CoreV1().Pods(e.ns).Watch(ctx, metav1.ListOptions{})
		if err == nil {
			for range w.ResultChan() {
			}
		}
		cancel()
	}
}

// TestWarmPoolClaimsRace: two providers (two harness processes, each with
// its own API client) claim from one pool at once; no Pod is claimed
// twice, every session gets a working sandbox of its own, and the pool
// refills in the background.
func TestWarmPoolClaimsRace(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const size = 3
	cfg := e.config(ConnectPortForward)
	cfg.Pools = []Pool{{Name: "warm", Size: size}}
	p1, p2 := e.provider(t, cfg), e.provider(t, cfg)
	readyPool(ctx, t, p1, "warm", size)

	// 2*size claims, size from each provider, all at once: size of them
	// get warm Pods, the others are created cold.
	type result struct {
		session, pod, pool string
		took               time.Duration
		err                error
	}
	results := make(chan result, 2*size)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2 * size {
		p := p1
		if i%2 == 1 {
			p = p2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c := e.client(t, p, nil)
			id := fmt.Sprintf("race-%d", i)
			t0 := time.Now()
			s, err := c.Create(ctx, compute.CreateOptions{SessionID: id, ProviderOptions: &CreateOptions{Pool: "warm"}})
			if err != nil {
				results <- result{session: id, err: err}
				return
			}
			err = s.Start(ctx)
			var res *agentclient.ExecResult
			if err == nil {
				res, err = s.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo " + id}, compute.ExecOptions{}, nil)
			}
			took := time.Since(t0)
			if err == nil && strings.TrimSpace(string(res.Stdout)) != id {
				err = fmt.Errorf("exec in %s: %q", id, res.Stdout)
			}
			raw, _ := s.State()
			st, _ := DecodeState(raw.ProviderState)
			t.Cleanup(func() {
				if err := c.Delete(context.Background(), s); err != nil {
					t.Errorf("delete %s: %v", id, err)
				}
			})
			results <- result{session: id, pod: st.Pod, pool: st.Pool, took: took, err: err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	pods := map[string]string{}
	warm := 0
	for r := range results {
		if r.err != nil {
			t.Errorf("%s: %v", r.session, r.err)
			continue
		}
		if other, dup := pods[r.pod]; dup {
			t.Errorf("pod %s claimed by %s and %s", r.pod, other, r.session)
		}
		pods[r.pod] = r.session
		if r.pool != "" {
			warm++
		}
		t.Logf("%s: pod %s (pool %q): create to first exec %s", r.session, r.pod, r.pool, r.took.Round(time.Millisecond))
	}
	if warm != size {
		t.Errorf("%d sessions got warm pods, want %d", warm, size)
	}
	// Every claimed Pod names exactly its claimer.
	for pod, session := range pods {
		got, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Annotations[AnnotationSession] != session {
			t.Errorf("pod %s names session %q, claimed by %s", pod, got.Annotations[AnnotationSession], session)
		}
	}
	// The pool refills in the background.
	p1.StartPools(ctx)
	if err := p1.WaitPoolReady(ctx, "warm", size); err != nil {
		t.Fatal(err)
	}
}

// TestPodDeletedUnderARunningCommand: the Pod deleted (by someone else)
// while a command runs gives the caller an error saying the sandbox's Pod
// was deleted (not only "killed by SIGKILL"), ErrUnavailable and not
// retryable (the command ran); a resume rebuilds the sandbox from the
// snapshot.
func TestPodDeletedUnderARunningCommand(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	store := newStore(t)
	c := e.client(t, e.provider(t, e.config(ConnectPortForward)), store)
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: "deleted-pod"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Delete(context.Background(), s); err != nil {
			t.Errorf("delete: %v", err)
		}
	}()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, compute.ProcessSpec{Command: "echo kept > notes.txt"}, compute.ExecOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil { // the snapshot
		t.Fatal(err)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	pst := sessionPod(t, s)
	first := make(chan struct{})
	var once sync.Once
	type execResult struct {
		exit compute.ExitStatus
		err  error
	}
	done := make(chan execResult, 1)
	go func() {
		res, err := s.Exec(ctx, compute.ProcessSpec{Command: "echo started; sleep 300"}, compute.ExecOptions{},
			func(m *compute.ExecEvent) error {
				if len(m.Chunks) > 0 {
					once.Do(func() { close(first) })
				}
				return nil
			})
		done <- execResult{res.Exit, err}
	}()
	select {
	case <-first:
	case r := <-done:
		t.Fatalf("exec ended before the fault: %v", r.err)
	}
	if err := e.admin.CoreV1().Pods(e.ns).Delete(ctx, pst.Pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var r execResult
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("exec did not end after its pod was deleted")
	}
	// The daemon drains on SIGTERM and kills the command, or the stream
	// is cut first: either way the caller is told the Pod was deleted.
	if r.err == nil {
		t.Fatalf("exec on a deleted pod ended with %+v and no error", r.exit)
	}
	t.Logf("exec after the pod was deleted: %v", r.err)
	if !errors.Is(r.err, compute.ErrUnavailable) || compute.Retryable(r.err) ||
		!strings.Contains(r.err.Error(), "Pod "+e.ns+"/"+pst.Pod+" was deleted") {
		t.Errorf("exec error %v: want ErrUnavailable saying the Pod was deleted, not retryable", r.err)
	}
	// Later calls fail, retryable.
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err = s.Agent().Start(short, compute.ProcessSpec{Command: "true"}, compute.StartOptions{})
	cancelShort()
	if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
		t.Errorf("start on a deleted pod: %v; want ErrUnavailable, retryable", err)
	}
	t.Logf("the error: %v", err)
	_ = s.Release()
	s2, err := e.client(t, e.provider(t, e.config(ConnectPortForward)), store).Resume(ctx, st)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	s = s2
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s2.Agent().Exec(ctx, compute.ProcessSpec{Command: "cat notes.txt"}, compute.ExecOptions{}, nil)
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "kept" {
		t.Fatalf("after resume: %v %v", res, err)
	}
}

// TestAPIServerRestartMidCreate: the API server killed and restarted
// while a sandbox is being created (its Pod made, not yet running): the
// create either completes or fails, and a failed one leaves no Pod,
// Secret or NetworkPolicy.
func TestAPIServerRestartMidCreate(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := e.client(t, e.provider(t, e.config(ConnectPortForward)), nil)

	// Watch for the Pod's creation, then restart the API server.
	w, err := e.admin.CoreV1().Pods(e.ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.Everything().String()})
	if err != nil {
		t.Fatal(err)
	}
	type created struct {
		s   *compute.Session
		err error
	}
	done := make(chan created, 1)
	go func() {
		s, err := c.Create(ctx, compute.CreateOptions{SessionID: "restart"})
		done <- created{s, err}
	}()
	for ev := range w.ResultChan() {
		if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added && pod.Labels[LabelSandbox] == "1" {
			break
		}
	}
	w.Stop()
	e.c.RestartAPIServer(t)
	r := <-done
	if r.err == nil {
		t.Log("the create completed across the restart")
		if err := c.Delete(ctx, r.s); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("the create failed: %v", r.err)
		if !compute.Retryable(r.err) && !errors.Is(r.err, compute.ErrUnavailable) {
			t.Errorf("the failure is not marked retryable: %v", r.err)
		}
	}
	waitNothingLeft(t, e)
}

// TestVolumeWorkspace: a session asking for a volume-backed workspace gets
// a PVC; under DeleteSandbox the claim outlives the Pod and a replacement
// launched with the earlier state mounts it again (WorkspaceKept); under
// DeleteAll it goes with the sandbox.
func TestVolumeWorkspace(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A statically provisioned volume on the node for the claim to bind
	// (the test cluster has no dynamic provisioner).
	dir := t.TempDir()
	pvName := "bulkhead-test-" + e.ns
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resourceMust("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Namespace: e.ns, Name: VolumeName("vol")},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}
	if _, err := e.admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.admin.CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	empty := ""
	cfg := e.config(ConnectPortForward)
	cfg.StorageClassName = &empty
	cfg.DeletePolicy = DeleteSandbox
	p := e.provider(t, cfg)
	sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "vol", Options: &CreateOptions{VolumeWorkspace: true}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.WorkspaceKept() {
		t.Error("a new claim reported as kept")
	}
	if _, err := sb.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo persisted > /workspace/f.txt", User: "root"}, compute.ExecOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	raw, err := sb.State()
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.Close()
	if err := p.Destroy(ctx, raw); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, VolumeName("vol"), metav1.GetOptions{}); err != nil {
		t.Fatalf("DeleteSandbox removed the claim: %v", err)
	}
	sb2, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "vol", Prior: raw, Options: &CreateOptions{VolumeWorkspace: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	if !sb2.WorkspaceKept() {
		t.Error("the kept claim was not reported as kept")
	}
	res, err := sb2.Agent().Exec(ctx, compute.ProcessSpec{Command: "cat /workspace/f.txt", User: "root"}, compute.ExecOptions{}, nil)
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "persisted" {
		t.Fatalf("the workspace after relaunch: %v %v", res, err)
	}
	raw2, _ := sb2.State()
	cfg.DeletePolicy = DeleteAll
	if err := e.provider(t, cfg).Destroy(ctx, raw2); err != nil {
		t.Fatal(err)
	}
	if left := e.leaked(t, "vol"); len(left) > 0 {
		t.Fatalf("DeleteAll left %v", left)
	}
}

// TestReapOrphansAsTheHarness: as the harness ServiceAccount (bound to
// RequiredRules only), Reap deletes a token Secret and a NetworkPolicy
// that a launch crashed before creating its Pod left, and gives a Secret a
// crash between the Pod's create and the owner patches left unowned to its
// Pod, whose sandbox keeps working.
func TestReapOrphansAsTheHarness(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := e.config(ConnectPortForward)
	p := e.provider(t, cfg)
	c := e.client(t, p, nil)

	// A launch that died before its Pod: its policy and Secret, unowned.
	const gone = "0123456789abcdef"
	lbl := map[string]string{LabelSandbox: "1", LabelKey: gone, runLabelKey: testRun.label}
	if _, err := e.admin.CoreV1().Secrets(e.ns).Create(ctx, p.secretFor(gone, strings.Repeat("a", 64), lbl, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.NetworkingV1().NetworkPolicies(e.ns).Create(ctx, p.policyFor(gone, lbl), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A sandbox whose Secret lost its owner (as a crash before the owner
	// patch leaves it).
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: "reap-adopt"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Delete(context.Background(), s) }()
	raw, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	st, err := DecodeState(raw.ProviderState)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().Secrets(e.ns).Patch(ctx, secretName(st.Key), types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// Too young: nothing is touched.
	if err := p.ReapOrphans(ctx, time.Now()); err != nil {
		t.Fatalf("reap as the harness: %v", err)
	}
	if _, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(gone), metav1.GetOptions{}); err != nil {
		t.Fatalf("a young orphan Secret was reaped: %v", err)
	}
	// Past the grace period.
	if err := p.ReapOrphans(ctx, time.Now().Add(orphanAge+time.Minute)); err != nil {
		t.Fatalf("reap as the harness: %v", err)
	}
	if _, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(gone), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the orphan Secret: %v", err)
	}
	if _, err := e.admin.NetworkingV1().NetworkPolicies(e.ns).Get(ctx, policyName(gone), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the orphan NetworkPolicy: %v", err)
	}
	sec, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(st.Key), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the running sandbox's Secret: %v", err)
	}
	if len(sec.OwnerReferences) != 1 || string(sec.OwnerReferences[0].UID) != st.UID {
		t.Errorf("the running sandbox's Secret was not given to its Pod: %+v", sec.OwnerReferences)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Exec(ctx, compute.ProcessSpec{Command: "echo alive"}, compute.ExecOptions{}, nil); err != nil || strings.TrimSpace(string(res.Stdout)) != "alive" {
		t.Fatalf("the sandbox after the reap: %v %v", res, err)
	}
}
