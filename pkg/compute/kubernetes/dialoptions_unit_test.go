package kubernetes

// Config.AgentDialOptions at the unit level: the fake clientset holds a
// running Pod and its Secret, its daemon is a real one behind a loopback
// TCP relay reached as the Pod's IP (tcpDaemon), and the interceptors
// given in the Config see the calls of the client the provider made.

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// TestAgentDialOptionsReachTheDaemonClient: the unary and stream
// interceptors of Config.AgentDialOptions see the calls of the sandbox's
// daemon client, the provider's own during Reattach (the readiness wait)
// and the caller's after it, unary calls and streams alike.
func TestAgentDialOptionsReachTheDaemonClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "0123456789abcdef"
	token := mustHex(t)
	port := tcpDaemon(t, token)

	var (
		mu             sync.Mutex
		unary, streams []string
	)
	opts := []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			mu.Lock()
			unary = append(unary, method)
			mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			mu.Lock()
			streams = append(streams, method)
			mu.Unlock()
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
	labels := map[string]string{LabelSandbox: "1", LabelKey: key}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(key), Namespace: "ns", Labels: labels, Annotations: map[string]string{AnnotationSession: "s1"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: "img"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Namespace: "ns", Labels: labels},
		Data:       map[string][]byte{tokenKey: []byte(token)},
	}
	p, _ := fakeProvider(t, Config{Connect: ConnectPodIP, Port: port, NetworkPolicy: new(bool), AgentDialOptions: opts}, pod, sec)
	raw, err := stateOf(pod).encode()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := p.Reattach(ctx, compute.LaunchSpec{SessionID: "s1"}, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	mu.Lock()
	during := len(unary) + len(streams)
	mu.Unlock()
	if during == 0 {
		t.Errorf("the interceptors saw none of Reattach's calls")
	}
	if _, err := sb.Agent().Info(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Agent().Exec(ctx, agentclient.ProcessSpec{Argv: []string{"true"}}, agentclient.ExecOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(unary, "/bulkhead.agentd.v1.SystemService/Info") {
		t.Errorf("the unary interceptor saw %q, not Info", unary)
	}
	if !slices.Contains(streams, "/bulkhead.agentd.v1.ProcessService/Exec") {
		t.Errorf("the stream interceptor saw %q, not Exec", streams)
	}
}
