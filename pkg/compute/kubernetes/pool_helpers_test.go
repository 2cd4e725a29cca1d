package kubernetes

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// readyPool fills the pool name of p with size ready Pods, drains it when
// the test ends (stopping any background refill first), and returns the
// pool's Pods as listed once they are ready.
func readyPool(ctx context.Context, t *testing.T, p *Provider, name string, size int) []corev1.Pod {
	t.Helper()
	if _, err := p.FillPool(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitPoolReady(ctx, name, size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p.StopPools()
		if err := p.DrainPool(ctx, name); err != nil {
			t.Errorf("drain: %v", err)
		}
	})
	pods, _, err := p.poolPods(ctx, name)
	if err != nil || len(pods) != size {
		t.Fatalf("pool pods: %d, %v", len(pods), err)
	}
	return pods
}
