package kubernetes

// A warm Pod's token does not outlive its claim.

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
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
	warm := readyPool(ctx, t, p, "warm", 1)
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
	if res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo claimed"}, compute.ExecOptions{}, nil); err != nil || strings.TrimSpace(string(res.Stdout)) != "claimed" {
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
		_, err = ac.Info(ctx)
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
	if res, err := sb.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo reattached"}, compute.ExecOptions{}, nil); err != nil || strings.TrimSpace(string(res.Stdout)) != "reattached" {
		t.Fatalf("exec after reattaching: %v %v", res, err)
	}
}

// TestRotationSurvivesACrash: a harness process that dies at any point of
// a claim's token rotation (after the claim, after staging the new token
// in the Secret, after the daemon took it) leaves a sandbox that another
// harness process reattaches to. The reattach finishes the rotation: the
// Secret ends with the token the daemon accepts, nothing staged, marked
// rotated; the pool token is refused; and two processes reattaching at
// once both succeed with the same token.
func TestRotationSurvivesACrash(t *testing.T) {
	e := newKubeEnv(t, nil)
	for _, step := range []rotateStep{stepClaimed, stepStaged, stepRotated} {
		t.Run(string(step), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			pool := "crash-" + string(step)
			cfg := e.config(ConnectPortForward)
			cfg.Pools = []Pool{{Name: pool, Size: 1}}
			p := e.provider(t, cfg)
			warm := readyPool(ctx, t, p, pool, 1)
			key := warm[0].Labels[LabelKey]
			poolToken := e.secretTokens(ctx, t, key).token

			// A harness process claims and dies at step.
			session := "crash-" + string(step)
			spec := e.childSpec(cfg.Pools, pool, session)
			spec.CrashAt = step
			ch := startChild(ctx, t, "crasher", spec)
			goAll(t, ch)
			if code := ch.wait(t); code != childCrashExit || ch.crash == nil || ch.crash.Step != step {
				t.Fatalf("the child did not stop at %s: exit %d, crash %+v, results %+v", step, code, ch.crash, ch.results)
			}
			raw := ch.crash.State
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := p.Destroy(ctx, raw); err != nil {
					t.Errorf("destroy: %v", err)
				}
			})
			st, err := DecodeState(raw)
			if err != nil {
				t.Fatal(err)
			}
			if st.Key != key {
				t.Fatalf("the child claimed %s, not the pool's pod %s", st.Pod, warm[0].Name)
			}
			pod, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, st.Pod, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			// The crash left what the step says.
			left := e.secretTokens(ctx, t, key)
			if left.token != poolToken || left.rotated {
				t.Fatalf("after a crash at %s the Secret's token moved on already (rotated %v)", step, left.rotated)
			}
			switch step {
			case stepClaimed:
				if left.next != "" {
					t.Fatalf("a token is staged before staging")
				}
			case stepStaged:
				if left.next == "" {
					t.Fatalf("no staged token after staging")
				}
				if err := dialInfo(ctx, t, p, pod, poolToken); err != nil {
					t.Fatalf("the daemon should still take the pool token: %v", err)
				}
			case stepRotated:
				if left.next == "" {
					t.Fatalf("no staged token after the rotation")
				}
				if err := dialInfo(ctx, t, p, pod, poolToken); !errors.Is(err, errkind.ErrUnauthenticated) {
					t.Fatalf("the daemon should refuse the pool token after the rotation: %v", err)
				}
				if err := dialInfo(ctx, t, p, pod, left.next); err != nil {
					t.Fatalf("the daemon should take the staged token: %v", err)
				}
			}

			// Two fresh harness processes reattach at once.
			var wg sync.WaitGroup
			sbs := make([]compute.Sandbox, 2)
			errs := make([]error, 2)
			for i := range sbs {
				p2 := e.provider(t, cfg)
				wg.Add(1)
				go func() {
					defer wg.Done()
					sbs[i], errs[i] = p2.Reattach(ctx, compute.LaunchSpec{SessionID: session}, raw)
				}()
			}
			wg.Wait()
			for i, sb := range sbs {
				if errs[i] != nil {
					t.Fatalf("reattach %d after a crash at %s: %v", i, step, errs[i])
				}
				defer sb.Close()
				// The session never started (its harness died inside
				// Create), so its run_as account does not exist yet: an
				// authenticated call shows the sandbox answers.
				if _, err := sb.Agent().Info(ctx); err != nil {
					t.Fatalf("the sandbox after reattach %d: %v", i, err)
				}
			}

			settled := e.secretTokens(ctx, t, key)
			if settled.next != "" || !settled.rotated || settled.token == poolToken || len(settled.token) != 64 {
				t.Fatalf("the rotation was not finished: staged %v, rotated %v, pool token kept %v", settled.next != "", settled.rotated, settled.token == poolToken)
			}
			if step != stepClaimed && settled.token != left.next {
				t.Errorf("the staged token was not the one promoted")
			}
			if err := dialInfo(ctx, t, p, pod, settled.token); err != nil {
				t.Errorf("the Secret's token after the reattach: %v", err)
			}
			if err := dialInfo(ctx, t, p, pod, poolToken); !errors.Is(err, errkind.ErrUnauthenticated) {
				t.Errorf("the pool token after the reattach: want unauthenticated, got %v", err)
			}

			// A settled sandbox is reattached without another rotation.
			sb, err := e.provider(t, cfg).Reattach(ctx, compute.LaunchSpec{SessionID: session}, raw)
			if err != nil {
				t.Fatalf("a later reattach: %v", err)
			}
			defer sb.Close()
			if again := e.secretTokens(ctx, t, key); again.token != settled.token || again.rv != settled.rv {
				t.Errorf("a reattach to a settled sandbox changed its Secret")
			}
		})
	}
}

// TestStagingIsConditional: staging a token at a resourceVersion the
// Secret has moved past is a conflict (what keeps two processes that
// finish the same rotation from staging different tokens), checked
// against the real API server.
func TestStagingIsConditional(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := e.provider(t, e.config(ConnectPortForward))
	const key = "0123456789abcdef"
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Labels: map[string]string{LabelSandbox: "1"}}, Data: map[string][]byte{tokenKey: []byte(strings.Repeat("a", 64))}}
	created, err := e.admin.CoreV1().Secrets(e.ns).Create(ctx, sec, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.stageToken(ctx, key, created.ResourceVersion, strings.Repeat("b", 64)); err != nil {
		t.Fatalf("staging at the current version: %v", err)
	}
	if err := p.stageToken(ctx, key, created.ResourceVersion, strings.Repeat("c", 64)); !errors.Is(err, compute.ErrConflict) {
		t.Fatalf("staging at a stale version: want a conflict, got %v", err)
	}
	if got := e.secretTokens(ctx, t, key); got.next != strings.Repeat("b", 64) {
		t.Fatalf("the stale staging overwrote the first")
	}
}

// TestPoolOfAnOldDaemonFailsSafe: a pool whose image has a daemon from
// before SystemService.RotateToken (built from the commit before it was
// added) hands out no sandbox with its pool token: the claimed Pod is
// deleted with its Secret, the session is created cold from the current
// image, and the log says why, once. The pool is then held back
// (Config.PoolCooldown): a second Create goes cold without claiming (and
// wasting) the pool's other Pod, and the refill makes no more.
func TestPoolOfAnOldDaemonFailsSafe(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	image := oldDaemonImage(ctx, t, e)

	cfg := e.config(ConnectPortForward)
	cfg.Pools = []Pool{{Name: "old", Size: 2, Template: PoolTemplate{Options: CreateOptions{Image: image}}}}
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core()))
	p, err := NewFromKubeconfig(cfg, e.kubeconfig, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	warm := readyPool(ctx, t, p, "old", 2)
	old := warm[0] // claims take the oldest ready Pod first
	poolToken := e.secretTokens(ctx, t, old.Labels[LabelKey]).token
	// The old daemon serves, and has no RotateToken.
	if err := dialInfo(ctx, t, p, &old, poolToken); err != nil {
		t.Fatalf("the old daemon: %v", err)
	}

	c := e.client(t, p, nil)
	s, err := c.Create(ctx, compute.CreateOptions{SessionID: "old-pool", ProviderOptions: &CreateOptions{Pool: "old"}})
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
	if res, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo cold"}, compute.ExecOptions{}, nil); err != nil || strings.TrimSpace(string(res.Stdout)) != "cold" {
		t.Fatalf("exec: %v %v", res, err)
	}
	raw, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	st, err := DecodeState(raw.ProviderState)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pool != "" || st.Pod == old.Name || st.Image != testImage {
		t.Fatalf("the session got %s (pool %q, image %s), want a cold pod of %s", st.Pod, st.Pool, st.Image, testImage)
	}
	if _, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, old.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the claimed old pod is still there: %v", err)
	}
	if _, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(old.Labels[LabelKey]), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the claimed old pod's Secret is still there: %v", err)
	}

	// Held back: the next Create claims nothing, the refill makes nothing.
	s2, err := c.Create(ctx, compute.CreateOptions{SessionID: "old-pool-2", ProviderOptions: &CreateOptions{Pool: "old"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Delete(context.Background(), s2); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	raw2, err := s2.State()
	if err != nil {
		t.Fatal(err)
	}
	st2, err := DecodeState(raw2.ProviderState)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Pool != "" || st2.Pod == warm[1].Name || st2.Image != testImage {
		t.Errorf("the second session got %s (pool %q, image %s), want a cold pod of %s", st2.Pod, st2.Pool, st2.Image, testImage)
	}
	if left, _, err := p.poolPods(ctx, "old"); err != nil || len(left) != 1 || left[0].Name != warm[1].Name {
		t.Errorf("the pool's other pod was claimed or lost: %d unclaimed pods left, %v", len(left), err)
	}
	if made, err := p.FillPool(ctx, "old"); made != 0 || err != nil {
		t.Errorf("the held-back pool was refilled: made %d, %v", made, err)
	}
	errLogs := logs.FilterLevelExact(zap.ErrorLevel).FilterMessageSnippet("predates SystemService.RotateToken").All()
	if len(errLogs) != 1 || errLogs[0].ContextMap()["pool"] != "old" || errLogs[0].ContextMap()["pod"] != old.Name {
		t.Errorf("want one error log naming the pool and the pod, got %+v", errLogs)
	}
	for _, entry := range logs.All() {
		for _, v := range entry.ContextMap() {
			if str, ok := v.(string); ok && strings.Contains(str, poolToken) {
				t.Errorf("a log carries the pool token: %q", entry.Message)
			}
		}
	}
}

// oldDaemonImage builds the test image with its daemon replaced by one
// built from the commit before SystemService.RotateToken was added, loads
// it into the cluster's node, and returns its reference. The Docker image
// is removed when the test ends.
func oldDaemonImage(ctx context.Context, t *testing.T, e *kubeEnv) string {
	t.Helper()
	testenv.Require(t, testenv.Tool("git"))
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// The first commit whose proto declares RotateToken; its parent is
	// the last daemon without it.
	// A source tree without history (an export, a shallow clone) cannot
	// give the old daemon; that is how the tree was fetched, not a part
	// the machine lacks, so the test is skipped there even under CI.
	logCmd := exec.CommandContext(ctx, "git", "log", "--format=%H", "--reverse", "-S", "rpc RotateToken", "--", "proto")
	logCmd.Dir = root
	out, err := logCmd.Output()
	added, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err == nil && added != "" {
		// In a shallow clone the oldest commit present seems to add
		// everything; its parent is then missing.
		parent := exec.CommandContext(ctx, "git", "rev-parse", "--verify", "--quiet", added+"^{commit}^")
		parent.Dir = root
		err = parent.Run()
	}
	if err != nil || added == "" {
		testenv.Optional(t, "needs the git history back to the commit that added RotateToken (run it in a full clone)")
	}
	src := t.TempDir()
	archive := exec.CommandContext(ctx, "git", "archive", added+"^")
	archive.Dir = root
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	var aerr, terr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &terr
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s^: %v: %s", added, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar: %v: %s", err, terr.String())
	}
	bin := filepath.Join(t.TempDir(), "sandbox-agentd")
	run(src, []string{"CGO_ENABLED=0"}, "go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags", "-s -w", "-o", bin, "./cmd/sandbox-agentd")

	ref := "bulkhead/sandbox:pre-rotate-" + testRun.label
	ctr := run("", nil, "docker", "create", testImage)
	defer run("", nil, "docker", "rm", ctr)
	run("", nil, "docker", "cp", bin, ctr+":/usr/local/bin/sandbox-agentd")
	run("", nil, "docker", "commit", ctr, ref)
	t.Cleanup(func() {
		if out, err := exec.Command("docker", "rmi", ref).CombinedOutput(); err != nil {
			t.Errorf("docker rmi %s: %v: %s", ref, err, out)
		}
	})
	if err := e.c.LoadDockerImage(ctx, ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestReattachRefusesAPoolPodNotClaimedForIt: on a real cluster, a
// hand-made state naming an unclaimed warm Pod, and then one naming the
// Pod once claimed by another session, are refused with
// ErrInvalidArgument and change nothing (the Pod keeps its labels and
// annotations, the Secret is not staged or rotated, the daemon keeps its
// token); the claimer's own state reattaches.
func TestReattachRefusesAPoolPodNotClaimedForIt(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := e.config(ConnectPortForward)
	cfg.Pools = []Pool{{Name: "guard", Size: 1}}
	p := e.provider(t, cfg)
	warm := readyPool(ctx, t, p, "guard", 1)
	key := warm[0].Labels[LabelKey]
	before := e.secretTokens(ctx, t, key)

	refused := func(session string, pod *corev1.Pod, sec tokenSecret, token string) {
		t.Helper()
		sb, err := e.provider(t, cfg).Reattach(ctx, compute.LaunchSpec{SessionID: session}, handMadeState(t, pod, session))
		if err == nil {
			_ = sb.Close()
			t.Fatalf("reattached session %s to pod %s", session, pod.Name)
		}
		if !errors.Is(err, compute.ErrInvalidArgument) {
			t.Fatalf("want invalid argument, got %v", err)
		}
		cur, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(cur.Labels, pod.Labels) || !maps.Equal(cur.Annotations, pod.Annotations) {
			t.Errorf("the refused reattach changed the pod (claimed %q, session %q)", cur.Labels[LabelClaimed], cur.Annotations[AnnotationSession])
		}
		if now := e.secretTokens(ctx, t, key); now.rv != sec.rv || now.next != "" {
			t.Errorf("the refused reattach changed the Secret (staged %v, rotated %v)", now.next != "", now.rotated)
		}
		if err := dialInfo(ctx, t, p, cur, token); err != nil {
			t.Errorf("the daemon no longer takes its token: %v", err)
		}
	}

	// Unclaimed: still in the pool afterwards.
	refused("guard-1", &warm[0], before, before.token)
	if left, _, err := p.poolPods(ctx, "guard"); err != nil || len(left) != 1 || left[0].Name != warm[0].Name {
		t.Fatalf("the pool lost its pod: %d unclaimed, %v", len(left), err)
	}

	// Claimed by guard-1: guard-2's hand-made state is refused.
	sb, err := claimFrom(ctx, p, "guard", "guard-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.deleteSandbox(ctx, sb.state, false); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	_ = sb.Close()
	if sb.state.Key != key {
		t.Fatalf("claimed %s, not the pool's pod %s", sb.state.Pod, warm[0].Name)
	}
	claimed, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, sb.state.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	settled := e.secretTokens(ctx, t, key)
	refused("guard-2", claimed, settled, settled.token)

	raw, err := sb.State()
	if err != nil {
		t.Fatal(err)
	}
	own, err := e.provider(t, cfg).Reattach(ctx, compute.LaunchSpec{SessionID: "guard-1"}, raw)
	if err != nil {
		t.Fatalf("the claimer's own state: %v", err)
	}
	defer own.Close()
	if _, err := own.Agent().Info(ctx); err != nil {
		t.Fatal(err)
	}
}
