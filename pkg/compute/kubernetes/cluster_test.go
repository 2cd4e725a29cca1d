package kubernetes

// Tests against a real cluster (internal/testing/testservers/kube: etcd,
// kube-apiserver with RBAC, controller-manager, scheduler and a kubelet
// with containerd, so Pods really run). The provider runs as a
// ServiceAccount bound only to Config.RequiredRules.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

func TestMain(m *testing.M) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	testRun.label = hex.EncodeToString(b)
	os.Exit(kubeserver.Run(m))
}

// testRun is decided once per test binary.
var testRun struct {
	label     string // value of runLabelKey on everything this run makes
	imageOnce sync.Once
	imageErr  error
}

const runLabelKey = "test.bulkhead.dev/run"

// testImage is the sandbox image the tests run.
const testImage = "bulkhead/sandbox:dev"

// kubeEnv is one test's namespace on the shared cluster.
type kubeEnv struct {
	c          *kubeserver.Cluster
	ns         string
	admin      kubernetes.Interface
	kubeconfig string // the harness ServiceAccount's (bound to the Role)
}

// newKubeEnv gives the test a fresh namespace on the shared cluster, the
// sandbox image on its node, and a ServiceAccount "harness" bound to a
// Role of rules (nil: Config.RequiredRules of every connect mode).
func newKubeEnv(t *testing.T, rules []rbacv1.PolicyRule) *kubeEnv {
	t.Helper()
	// The sandbox image comes from the local Docker (`make image`, then
	// `docker save` into the node's containerd).
	testenv.Require(t, testenv.Docker)
	c := kubeserver.Shared(t)
	testRun.imageOnce.Do(func() { testRun.imageErr = loadImage(c) })
	if testRun.imageErr != nil {
		t.Fatalf("the sandbox image: %v", testRun.imageErr)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(t)
	if rules == nil {
		for _, mode := range []Connect{ConnectPortForward, ConnectExec} {
			rules = append(rules, Config{Connect: mode}.RequiredRules()...)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "bulkhead-harness"}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc := c.ServiceAccountKubeconfig(t, ns, "harness")
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bulkhead-harness"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "bulkhead-harness"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "harness", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if evs, err := admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
			for _, ev := range evs.Items {
				t.Logf("event %s %s/%s: %s: %s", ev.Type, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message)
			}
		}
	})
	return &kubeEnv{c: c, ns: ns, admin: admin, kubeconfig: kc}
}

// loadImage builds the sandbox image (a no-op when up to date) and loads
// it into the node's containerd.
func loadImage(c *kubeserver.Cluster) error {
	if os.Getenv("BULKHEAD_TEST_NO_IMAGE_BUILD") != "1" {
		root, err := os.Getwd()
		if err != nil {
			return err
		}
		root = filepath.Join(root, "..", "..", "..")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", root, "image-sandbox")
		var env []string
		for _, kv := range os.Environ() {
			switch strings.SplitN(kv, "=", 2)[0] {
			case "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES":
				continue
			}
			env = append(env, kv)
		}
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("make image-sandbox: %w\n%s", err, out.String())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return c.LoadDockerImage(ctx, testImage)
}

// config is a provider configuration for the test's namespace.
// The harness (this process) reaches Pod IPs from the node's address.
func (e *kubeEnv) config(mode Connect) Config {
	return Config{
		Namespace: e.ns, Image: testImage, ImagePullPolicy: corev1.PullNever, Connect: mode,
		Labels: map[string]string{runLabelKey: testRun.label}, StopTimeout: 3 * time.Second,
		ReadyTimeout: 90 * time.Second,
		HarnessPeers: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: e.c.NodeIP + "/32"}}},
	}
}

// provider makes a provider as the harness ServiceAccount.
func (e *kubeEnv) provider(t *testing.T, cfg Config) *Provider {
	t.Helper()
	p, err := NewFromKubeconfig(cfg, e.kubeconfig, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// leaked lists the objects left for a session in the namespace.
func (e *kubeEnv) leaked(t *testing.T, sessionID string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: LabelSession + "=" + sessionLabel(sessionID)}
	var left []string
	if l, err := e.admin.CoreV1().Pods(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "pod "+o.Name)
		}
	}
	if l, err := e.admin.CoreV1().Secrets(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "secret "+o.Name)
		}
	}
	if l, err := e.admin.NetworkingV1().NetworkPolicies(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "networkpolicy "+o.Name)
		}
	}
	if l, err := e.admin.CoreV1().PersistentVolumeClaims(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "pvc "+o.Name)
		}
	}
	return left
}

// all lists every sandbox object in the namespace (pods, secrets,
// network policies).
func (e *kubeEnv) all(t *testing.T) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: LabelSandbox + "=1"}
	var left []string
	if l, err := e.admin.CoreV1().Pods(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "pod "+o.Name)
		}
	}
	if l, err := e.admin.CoreV1().Secrets(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "secret "+o.Name)
		}
	}
	if l, err := e.admin.NetworkingV1().NetworkPolicies(e.ns).List(ctx, sel); err == nil {
		for _, o := range l.Items {
			left = append(left, "networkpolicy "+o.Name)
		}
	}
	return left
}

func newStore(t *testing.T) snapshot.Store {
	t.Helper()
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return store
}

func (e *kubeEnv) client(t *testing.T, p *Provider, store snapshot.Store) *compute.Client {
	return compute.NewClient(p, compute.ClientOptions{Snapshots: store, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
}
