package kubernetes

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

func TestKilledBy(t *testing.T) {
	for _, c := range []struct {
		m    any
		want string
	}{
		{&agentdv1.ExecResponse{Exit: &agentdv1.ExitStatus{ExitCode: 137, Signal: "SIGKILL"}}, "SIGKILL"},
		{&agentdv1.AttachResponse{Exit: &agentdv1.ExitStatus{ExitCode: 143, Signal: "SIGTERM"}}, "SIGTERM"},
		{&agentdv1.WaitResponse{Exit: &agentdv1.ExitStatus{ExitCode: 130, Signal: "SIGINT"}}, ""},
		{&agentdv1.ExecResponse{Exit: &agentdv1.ExitStatus{ExitCode: 1}}, ""},
		{&agentdv1.ExecResponse{Chunks: []*agentdv1.OutputChunk{{Data: []byte("x")}}}, ""},
		{&agentdv1.ListResponse{}, ""},
		{"not a message", ""},
	} {
		if got := killedBy(c.m); got != c.want {
			t.Errorf("killedBy(%T %v) = %q, want %q", c.m, c.m, got, c.want)
		}
	}
}

func TestPodGoneReason(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	grace := int64(3)
	meta := metav1.ObjectMeta{Namespace: "ns", Name: "bulkhead-0123"}
	if got := podGoneReason(&corev1.Pod{ObjectMeta: meta, Status: corev1.PodStatus{Phase: corev1.PodRunning}}); got != "" {
		t.Errorf("a running Pod: %q", got)
	}
	deleted := meta
	deleted.DeletionTimestamp, deleted.DeletionGracePeriodSeconds = &at, &grace
	got := podGoneReason(&corev1.Pod{ObjectMeta: deleted, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"},
	}}})
	for _, want := range []string{"Pod ns/bulkhead-0123 was deleted", "2026-01-02T03:04:05Z", "grace period 3s", "an eviction through the API", "Eviction API: evicting"} {
		if !strings.Contains(got, want) {
			t.Errorf("a Pod evicted through the API: %q lacks %q", got, want)
		}
	}
	got = podGoneReason(&corev1.Pod{ObjectMeta: meta, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted",
		Message: `Usage of EmptyDir volume "workspace" exceeds the limit "32Mi". `}})
	for _, want := range []string{"was stopped (phase Failed)", "Evicted", `exceeds the limit "32Mi"`} {
		if !strings.Contains(got, want) {
			t.Errorf("a Pod evicted by the kubelet: %q lacks %q", got, want)
		}
	}
}
