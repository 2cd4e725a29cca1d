package kubernetes

// A warm Pod's token does not outlive its claim.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// TestClaimRotatesTheToken: claiming a warm Pod gives its daemon a fresh
// session token; the token the Pod was created with (which sat in its
// Secret while the Pod waited) is refused from then on, the session works,
// the Secret holds the new token, and a second provider (another harness
// process) reattaches with it.
func TestClaimRotatesTheToken(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := e.config(ConnectPortForward)
	cfg.Pools = []Pool{{Name: "warm", Size: 1}}
	p := e.provider(t, cfg)
	if _, err := p.FillPool(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitPoolReady(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.DrainPool(ctx, "warm"); err != nil {
			t.Errorf("drain: %v", err)
		}
	})
	warm, _, err := p.poolPods(ctx, "warm")
	if err != nil || len(warm) != 1 {
		t.Fatalf("pool pods: %d, %v", len(warm), err)
	}
	key := warm[0].Labels[LabelKey]
	sec, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poolToken := strings.TrimSpace(string(sec.Data[tokenKey]))

	c := e.client(t, p, nil)
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: "rotate-1", ProviderOptions: &CreateOptions{Pool: "warm"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Delete(context.Background(), s); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	st, err := DecodeState(raw.ProviderState)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pool != "warm" || st.Key != key {
		t.Fatalf("the session did not get the warm pod %s: state %+v", warm[0].Name, st)
	}
	if res, err := s.Agent().Exec(ctx, &agentdv1.ExecRequest{Spec: &agentdv1.ProcessSpec{Command: "echo claimed"}}, nil); err != nil || strings.TrimSpace(string(res.Stdout)) != "claimed" {
		t.Fatalf("exec after the claim: %v %v", res, err)
	}

	sec, err = e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sessionToken := strings.TrimSpace(string(sec.Data[tokenKey]))
	if sessionToken == poolToken || len(sessionToken) != 64 {
		t.Fatalf("the Secret still holds the pool token, or a malformed one (%d bytes)", len(sessionToken))
	}

	// Dial the daemon directly with each token.
	pod, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, st.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := func(token string) error {
		addr, dopts, err := p.dialOptions(pod)
		if err != nil {
			t.Fatal(err)
		}
		ac, err := agentclient.Dial(agentclient.Options{Address: addr, Token: token, DialOptions: dopts})
		if err != nil {
			t.Fatal(err)
		}
		defer ac.Close()
		_, err = ac.Info(ctx, &agentdv1.InfoRequest{})
		return err
	}
	if err := info(poolToken); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("the pool token after the claim: want unauthenticated, got %v", err)
	}
	if err := info(sessionToken); err != nil {
		t.Fatalf("the session token from the Secret: %v", err)
	}

	// Another harness process reattaches with what the Secret holds.
	p2 := e.provider(t, cfg)
	sb, err := p2.Reattach(ctx, compute.LaunchSpec{SessionID: "rotate-1"}, raw.ProviderState)
	if err != nil {
		t.Fatalf("reattach from a new provider: %v", err)
	}
	defer sb.Close()
	if res, err := sb.Agent().Exec(ctx, &agentdv1.ExecRequest{Spec: &agentdv1.ProcessSpec{Command: "echo reattached"}}, nil); err != nil || strings.TrimSpace(string(res.Stdout)) != "reattached" {
		t.Fatalf("exec after reattaching: %v %v", res, err)
	}
}
