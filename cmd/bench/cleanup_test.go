package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// fakeProvider launches sandboxes that are only a name, and records the
// Destroy calls: how many, how many at once at most; the names in fail
// fail to be destroyed.
type fakeProvider struct {
	fail map[string]bool

	mu                  sync.Mutex
	n                   int
	destroyed           []string
	inFlight, maxFlight int
	release             chan struct{} // Destroy waits for it (nil: no wait)
}

type fakeSandbox struct{ name string }

func (s fakeSandbox) Agent() *agentclient.Client                            { return nil }
func (s fakeSandbox) State() (json.RawMessage, error)                       { return json.Marshal(s.name) }
func (s fakeSandbox) WorkspaceKept() bool                                   { return false }
func (s fakeSandbox) Touch(context.Context) error                           { return nil }
func (s fakeSandbox) Shutdown(context.Context) error                        { return nil }
func (s fakeSandbox) Close() error                                          { return nil }
func (p *fakeProvider) Name() string                                        { return "fake" }
func (p *fakeProvider) List(context.Context) ([]compute.SandboxInfo, error) { return nil, nil }

func (p *fakeProvider) Launch(context.Context, compute.LaunchSpec) (compute.Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	return fakeSandbox{fmt.Sprintf("sb%d", p.n)}, nil
}

func (p *fakeProvider) Reattach(context.Context, compute.LaunchSpec, json.RawMessage) (compute.Sandbox, error) {
	return nil, errors.New("not supported")
}

func (p *fakeProvider) Destroy(_ context.Context, prior json.RawMessage) error {
	var name string
	if err := json.Unmarshal(prior, &name); err != nil {
		return err
	}
	p.mu.Lock()
	p.inFlight++
	p.maxFlight = max(p.maxFlight, p.inFlight)
	p.mu.Unlock()
	if p.release != nil {
		<-p.release
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	p.destroyed = append(p.destroyed, name)
	if p.fail[name] {
		return fmt.Errorf("%s: refused", name)
	}
	return nil
}

// deleteSessions deletes every session given (skipping nil ones),
// deleteParallel at a time, and returns every failure.
func TestDeleteSessions(t *testing.T) {
	ctx := context.Background()
	p := &fakeProvider{fail: map[string]bool{"sb3": true, "sb17": true}, release: make(chan struct{})}
	c := compute.NewClient(p, compute.ClientOptions{Log: zap.NewNop()})
	sessions := make([]*compute.Session, 25)
	for i := range sessions {
		if i == 5 {
			continue // a sandbox that failed to create
		}
		s, err := c.Create(ctx, compute.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	done := make(chan error, 1)
	go func() { done <- deleteSessions(ctx, c, sessions) }()
	// Every Destroy waits: deleteParallel of them start, no more.
	flight := func() (int, int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inFlight, p.maxFlight
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if n, _ := flight(); n == deleteParallel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d deletes at once", deleteParallel)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if _, most := flight(); most != deleteParallel {
		t.Errorf("%d deletes at once, want %d", most, deleteParallel)
	}
	for range 24 {
		p.release <- struct{}{}
	}
	err := <-done
	if len(p.destroyed) != 24 {
		t.Errorf("%d destroyed, want 24", len(p.destroyed))
	}
	if _, most := flight(); most != deleteParallel {
		t.Errorf("at most %d at once, want %d", most, deleteParallel)
	}
	if err == nil || !strings.Contains(err.Error(), "sb3: refused") || !strings.Contains(err.Error(), "sb17: refused") {
		t.Errorf("error %v, want both refusals", err)
	}
	if err := deleteSessions(ctx, c, make([]*compute.Session, 3)); err != nil {
		t.Errorf("no sessions: %v", err)
	}
}

func TestSummarizeErrors(t *testing.T) {
	if err := summarizeErrors(nil, 3); err != nil {
		t.Errorf("no errors: %v", err)
	}
	one := errors.New("boom")
	if err := summarizeErrors([]error{one}, 3); err != one {
		t.Errorf("one error: %v", err)
	}
	var errs []error
	for i := range 10 {
		errs = append(errs, fmt.Errorf("start: %w", one), fmt.Errorf("delete: e%d", i%5))
	}
	err := summarizeErrors(errs, 3)
	if !errors.Is(err, one) {
		t.Errorf("%v does not wrap the first error", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "20 failures, 6 distinct, the first 3:\n") || strings.Count(msg, "start: boom") != 1 ||
		!strings.Contains(msg, "delete: e0") || !strings.Contains(msg, "delete: e1") || strings.Contains(msg, "delete: e2") {
		t.Errorf("message %q", msg)
	}
}
