package kubernetes

// Harness processes for real: the tests here re-execute their own test
// binary as child processes (TestClaimChildProcess in child mode), each
// of which builds its own Provider from the harness ServiceAccount's
// kubeconfig and claims from a warm pool, sharing nothing with the
// parent or each other but the API server.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// childEnv holds a child's childSpec (JSON); set, it puts the test binary
// in child mode.
const childEnv = "BULKHEAD_KUBE_CLAIM_CHILD"

// What a child prints on its stdout, one line each.
const (
	childReady        = "CHILD-READY"   // its provider is built; it waits for a line on stdin
	childResultPrefix = "CHILD-RESULT " // + childResult JSON, one per session
	childCrashPrefix  = "CHILD-CRASH "  // + childCrash JSON, then it exits with childCrashExit
	childCrashExit    = 7
)

// childSpec tells a child what to do.
type childSpec struct {
	Kubeconfig, Namespace, NodeIP, RunLabel string
	Pools                                   []Pool
	// Pool is the pool every session claims from.
	Pool string
	// Sessions are created at once, each on its own goroutine.
	Sessions []string
	// CrashAt, when set, makes the child exit (no cleanup, as a crash
	// would) when a claim's token rotation reaches that step.
	CrashAt rotateStep
}

// childResult is one session a child created.
type childResult struct {
	Session, Pod, Pool string
	State              json.RawMessage // the provider's state
	Took               time.Duration   // Create to the first exec's exit
	Err                string
}

// childCrash is where a child stopped.
type childCrash struct {
	Step  rotateStep
	State json.RawMessage
}

// TestClaimChildProcess is the child mode of the tests that run harness
// processes (see childSpec); run on its own, without childEnv, it has
// nothing to do and passes.
func TestClaimChildProcess(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("child spec: %v", err)
	}
	testRun.label = spec.RunLabel
	e := &kubeEnv{c: &kubeserver.Cluster{NodeIP: spec.NodeIP}, ns: spec.Namespace, kubeconfig: spec.Kubeconfig}
	cfg := e.config(ConnectPortForward)
	cfg.Pools = spec.Pools
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	p, err := NewFromKubeconfig(cfg, spec.Kubeconfig, log)
	if err != nil {
		t.Fatal(err)
	}
	c := compute.NewClient(p, compute.ClientOptions{Log: log})

	var outMu sync.Mutex
	emit := func(prefix string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Errorf("child output: %v", err)
			return
		}
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, "%s%s\n", prefix, b)
	}
	fmt.Fprintln(os.Stdout, childReady)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("waiting for the go line: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if spec.CrashAt != "" {
		ctx = withRotateHook(ctx, func(step rotateStep, st State) {
			if step != spec.CrashAt {
				return
			}
			raw, err := st.encode()
			if err != nil {
				t.Errorf("state: %v", err)
			}
			emit(childCrashPrefix, childCrash{Step: step, State: raw})
			os.Exit(childCrashExit) // no deferred cleanup, no Close: a crash
		})
	}
	var wg sync.WaitGroup
	for _, id := range spec.Sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := childResult{Session: id}
			t0 := time.Now()
			err := func() error {
				s, err := c.Create(ctx, compute.CreateOptions{SessionID: id, ProviderOptions: &CreateOptions{Pool: spec.Pool}})
				if err != nil {
					return err
				}
				defer s.Release() //nolint:errcheck // the sandbox stays for the parent
				raw, err := s.State()
				if err != nil {
					return err
				}
				st, err := DecodeState(raw.ProviderState)
				if err != nil {
					return err
				}
				res.Pod, res.Pool, res.State = st.Pod, st.Pool, raw.ProviderState
				if err := s.Start(ctx); err != nil {
					return err
				}
				out, err := s.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo " + id}, compute.ExecOptions{}, nil)
				if err != nil {
					return err
				}
				res.Took = time.Since(t0)
				if got := strings.TrimSpace(string(out.Stdout)); got != id {
					return fmt.Errorf("exec in %s printed %q", id, got)
				}
				return nil
			}()
			if err != nil {
				res.Err = err.Error()
			}
			emit(childResultPrefix, res)
		}()
	}
	wg.Wait()
}

// childSpec is a child's spec for this test's namespace.
func (e *kubeEnv) childSpec(pools []Pool, pool string, sessions ...string) childSpec {
	return childSpec{Kubeconfig: e.kubeconfig, Namespace: e.ns, NodeIP: e.c.NodeIP, RunLabel: testRun.label,
		Pools: pools, Pool: pool, Sessions: sessions}
}

// child is a running child process.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *syncbuf.Buffer // stdout and stderr, for the failure log
	ready chan struct{}   // closed at childReady
	done  chan struct{}   // closed when stdout ends

	results []childResult
	crash   *childCrash
	bad     []string // prefixed lines that did not parse
}

// startChild starts the test binary in child mode with spec. Its output
// is logged if the test fails; it is killed when the test ends, if still
// running.
func startChild(ctx context.Context, t *testing.T, name string, spec childSpec) *child {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestClaimChildProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	ch := &child{name: name, cmd: cmd, out: &syncbuf.Buffer{}, ready: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = ch.out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if ch.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting child %s: %v", name, err)
	}
	go func() {
		defer close(ch.done)
		readyOnce := sync.OnceFunc(func() { close(ch.ready) })
		defer readyOnce()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(ch.out, line)
			switch {
			case line == childReady:
				readyOnce()
			case strings.HasPrefix(line, childResultPrefix):
				var r childResult
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, childResultPrefix)), &r); err != nil {
					ch.bad = append(ch.bad, line)
					continue
				}
				ch.results = append(ch.results, r)
			case strings.HasPrefix(line, childCrashPrefix):
				var c childCrash
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, childCrashPrefix)), &c); err != nil {
					ch.bad = append(ch.bad, line)
					continue
				}
				ch.crash = &c
			}
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("child %s output:\n%s", name, ch.out.String())
		}
	})
	return ch
}

// wait waits for the child to exit and returns its exit code.
func (ch *child) wait(t *testing.T) int {
	t.Helper()
	<-ch.done
	err := ch.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
	default:
		t.Fatalf("child %s: %v", ch.name, err)
	}
	if len(ch.bad) > 0 {
		t.Errorf("child %s printed unreadable lines: %q", ch.name, ch.bad)
	}
	return ch.cmd.ProcessState.ExitCode()
}

// goAll waits until every child is ready, then lets them all go at once.
func goAll(t *testing.T, children ...*child) {
	t.Helper()
	for _, ch := range children {
		select {
		case <-ch.ready:
		case <-ch.done:
		}
	}
	for _, ch := range children {
		if _, err := io.WriteString(ch.stdin, "go\n"); err != nil {
			t.Fatalf("child %s did not get ready: %v\n%s", ch.name, err, ch.out.String())
		}
	}
}

// dialInfo calls Info on the daemon of pod with token.
func dialInfo(ctx context.Context, t *testing.T, p *Provider, pod *corev1.Pod, token string) error {
	t.Helper()
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

// secretTokens reads a sandbox Secret's token, staged token and rotated
// mark.
func (e *kubeEnv) secretTokens(ctx context.Context, t *testing.T, key string) tokenSecret {
	t.Helper()
	sec, err := e.admin.CoreV1().Secrets(e.ns).Get(ctx, secretName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return readTokenSecret(sec)
}

// TestWarmPoolClaimsAcrossProcesses: two harness processes (child
// processes of this test, each with its own Provider and API client) claim
// from one warm pool at the same moment, more sessions than the pool
// holds. No Pod is claimed twice; every warm Pod goes to exactly one
// session, the others are created cold; every sandbox answers with its
// own session token and refuses another sandbox's token and its own pool
// token; and this process reattaches to each.
func TestWarmPoolClaimsAcrossProcesses(t *testing.T) {
	e := newKubeEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const size, perChild = 3, 3
	cfg := e.config(ConnectPortForward)
	cfg.Pools = []Pool{{Name: "warm", Size: size}}
	p := e.provider(t, cfg)
	warm := readyPool(ctx, t, p, "warm", size)
	poolToken := map[string]string{} // pod -> the token it was created with
	for i := range warm {
		poolToken[warm[i].Name] = e.secretTokens(ctx, t, warm[i].Labels[LabelKey]).token
	}

	var children []*child
	for i := range 2 {
		var ids []string
		for j := range perChild {
			ids = append(ids, fmt.Sprintf("proc%d-%d", i, j))
		}
		children = append(children, startChild(ctx, t, fmt.Sprintf("proc%d", i), e.childSpec(cfg.Pools, "warm", ids...)))
	}
	goAll(t, children...)

	claimedBy := map[string]string{} // pod -> session
	var all []childResult
	for _, ch := range children {
		if code := ch.wait(t); code != 0 {
			t.Errorf("child %s exited %d", ch.name, code)
		}
		if len(ch.results) != perChild {
			t.Errorf("child %s reported %d sessions, want %d", ch.name, len(ch.results), perChild)
		}
		for _, r := range ch.results {
			if r.State != nil {
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					if err := p.Destroy(ctx, r.State); err != nil {
						t.Errorf("destroy %s: %v", r.Session, err)
					}
				})
			}
			if r.Err != "" {
				t.Errorf("%s (%s): %s", r.Session, ch.name, r.Err)
				continue
			}
			if other, dup := claimedBy[r.Pod]; dup {
				t.Errorf("pod %s claimed by %s and %s", r.Pod, other, r.Session)
			}
			claimedBy[r.Pod] = r.Session
			all = append(all, r)
			t.Logf("%s: pod %s (pool %q): create to first exec %s", r.Session, r.Pod, r.Pool, r.Took.Round(time.Millisecond))
		}
	}
	if t.Failed() {
		return
	}
	warmClaims := 0
	for _, r := range all {
		if r.Pool == "warm" {
			warmClaims++
			if _, ok := poolToken[r.Pod]; !ok {
				t.Errorf("%s claimed %s, not one of the pool's pods", r.Session, r.Pod)
			}
		}
	}
	if warmClaims != size {
		t.Errorf("%d sessions got warm pods, want %d (the pool's size)", warmClaims, size)
	}

	// Each sandbox answers to its own token only, and this process (a
	// third harness) reattaches to it as its session.
	tokens := make([]string, len(all))
	pods := make([]*corev1.Pod, len(all))
	for i, r := range all {
		pod, err := e.admin.CoreV1().Pods(e.ns).Get(ctx, r.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Annotations[AnnotationSession] != r.Session {
			t.Errorf("pod %s names session %q, claimed by %s", r.Pod, pod.Annotations[AnnotationSession], r.Session)
		}
		pods[i] = pod
		ts := e.secretTokens(ctx, t, pod.Labels[LabelKey])
		if ts.next != "" {
			t.Errorf("pod %s: a staged token is left in its Secret", r.Pod)
		}
		if r.Pool != "" && !ts.rotated {
			t.Errorf("pod %s: its Secret is not marked rotated", r.Pod)
		}
		tokens[i] = ts.token
	}
	for i, r := range all {
		if err := dialInfo(ctx, t, p, pods[i], tokens[i]); err != nil {
			t.Errorf("%s: its own token: %v", r.Session, err)
		}
		other := tokens[(i+1)%len(all)]
		if err := dialInfo(ctx, t, p, pods[i], other); !errors.Is(err, errkind.ErrUnauthenticated) {
			t.Errorf("%s: another sandbox's token: want unauthenticated, got %v", r.Session, err)
		}
		if pt, ok := poolToken[r.Pod]; ok {
			if tokens[i] == pt {
				t.Errorf("%s: its Secret still holds the pool token", r.Session)
			}
			if err := dialInfo(ctx, t, p, pods[i], pt); !errors.Is(err, errkind.ErrUnauthenticated) {
				t.Errorf("%s: its pool token: want unauthenticated, got %v", r.Session, err)
			}
		}
		sb, err := p.Reattach(ctx, compute.LaunchSpec{SessionID: r.Session}, r.State)
		if err != nil {
			t.Errorf("%s: reattach: %v", r.Session, err)
			continue
		}
		out, err := sb.Agent().Exec(ctx, compute.ProcessSpec{Command: "echo again " + r.Session}, compute.ExecOptions{}, nil)
		if err != nil || strings.TrimSpace(string(out.Stdout)) != "again "+r.Session {
			t.Errorf("%s: exec after reattaching: %v %v", r.Session, out, err)
		}
		_ = sb.Close()
	}
}
