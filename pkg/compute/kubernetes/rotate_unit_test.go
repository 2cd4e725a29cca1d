package kubernetes

// Reattach after an interrupted token rotation, at the unit level: the
// fake clientset holds the Pod and its Secret, and the daemon is a real
// one (internal/testing/agentdtest) over real gRPC, reached as the Pod's IP
// through a TCP relay to its socket. The same states are reached by real
// crashes against a real cluster in TestRotationSurvivesACrash; this test
// needs neither and runs everywhere.

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// tcpDaemon starts a test daemon whose token is then rotated to token,
// and returns the port of a loopback TCP relay to it.
func tcpDaemon(t *testing.T, token string) int {
	t.Helper()
	d, port := relayedDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Client.RotateToken(ctx, token); err != nil {
		t.Fatal(err)
	}
	return port
}

// relayedDaemon starts a test daemon and returns it and the port of a
// loopback TCP relay to it.
func relayedDaemon(t *testing.T) (*agentdtest.Daemon, int) {
	t.Helper()
	d := agentdtest.Start(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("unix", d.Socket)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	return d, l.Addr().(*net.TCPAddr).Port
}

func mustHex(t *testing.T) string {
	t.Helper()
	s, err := randomHex(32)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReattachFinishesAnInterruptedRotation: for each state a crash can
// leave between the steps of a claim's rotation, Reattach hands out a
// sandbox whose daemon takes the Secret's token, the Secret ends settled
// (nothing staged, marked rotated), and the pool token is refused. A
// settled Secret is left as it is, and a token the daemon refuses with
// nothing staged is a clear error, not a loop.
func TestReattachFinishesAnInterruptedRotation(t *testing.T) {
	const key = "00112233aabbccdd"
	cases := []struct {
		name string
		// daemon: which token the daemon has ("pool" or "next").
		daemon string
		// staged: whether the Secret holds a next token; rotated: marked.
		staged, rotated, claimedPool bool
		// wantRotation: the Secret's token must change; wantErr: Reattach
		// fails with it.
		wantRotation bool
		wantErr      error
	}{
		{name: "crash after the claim", daemon: "pool", claimedPool: true, wantRotation: true},
		{name: "crash after staging", daemon: "pool", staged: true, claimedPool: true, wantRotation: true},
		{name: "crash after the daemon rotated", daemon: "next", staged: true, claimedPool: true, wantRotation: true},
		{name: "settled claim", daemon: "pool", rotated: true, claimedPool: true},
		{name: "cold sandbox", daemon: "pool"},
		{name: "a token the daemon refuses", daemon: "other", rotated: true, claimedPool: true, wantErr: compute.ErrUnauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pool, next := mustHex(t), mustHex(t)
			daemonToken := map[string]string{"pool": pool, "next": next, "other": mustHex(t)}[tc.daemon]
			port := tcpDaemon(t, daemonToken)

			labels := map[string]string{LabelSandbox: "1", LabelKey: key}
			if tc.claimedPool {
				labels[LabelPool], labels[LabelClaimed] = "warm", "true"
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: podName(key), Namespace: "ns", Labels: labels, Annotations: map[string]string{AnnotationSession: "s1"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: "img"}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
					Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
			}
			sec := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Namespace: "ns", Labels: labels, Annotations: map[string]string{}},
				Data:       map[string][]byte{tokenKey: []byte(pool)},
			}
			if tc.staged {
				sec.Data[nextTokenKey] = []byte(next)
			}
			if tc.rotated {
				sec.Annotations[AnnotationTokenRotated] = "earlier"
			}
			p, cs := fakeProvider(t, Config{Connect: ConnectPodIP, Port: port, NetworkPolicy: new(bool)}, pod, sec)
			raw, err := stateOf(pod).encode()
			if err != nil {
				t.Fatal(err)
			}

			sb, err := p.Reattach(ctx, compute.LaunchSpec{SessionID: "s1"}, raw)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("want %v, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if _, err := sb.Agent().Info(ctx); err != nil {
				t.Fatalf("the reattached sandbox: %v", err)
			}
			got, err := cs.CoreV1().Secrets("ns").Get(ctx, secretName(key), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ts := readTokenSecret(got)
			if ts.next != "" {
				t.Errorf("a staged token is left")
			}
			if tc.claimedPool && !ts.rotated {
				t.Errorf("the Secret is not marked rotated")
			}
			if tc.wantRotation == (ts.token == pool) {
				t.Errorf("the Secret's token changed: %v, want %v", ts.token != pool, tc.wantRotation)
			}
			if tc.staged && ts.token != next {
				t.Errorf("the staged token was not the one promoted")
			}
			dial := func(token string) error { return infoWithToken(ctx, t, port, token) }
			if err := dial(ts.token); err != nil {
				t.Errorf("the Secret's token: %v", err)
			}
			if tc.wantRotation {
				if err := dial(pool); !errors.Is(err, compute.ErrUnauthenticated) {
					t.Errorf("the pool token: want unauthenticated, got %v", err)
				}
			}
		})
	}
}

// infoWithToken calls Info on the daemon at 127.0.0.1:port with token.
func infoWithToken(ctx context.Context, t *testing.T, port int, token string) error {
	t.Helper()
	ac, err := agentclient.Dial(agentclient.Options{Address: "tcp://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	_, err = ac.Info(ctx)
	return err
}
