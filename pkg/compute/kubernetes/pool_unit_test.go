package kubernetes

// Warm pool claims at the unit level: the fake clientset holds the pool's
// Pods and Secrets (with a reactor that gives Secrets the resourceVersion
// checks of a real API server), and the daemons are real gRPC servers on
// loopback, reached as the Pods' IP. The same paths run against a real
// cluster in rotate_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// strictSecretVersions makes the fake clientset treat Secret patches as
// the API server does: a patch naming a resourceVersion the Secret has
// moved past is a conflict, and every patch gives the Secret a new
// resourceVersion (the fake's tracker does neither).
func strictSecretVersions(cs *fake.Clientset) {
	gvr := corev1.SchemeGroupVersion.WithResource("secrets")
	var version atomic.Int64
	version.Store(100)
	cs.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		cur, err := cs.Tracker().Get(gvr, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return false, nil, nil // the tracker answers not found
		}
		var named struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &named); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		if rv := named.Metadata.ResourceVersion; rv != "" && rv != cur.(*corev1.Secret).ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), pa.GetName(), errors.New("the object has been modified"))
		}
		_, obj, err := k8stesting.ObjectReaction(cs.Tracker())(a)
		if err != nil {
			return true, nil, err
		}
		sec := obj.(*corev1.Secret).DeepCopy()
		sec.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		if err := cs.Tracker().Update(gvr, sec, pa.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, sec, nil
	})
}

// warmPod is an unclaimed, ready Pod of pool running image at ip, and its
// Secret holding token.
func warmPod(key, pool, image, ip, token string) (*corev1.Pod, *corev1.Secret) {
	labels := map[string]string{LabelSandbox: "1", LabelKey: key, LabelPool: pool, LabelClaimed: "false"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(key), Namespace: "ns", Labels: labels,
			Annotations: map[string]string{AnnotationWorkspace: manifest.DefaultRoot}, CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: image}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Namespace: "ns", Labels: labels, ResourceVersion: "1"},
		Data:       map[string][]byte{tokenKey: []byte(token)},
	}
	return pod, sec
}

// oldSystem is the SystemService of a daemon from before RotateToken.
type oldSystem struct {
	agentdv1.UnimplementedSystemServiceServer
}

func (oldSystem) Info(context.Context, *agentdv1.InfoRequest) (*agentdv1.InfoResponse, error) {
	return &agentdv1.InfoResponse{}, nil
}

// oldDaemon serves health and an oldSystem on 127.0.0.1 and returns its
// port.
func oldDaemon(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	agentdv1.RegisterSystemServiceServer(gs, oldSystem{})
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	return l.Addr().(*net.TCPAddr).Port
}

// testClock is a clock the test moves.
type testClock struct{ off atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *testClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// observedProvider is a provider over cs whose logs are kept (and shown
// from Warn on).
func observedProvider(t *testing.T, cfg Config, cs *fake.Clientset) (*Provider, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core()))
	if cfg.Namespace == "" {
		cfg.Namespace = "ns"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	p, err := NewWithClient(cfg, clientGo(cs), nil, log)
	if err != nil {
		t.Fatal(err)
	}
	return p, logs
}

// claimFrom claims from the pool as Launch does for a session whose
// manifest the pool's template serves.
func claimFrom(ctx context.Context, p *Provider, pool, session string) (*sandbox, error) {
	pl, _ := p.cfg.pool(pool)
	return p.claim(ctx, pool, compute.LaunchSpec{SessionID: session}, pl.Template.WorkspaceRoot, pl.Template.RunAs)
}

func tooOldLogs(logs *observer.ObservedLogs) []observer.LoggedEntry {
	return logs.FilterLevelExact(zap.ErrorLevel).FilterMessageSnippet("predates SystemService.RotateToken").All()
}

// podUpdates counts the claims written (Pod updates) since the last
// ClearActions.
func podUpdates(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

func unclaimed(ctx context.Context, t *testing.T, p *Provider, pool string) []corev1.Pod {
	t.Helper()
	pods, _, err := p.poolPods(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

// TestOldDaemonPoolIsHeldBack: once a claim finds that the pool's image
// has a daemon without RotateToken, the pool is held back for
// Config.PoolCooldown: Creates claim nothing from it (its other Pods stay
// unclaimed and unwasted), its refill creates nothing, and one Error log
// says so for the whole cooldown. After the cooldown a claim tries the
// pool again, and a still old daemon starts another cooldown, with its
// own log line.
func TestOldDaemonPoolIsHeldBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	port := oldDaemon(t)
	const image = "bulkhead/sandbox:old"
	var objs []runtime.Object
	for _, key := range []string{"0000000000000001", "0000000000000002", "0000000000000003"} {
		pod, sec := warmPod(key, "old", image, "127.0.0.1", mustHex(t))
		objs = append(objs, pod, sec)
	}
	cs := fake.NewClientset(objs...)
	cfg := Config{Connect: ConnectPodIP, Port: port, NetworkPolicy: new(bool), PoolCooldown: 10 * time.Minute,
		Pools: []Pool{{Name: "old", Size: 3, Template: PoolTemplate{Options: CreateOptions{Image: image}}}}}
	p, logs := observedProvider(t, cfg, cs)
	var clock testClock
	p.now = clock.now

	// The first claim finds out: the claimed Pod is deleted, the session
	// goes cold.
	if _, err := claimFrom(ctx, p, "old", "s1"); !errors.Is(err, errNoWarmPod) || !errors.Is(err, compute.ErrUnimplemented) {
		t.Fatalf("claim from the old pool: want no warm pod (unimplemented), got %v", err)
	}
	if got := unclaimed(ctx, t, p, "old"); len(got) != 2 {
		t.Fatalf("after the failed claim: %d unclaimed pods, want 2", len(got))
	}
	if n := len(tooOldLogs(logs)); n != 1 {
		t.Fatalf("%d error logs after the first claim, want 1", n)
	}
	entry := tooOldLogs(logs)[0].ContextMap()
	if entry["pool"] != "old" || entry["image"] != image || entry["until"] == nil {
		t.Errorf("the error log does not name the pool, the image and the cooldown's end: %v", entry)
	}

	// Held back: Creates claim nothing, the refill makes nothing, and
	// nothing more is logged at Error.
	cs.ClearActions()
	for i := range 3 {
		_, err := claimFrom(ctx, p, "old", "s-held-"+strconv.Itoa(i))
		if !errors.Is(err, errNoWarmPod) || !strings.Contains(err.Error(), "held back") {
			t.Fatalf("claim %d while held back: %v", i, err)
		}
	}
	if n, err := p.FillPool(ctx, "old"); n != 0 || err != nil {
		t.Fatalf("refill while held back: made %d, %v", n, err)
	}
	if n := podUpdates(cs); n != 0 {
		t.Errorf("%d claims written while held back", n)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" {
			t.Errorf("created a %s while held back", a.GetResource().Resource)
		}
	}
	if got := unclaimed(ctx, t, p, "old"); len(got) != 2 {
		t.Errorf("while held back: %d unclaimed pods, want the 2 left", len(got))
	}
	if n := len(tooOldLogs(logs)); n != 1 {
		t.Errorf("%d error logs during one cooldown, want 1", n)
	}

	// After the cooldown: one claim tries again; the daemon is still old.
	clock.advance(cfg.PoolCooldown + time.Second)
	cs.ClearActions()
	if _, err := claimFrom(ctx, p, "old", "s2"); !errors.Is(err, compute.ErrUnimplemented) {
		t.Fatalf("the claim after the cooldown did not try the pool: %v", err)
	}
	if n := podUpdates(cs); n != 1 {
		t.Errorf("%d claims written after the cooldown, want 1", n)
	}
	if got := unclaimed(ctx, t, p, "old"); len(got) != 1 {
		t.Errorf("after the second failed claim: %d unclaimed pods, want 1", len(got))
	}
	if n := len(tooOldLogs(logs)); n != 2 {
		t.Errorf("%d error logs after two cooldowns, want 2", n)
	}
	if n := logs.FilterMessageSnippet("cooldown is over").Len(); n != 1 {
		t.Errorf("%d logs saying the cooldown ended, want 1", n)
	}
	if _, err := claimFrom(ctx, p, "old", "s3"); !errors.Is(err, errNoWarmPod) || !strings.Contains(err.Error(), "held back") {
		t.Errorf("the second cooldown does not hold the pool back: %v", err)
	}

	// Ended, the refill makes Pods again.
	clock.advance(cfg.PoolCooldown + time.Second)
	if n, err := p.FillPool(ctx, "old"); n != 2 || err != nil {
		t.Errorf("refill after the cooldown: made %d, %v; want 2", n, err)
	}
}

// TestPoolCooldownHoldsBackOnlyTheOldImage: a pool whose template names
// another image than the one whose daemon was found too old (a Pod left
// by an older configuration) is not held back: it is refilled and
// claimed from, and only the Pods of the old image are passed over.
func TestPoolCooldownHoldsBackOnlyTheOldImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	port := oldDaemon(t)
	const oldImage, newImage = "bulkhead/sandbox:old", "bulkhead/sandbox:new"
	pod1, sec1 := warmPod("0000000000000001", "warm", oldImage, "127.0.0.1", mustHex(t))
	pod2, sec2 := warmPod("0000000000000002", "warm", oldImage, "127.0.0.1", mustHex(t))
	pod2.CreationTimestamp = metav1.NewTime(pod1.CreationTimestamp.Add(time.Second))
	cs := fake.NewClientset(pod1, sec1, pod2, sec2)
	cfg := Config{Connect: ConnectPodIP, Port: port, NetworkPolicy: new(bool),
		Pools: []Pool{{Name: "warm", Size: 2, Template: PoolTemplate{Options: CreateOptions{Image: newImage}}}}}
	p, logs := observedProvider(t, cfg, cs)

	if _, err := claimFrom(ctx, p, "warm", "s1"); !errors.Is(err, compute.ErrUnimplemented) {
		t.Fatalf("claiming the old pod: %v", err)
	}
	if n := len(tooOldLogs(logs)); n != 1 {
		t.Fatalf("%d error logs, want 1", n)
	}
	cs.ClearActions()
	_, err := claimFrom(ctx, p, "warm", "s2")
	if !errors.Is(err, errNoWarmPod) || strings.Contains(err.Error(), "held back") {
		t.Fatalf("a pool of another image is held back: %v", err)
	}
	if n := podUpdates(cs); n != 0 {
		t.Errorf("claimed the other pod of the old image (%d claims)", n)
	}
	if n, err := p.FillPool(ctx, "warm"); n != 1 || err != nil {
		t.Errorf("refill of a pool of another image: made %d, %v; want 1", n, err)
	}
	if p.cfg.PoolCooldown != DefaultPoolCooldown {
		t.Errorf("default cooldown %s, want %s", p.cfg.PoolCooldown, DefaultPoolCooldown)
	}
	if _, err := NewWithClient(Config{PoolCooldown: -time.Second}, clientGo(fake.NewClientset()), nil, nil); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("a negative cooldown: %v", err)
	}
}

// TestClaimRacingAReattach: a Reattach of a just-claimed Pod's state (a
// listed sandbox, another harness process resuming the session) that runs
// while the claimer is between its steps finishes the rotation itself;
// the claimer then finds the token moved under it. Neither gives up the
// Pod: the claim hands out the Pod it claimed, the Reattach its sandbox,
// both work with the token the Secret settles on, and the pool token is
// refused. Each interleaving is driven with the rotation hooks:
//
//   - before staging: the reattach stages and rotates first, so the
//     claimer's staging conflicts and its pool token is refused;
//   - after staging: the reattach rotates the daemon to the claimer's
//     staged token, so the claimer's RotateToken is refused;
//   - under the reattach: the claimer rotates between the reattach's
//     connection and its RotateToken, so the reattach's is refused while
//     the Secret has not moved yet.
func TestClaimRacingAReattach(t *testing.T) {
	type reattachFunc func(context.Context, State) (compute.Sandbox, error)
	type result struct {
		sb  compute.Sandbox
		err error
	}
	// reattachAt runs the whole Reattach when the claimer reaches step.
	reattachAt := func(step rotateStep) func(context.Context, reattachFunc) (map[rotateStep]func(State), <-chan result) {
		return func(ctx context.Context, reattach reattachFunc) (map[rotateStep]func(State), <-chan result) {
			done := make(chan result, 1)
			return map[rotateStep]func(State){step: func(st State) {
				sb, err := reattach(ctx, st)
				done <- result{sb, err}
			}}, done
		}
	}
	cases := []struct {
		name string
		// race returns the claimer's hooks (each runs at the first time
		// its step is reached), which run the other process's Reattach
		// somewhere inside the claimer's rotation, and the reattach's
		// outcome.
		race func(ctx context.Context, reattach reattachFunc) (map[rotateStep]func(State), <-chan result)
	}{
		{name: "before staging", race: reattachAt(stepClaimed)},
		{name: "after staging", race: reattachAt(stepStaged)},
		{name: "under the reattach", race: func(ctx context.Context, reattach reattachFunc) (map[rotateStep]func(State), <-chan result) {
			attached, resume, done, out := make(chan struct{}), make(chan struct{}), make(chan result, 1), make(chan result, 1)
			var once sync.Once
			return map[rotateStep]func(State){
				stepStaged: func(st State) {
					// The reattach connects with the pool token and stops
					// before settling.
					rctx := withRotateHook(ctx, func(step rotateStep, _ State) {
						if step == stepAttached {
							once.Do(func() {
								close(attached)
								<-resume
							})
						}
					})
					go func() {
						sb, err := reattach(rctx, st)
						done <- result{sb, err}
					}()
					select {
					case <-attached:
					case r := <-done:
						done <- r // it ended without connecting
					}
				},
				stepRotated: func(State) {
					// The claimer's RotateToken went first; the reattach
					// goes on, and ends before the claimer promotes.
					close(resume)
					out <- <-done
				},
			}, out
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			poolToken := mustHex(t)
			port := tcpDaemon(t, poolToken)
			const key = "00112233aabbccdd"
			pod, sec := warmPod(key, "warm", DefaultImage, "127.0.0.1", poolToken)
			cs := fake.NewClientset(pod, sec)
			strictSecretVersions(cs)
			cfg := Config{Connect: ConnectPodIP, Port: port, NetworkPolicy: new(bool), Pools: []Pool{{Name: "warm", Size: 1}}}
			claimer, _ := observedProvider(t, cfg, cs)
			other, _ := observedProvider(t, cfg, cs)

			reattach := func(ctx context.Context, st State) (compute.Sandbox, error) {
				raw, err := st.encode()
				if err != nil {
					return nil, err
				}
				return other.Reattach(ctx, compute.LaunchSpec{SessionID: st.SessionID}, raw)
			}
			hooks, reattached := tc.race(ctx, reattach)
			ran := map[rotateStep]bool{}
			hook := func(step rotateStep, st State) {
				if h := hooks[step]; h != nil && !ran[step] {
					ran[step] = true
					h(st)
				}
			}
			sb, err := claimFrom(withRotateHook(ctx, hook), claimer, "warm", "s1")
			if err != nil {
				t.Fatalf("the claim lost its pod to the reattach: %v", err)
			}
			defer sb.Close()
			var r result
			select {
			case r = <-reattached:
			case <-ctx.Done():
				t.Fatal("the reattach did not run inside the claim")
			}
			if r.err != nil {
				t.Fatalf("the reattach racing the claim: %v", r.err)
			}
			defer r.sb.Close()
			rsb := r.sb

			if sb.state.Key != key || sb.WorkspaceKept() {
				t.Errorf("the claim handed out %s (workspace kept %v), want the fresh pool pod %s", sb.state.Pod, sb.WorkspaceKept(), pod.Name)
			}
			if _, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
				t.Fatalf("the claimed pod: %v", err)
			}
			for who, s := range map[string]compute.Sandbox{"claim": sb, "reattach": rsb} {
				if _, err := s.Agent().Info(ctx); err != nil {
					t.Errorf("the %s's sandbox: %v", who, err)
				}
			}
			sb.waitPromoted() // a claim's promotion runs after it returned
			got, err := cs.CoreV1().Secrets("ns").Get(ctx, secretName(key), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ts := readTokenSecret(got)
			if ts.next != "" || !ts.rotated || ts.token == poolToken {
				t.Errorf("the Secret is not settled: staged %v, rotated %v, pool token kept %v", ts.next != "", ts.rotated, ts.token == poolToken)
			}
			dial := func(token string) error { return infoWithToken(ctx, t, port, token) }
			if err := dial(ts.token); err != nil {
				t.Errorf("the Secret's token: %v", err)
			}
			if err := dial(poolToken); !errors.Is(err, compute.ErrUnauthenticated) {
				t.Errorf("the pool token: want unauthenticated, got %v", err)
			}
		})
	}
}

// TestReattachRefusesAPodNotClaimedForIt: a hand-made state naming a warm
// pool Pod that no claim gave its session (an unclaimed one, still on its
// pool token, or one claimed by another session) is refused with
// ErrInvalidArgument (not ErrNotFound, on which Client.Resume would
// launch a replacement that deletes the Pod), and the refusal changes
// nothing: only the Pod is read, its Secret is not staged or rotated, and
// the daemon still takes the pool token. A Pod claimed for the state's
// session is reattached to, with or without the caller naming the session.
func TestReattachRefusesAPodNotClaimedForIt(t *testing.T) {
	const key = "00112233aabbccdd"
	cases := []struct {
		name string
		// claimedFor: the session the Pod's claim wrote ("" with claimed:
		// no session recorded); claimed: LabelClaimed "true".
		claimedFor      string
		claimed         bool
		state, caller   string // the state's session id, the caller's
		wantAttached    bool
		wantErrContains string
	}{
		{name: "unclaimed", state: "s1", caller: "s1", wantErrContains: "unclaimed pod"},
		{name: "unclaimed, no session", wantErrContains: "unclaimed pod"},
		{name: "claimed by another session", claimed: true, claimedFor: "other", state: "s1", caller: "s1", wantErrContains: `not claimed for session "s1"`},
		{name: "claimed by another session, caller names none", claimed: true, claimedFor: "other", state: "s1", wantErrContains: `not claimed for session "s1"`},
		{name: "state of another session than the caller's", claimed: true, claimedFor: "s1", state: "s1", caller: "s2", wantErrContains: `not claimed for session "s2"`},
		{name: "claimed for no session", claimed: true, wantErrContains: `not claimed for session ""`},
		{name: "claimed for it", claimed: true, claimedFor: "s1", state: "s1", caller: "s1", wantAttached: true},
		{name: "claimed for it, caller names none", claimed: true, claimedFor: "s1", state: "s1", wantAttached: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			poolToken := mustHex(t)
			port := tcpDaemon(t, poolToken)
			pod, sec := warmPod(key, "warm", DefaultImage, "127.0.0.1", poolToken)
			if tc.claimed {
				pod.Labels[LabelClaimed] = "true"
				if tc.claimedFor != "" {
					pod.Labels[LabelSession] = sessionLabel(tc.claimedFor)
					pod.Annotations[AnnotationSession] = tc.claimedFor
				}
			}
			cs := fake.NewClientset(pod, sec)
			strictSecretVersions(cs)
			p, _ := observedProvider(t, Config{Connect: ConnectPodIP, Port: port, NetworkPolicy: new(bool), Pools: []Pool{{Name: "warm", Size: 1}}}, cs)
			st := stateOf(pod)
			st.SessionID = tc.state // hand-made
			raw, err := st.encode()
			if err != nil {
				t.Fatal(err)
			}

			cs.ClearActions()
			sb, err := p.Reattach(ctx, compute.LaunchSpec{SessionID: tc.caller}, raw)
			if tc.wantAttached {
				if err != nil {
					t.Fatalf("reattach to a pod claimed for the session: %v", err)
				}
				defer sb.Close()
				if _, err := sb.Agent().Info(ctx); err != nil {
					t.Fatalf("the reattached sandbox: %v", err)
				}
				return
			}
			if err == nil {
				_ = sb.Close()
				t.Fatalf("reattached to a pod not claimed for session %q", tc.state)
			}
			if !errors.Is(err, compute.ErrInvalidArgument) || errors.Is(err, compute.ErrNotFound) || !strings.Contains(err.Error(), tc.wantErrContains) {
				t.Fatalf("want invalid argument saying %q, got %v", tc.wantErrContains, err)
			}
			for _, a := range cs.Actions() {
				if a.GetVerb() != "get" || a.GetResource().Resource != "pods" {
					t.Errorf("a refused reattach did %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
			gotPod, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(gotPod.Labels, pod.Labels) || !maps.Equal(gotPod.Annotations, pod.Annotations) {
				t.Errorf("the pod's labels or annotations changed: %v %v", gotPod.Labels, gotPod.Annotations)
			}
			gotSec, err := cs.CoreV1().Secrets("ns").Get(ctx, sec.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ts := readTokenSecret(gotSec); ts.token != poolToken || ts.next != "" || ts.rotated || ts.rv != sec.ResourceVersion {
				t.Errorf("the Secret changed: staged %v, rotated %v, token kept %v", ts.next != "", ts.rotated, ts.token == poolToken)
			}
			if err := infoWithToken(ctx, t, port, poolToken); err != nil {
				t.Errorf("the daemon no longer takes the pool token: %v", err)
			}
		})
	}
}

// guardCase is a pool Pod as a hand-made state may find it, and the
// sessions of the state and of the caller.
type guardCase struct {
	name string
	// claimedFor: the session the Pod's claim wrote ("" with claimed: no
	// session recorded); claimed: LabelClaimed "true".
	claimedFor      string
	claimed         bool
	state, caller   string // the state's session id, the caller's
	wantErrContains string // "" when the Pod is the state's to delete
}

// guardedPoolPod is the pool Pod (with its Secret) of a guardCase.
func guardedPoolPod(key string, tc guardCase) (*corev1.Pod, *corev1.Secret) {
	pod, sec := warmPod(key, "warm", DefaultImage, "127.0.0.1", "pool-token")
	pod.UID = types.UID("uid-" + key)
	if tc.claimed {
		pod.Labels[LabelClaimed] = "true"
		if tc.claimedFor != "" {
			pod.Labels[LabelSession] = sessionLabel(tc.claimedFor)
			pod.Annotations[AnnotationSession] = tc.claimedFor
		}
	}
	return pod, sec
}

// handMadeState is the state of pod with its session id set to session.
func handMadeState(t *testing.T, pod *corev1.Pod, session string) json.RawMessage {
	t.Helper()
	st := stateOf(pod)
	st.SessionID = session
	raw, err := st.encode()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// checkDeleted checks that pod and its Secret are gone; what names them
// in the errors ("the destroyed pod").
func checkDeleted(ctx context.Context, t *testing.T, cs *fake.Clientset, what string, pod *corev1.Pod, sec *corev1.Secret) {
	t.Helper()
	if _, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s: %v", what, err)
	}
	if _, err := cs.CoreV1().Secrets("ns").Get(ctx, sec.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s's Secret: %v", what, err)
	}
}

// checkRefusedUntouched checks a refusal: ErrInvalidArgument (not
// ErrNotFound) saying want and naming the Pod, after nothing but the Pod's
// read, and the Pod and its Secret as they were.
func checkRefusedUntouched(ctx context.Context, t *testing.T, cs *fake.Clientset, err error, want string, pod *corev1.Pod, sec *corev1.Secret) {
	t.Helper()
	if err == nil {
		t.Fatalf("a pod not claimed or created for the state's session was accepted")
	}
	if !errors.Is(err, compute.ErrInvalidArgument) || errors.Is(err, compute.ErrNotFound) ||
		!strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "pod "+pod.Name) {
		t.Fatalf("want invalid argument naming pod %s and saying %q, got %v", pod.Name, want, err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" || a.GetResource().Resource != "pods" {
			t.Errorf("a refusal did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	gotPod, err := cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the refused pod: %v", err)
	}
	if gotPod.UID != pod.UID || !maps.Equal(gotPod.Labels, pod.Labels) || !maps.Equal(gotPod.Annotations, pod.Annotations) {
		t.Errorf("the pod changed: %v %v", gotPod.Labels, gotPod.Annotations)
	}
	gotSec, err := cs.CoreV1().Secrets("ns").Get(ctx, sec.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the refused pod's Secret: %v", err)
	}
	if gotSec.ResourceVersion != sec.ResourceVersion || !maps.Equal(gotSec.Annotations, sec.Annotations) {
		t.Errorf("the Secret changed")
	}
}

// TestDestroyRefusesAPoolPodNotClaimedForIt: Destroy of a hand-made state
// naming a warm pool Pod that no claim gave the state's session
// (unclaimed: someone may still claim it; claimed by another session:
// that session's sandbox) is refused with ErrInvalidArgument after the
// Pod's read, and the Pod and its Secret are left as they were. A Pod
// claimed for the state's session is destroyed, Secret and all.
func TestDestroyRefusesAPoolPodNotClaimedForIt(t *testing.T) {
	const key = "00112233aabbccdd"
	for _, tc := range []guardCase{
		{name: "unclaimed", state: "s1", wantErrContains: "unclaimed pod of warm pool warm"},
		{name: "unclaimed, no session", wantErrContains: "unclaimed pod of warm pool warm"},
		{name: "claimed by another session", claimed: true, claimedFor: "other", state: "s1", wantErrContains: `not claimed for session "s1" (it was claimed by another session; refusing to destroy it)`},
		{name: "claimed for no session", claimed: true, state: "s1", wantErrContains: `not claimed for session "s1" (its claim records no session`},
		{name: "claimed for it", claimed: true, claimedFor: "s1", state: "s1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pod, sec := guardedPoolPod(key, tc)
			cs := fake.NewClientset(pod, sec)
			p, _ := observedProvider(t, Config{NetworkPolicy: new(bool), Pools: []Pool{{Name: "warm", Size: 1}}}, cs)
			raw := handMadeState(t, pod, tc.state)

			cs.ClearActions()
			err := p.Destroy(ctx, raw)
			if tc.wantErrContains != "" {
				checkRefusedUntouched(ctx, t, cs, err, tc.wantErrContains, pod, sec)
				if left := unclaimed(ctx, t, p, "warm"); !tc.claimed && len(left) != 1 {
					t.Errorf("the pool has %d unclaimed pods, want its one", len(left))
				}
				return
			}
			if err != nil {
				t.Fatalf("destroy of a pod claimed for the session: %v", err)
			}
			checkDeleted(ctx, t, cs, "the destroyed pod", pod, sec)
		})
	}
}

// TestDestroyOfAGonePoolPod: a state whose Pod is gone is destroyed as
// before the claim check, with no Pod to check: what is left of it (here
// its Secret) is deleted, and a second Destroy is no error either.
func TestDestroyOfAGonePoolPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, sec := guardedPoolPod("00112233aabbccdd", guardCase{claimed: true, claimedFor: "s1"})
	cs := fake.NewClientset(sec)
	p, _ := observedProvider(t, Config{NetworkPolicy: new(bool), Pools: []Pool{{Name: "warm", Size: 1}}}, cs)
	for _, session := range []string{"s1", "someone-else", "s1"} {
		if err := p.Destroy(ctx, handMadeState(t, pod, session)); err != nil {
			t.Fatalf("destroy of a gone pod (state of %s): %v", session, err)
		}
	}
	if _, err := cs.CoreV1().Secrets("ns").Get(ctx, sec.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the gone pod's Secret: %v", err)
	}
}

// stopLaunchAtPodCreate makes a Launch fail when it creates its Pod
// (ErrUnavailable), past the Prior's deletion, so that a test sees what
// the Prior did without a Pod that runs.
func stopLaunchAtPodCreate(cs *fake.Clientset) {
	cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("the test stops the launch here")
	})
}

// podCreates counts the Pod creates since the last ClearActions.
func podCreates(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

// TestLaunchRefusesAPriorPoolPodNotClaimedForIt: Launch with a Prior
// naming a warm pool Pod that no claim gave the session (unclaimed,
// claimed by another session, or claimed for the state's session while
// the caller launches another, as Reattach refuses it) is refused with
// ErrInvalidArgument after the Pod's read: nothing is deleted or created.
// A Prior claimed for the session, or gone, is replaced as before: the
// old Pod is deleted and a new one created (the test stops the launch at
// that create).
func TestLaunchRefusesAPriorPoolPodNotClaimedForIt(t *testing.T) {
	const key = "00112233aabbccdd"
	for _, tc := range []guardCase{
		{name: "unclaimed", state: "s1", caller: "s1", wantErrContains: "unclaimed pod of warm pool warm (a state of a claimed sandbox is needed to replace it)"},
		{name: "claimed by another session", claimed: true, claimedFor: "other", state: "s1", caller: "s1", wantErrContains: `not claimed for session "s1" (it was claimed by another session; refusing to replace it)`},
		{name: "state of another session than the caller's", claimed: true, claimedFor: "s1", state: "s1", caller: "s2", wantErrContains: `not claimed for session "s2"`},
		{name: "claimed for no session", claimed: true, state: "s1", caller: "s1", wantErrContains: `not claimed for session "s1"`},
		{name: "claimed for it", claimed: true, claimedFor: "s1", state: "s1", caller: "s1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pod, sec := guardedPoolPod(key, tc)
			cs := fake.NewClientset(pod, sec)
			stopLaunchAtPodCreate(cs)
			p, _ := observedProvider(t, Config{NetworkPolicy: new(bool), Pools: []Pool{{Name: "warm", Size: 1}}}, cs)
			raw := handMadeState(t, pod, tc.state)

			cs.ClearActions()
			sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: tc.caller, Prior: raw})
			if sb != nil {
				_ = sb.Close()
				t.Fatal("the launch was meant to stop at its pod's create")
			}
			if tc.wantErrContains != "" {
				checkRefusedUntouched(ctx, t, cs, err, tc.wantErrContains, pod, sec)
				return
			}
			if !errors.Is(err, compute.ErrUnavailable) || podCreates(cs) != 1 {
				t.Fatalf("the launch did not get to create its pod (%d creates): %v", podCreates(cs), err)
			}
			checkDeleted(ctx, t, cs, "the replaced pod", pod, sec)
		})
	}
}

// TestLaunchWithAGonePriorPoolPod: a Prior whose Pod is gone is replaced
// as before the claim check: the launch goes on to create a Pod.
func TestLaunchWithAGonePriorPoolPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, _ := guardedPoolPod("00112233aabbccdd", guardCase{claimed: true, claimedFor: "s1"})
	cs := fake.NewClientset()
	stopLaunchAtPodCreate(cs)
	p, _ := observedProvider(t, Config{NetworkPolicy: new(bool)}, cs)
	_, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "s1", Prior: handMadeState(t, pod, "s1")})
	if !errors.Is(err, compute.ErrUnavailable) || podCreates(cs) != 1 {
		t.Fatalf("the launch did not get to create its pod (%d creates): %v", podCreates(cs), err)
	}
}

// TestColdPodsAreNotClaimChecked: Pods of no pool need no claim: their
// own state destroys and replaces them (one created for another session
// is refused: TestColdPodOfAnotherSessionIsRefused).
func TestColdPodsAreNotClaimChecked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, op := range []string{"destroy", "replace"} {
		t.Run(op, func(t *testing.T) {
			pod := sandboxPod("aaaaaaaaaaaaaaaa", "s1", nil, nil)
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName("aaaaaaaaaaaaaaaa"), Namespace: "ns"}}
			cs := fake.NewClientset(pod, sec)
			stopLaunchAtPodCreate(cs)
			p, _ := observedProvider(t, Config{NetworkPolicy: new(bool)}, cs)
			raw, err := stateOf(pod).encode()
			if err != nil {
				t.Fatal(err)
			}
			cs.ClearActions()
			if op == "destroy" {
				err = p.Destroy(ctx, raw)
			} else if _, err = p.Launch(ctx, compute.LaunchSpec{SessionID: "s1", Prior: raw}); errors.Is(err, compute.ErrUnavailable) && podCreates(cs) == 1 {
				err = nil // got past the Prior to the new Pod's create
			}
			if err != nil {
				t.Fatalf("%s a cold pod: %v", op, err)
			}
			checkDeleted(ctx, t, cs, "the cold pod", pod, sec)
		})
	}
}

// TestClaimSaysWhatFailed: a claim that gave up every Pod it claimed says
// which and why (wrapping the causes), still as errNoWarmPod so Launch
// goes cold; "none ready" is said only when no Pod was ready to claim.
// The pool's three Pods, oldest first: one deleted right after its claim,
// one whose token Secret is missing, one whose daemon never answers.
func TestClaimSaysWhatFailed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port // nothing answers there
	_ = l.Close()

	keys := []string{"0000000000000001", "0000000000000002", "0000000000000003"}
	var objs []runtime.Object
	start := time.Now()
	for i, key := range keys {
		pod, sec := warmPod(key, "warm", DefaultImage, "127.0.0.1", mustHex(t))
		pod.CreationTimestamp = metav1.NewTime(start.Add(time.Duration(i) * time.Second))
		objs = append(objs, pod)
		if i != 1 {
			objs = append(objs, sec)
		}
	}
	cs := fake.NewClientset(objs...)
	cfg := Config{Connect: ConnectPodIP, Port: closed, NetworkPolicy: new(bool), ReadyTimeout: 2 * time.Second,
		Pools: []Pool{{Name: "warm", Size: 3}}}
	p, _ := observedProvider(t, cfg, cs)
	lose := withRotateHook(ctx, func(step rotateStep, st State) {
		if step == stepClaimed && st.Key == keys[0] {
			if err := cs.CoreV1().Pods("ns").Delete(ctx, st.Pod, metav1.DeleteOptions{}); err != nil {
				t.Errorf("losing the pod: %v", err)
			}
		}
	})

	_, err = claimFrom(lose, p, "warm", "s1")
	if !errors.Is(err, errNoWarmPod) {
		t.Fatalf("want no warm pod, got %v", err)
	}
	t.Logf("the claim's error: %v", err)
	msg := err.Error()
	if strings.Contains(msg, "none ready") {
		t.Errorf("the error says none was ready: %v", err)
	}
	for _, want := range []string{
		"claimed pod " + podName(keys[0]) + " did not answer", "deleted during start-up",
		"claimed pod " + podName(keys[1]) + " had no readable token",
		"claimed pod " + podName(keys[2]) + " did not answer",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	for _, kind := range []error{compute.ErrUnavailable, compute.ErrNotFound, compute.ErrDeadlineExceeded} {
		if !errors.Is(err, kind) {
			t.Errorf("the error does not wrap the causes' %v: %v", kind, err)
		}
	}

	// Nothing left to claim, or nothing ready: "none ready".
	if _, err := claimFrom(ctx, p, "warm", "s2"); !errors.Is(err, errNoWarmPod) || !strings.HasSuffix(err.Error(), "(none ready)") {
		t.Errorf("an empty pool: %v", err)
	}
	starting, sec := warmPod("0000000000000004", "warm", DefaultImage, "", mustHex(t))
	starting.Status = corev1.PodStatus{Phase: corev1.PodPending}
	for _, obj := range []runtime.Object{starting, sec} {
		if err := cs.Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := claimFrom(ctx, p, "warm", "s3"); !errors.Is(err, errNoWarmPod) || !strings.HasSuffix(err.Error(), "(none ready)") {
		t.Errorf("a pool of a starting pod: %v", err)
	}
}

// TestClaimFailuresMessage: the claim's error names at most
// claimFailuresShown failures, and how many more there were.
func TestClaimFailuresMessage(t *testing.T) {
	var f claimFailures
	for i := range claimFailuresShown + 2 {
		f = append(f, errors.New("e"+strconv.Itoa(i)))
	}
	if got, want := f.Error(), "e0; e1; e2; and 2 more"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(f, f[4]) {
		t.Errorf("the failures not named are not wrapped")
	}
}
