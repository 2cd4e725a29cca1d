package kubernetes

// Disk caps (Config.Disk) and a Pod evicted for passing one, against the
// real cluster; the spec alone in unit tests.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

func TestDiskCapSpec(t *testing.T) {
	p, _ := fakeProvider(t, Config{Disk: 1 << 30})
	set, err := p.cfg.settings(&CreateOptions{Disk: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	pod := p.podFor(podParams{key: "0123456789abcdef", set: set, root: "/workspace"})
	c := pod.Spec.Containers[0]
	if got := c.Resources.Limits[corev1.ResourceEphemeralStorage]; got.Value() != 64<<20 {
		t.Errorf("ephemeral-storage limit %v", got.String())
	}
	if got := c.Resources.Requests[corev1.ResourceEphemeralStorage]; got.Value() > 64<<20 || got.IsZero() {
		t.Errorf("ephemeral-storage request %v", got.String())
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == workspaceVolume && (v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Value() != 64<<20) {
			t.Errorf("workspace volume %+v: want an emptyDir of sizeLimit 64Mi", v.VolumeSource)
		}
	}
	if got := p.claimFor("ws", nil, nil, set.disk).Spec.Resources.Requests[corev1.ResourceStorage]; got.Value() != 64<<20 {
		t.Errorf("a capped sandbox's workspace claim requests %v", got.String())
	}

	// No cap: no limit, no sizeLimit, the configured claim size.
	p2, _ := fakeProvider(t, Config{VolumeSize: resource.MustParse("2Gi")})
	set, _ = p2.cfg.settings(&CreateOptions{Disk: -1})
	pod = p2.podFor(podParams{key: "0123456789abcdef", set: set, root: "/workspace"})
	if _, ok := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
		t.Error("an uncapped sandbox has an ephemeral-storage limit")
	}
	if got := p2.claimFor("ws", nil, nil, set.disk).Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "2Gi" {
		t.Errorf("an uncapped claim requests %v", got.String())
	}
}

// TestDiskCapEvictsThePod: a sandbox capped at 32 MiB writes 64 MiB into
// its workspace; the kubelet's eviction manager evicts the Pod for
// passing the emptyDir's sizeLimit, and the command running meanwhile
// ends with an error saying the Pod was evicted and why.
func TestDiskCapEvictsThePod(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := e.config(ConnectPortForward)
	cfg.Disk = 32 << 20
	c := e.client(t, e.provider(t, cfg), nil)
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: "disk-cap"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Delete(context.Background(), s) }()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pst := sessionPod(t, s)
	pod, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, pst.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceEphemeralStorage]; got.Value() != 32<<20 {
		t.Fatalf("the Pod's ephemeral-storage limit: %v", got.String())
	}
	// The kubelet measures emptyDirs periodically (its eviction manager
	// every 10 s, volume usage about every minute): the command writes
	// past the cap and waits to be stopped.
	res, err := s.Exec(ctx, compute.ProcessSpec{Command: "dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; sync; sleep 300"}, compute.ExecOptions{}, nil)
	if err == nil {
		t.Fatalf("the command on an evicted Pod ended with exit %+v and no error", res.Exit)
	}
	t.Logf("the caller sees: %v", err)
	// The kubelet's eviction is in an event (Evicted: "Usage of EmptyDir
	// volume ... exceeds the limit"); the Pod itself may say only that it
	// stopped (phase Succeeded, no reason, for 20 s and more here).
	// Reading events would need another permission in the provider's
	// Role: the error names the Pod and that it stopped.
	msg := err.Error()
	if !errors.Is(err, compute.ErrUnavailable) || !strings.Contains(msg, pst.Pod) ||
		(!strings.Contains(msg, "Evicted") && !strings.Contains(msg, "was stopped")) {
		t.Fatalf("the command's error %v: want ErrUnavailable saying the sandbox's Pod was evicted or stopped", err)
	}
	evicted := false
	events, err := e.admin.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pst.Pod})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		evicted = evicted || (ev.Reason == "Evicted" && strings.Contains(ev.Message, "EmptyDir"))
	}
	if !evicted {
		t.Errorf("no Evicted event for the Pod's emptyDir: the kubelet did not enforce the cap")
	}
}

// sessionPod is the provider state of a session's sandbox.
func sessionPod(t *testing.T, s *compute.Session) State {
	t.Helper()
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	pst, err := DecodeState(st.ProviderState)
	if err != nil {
		t.Fatal(err)
	}
	return pst
}
