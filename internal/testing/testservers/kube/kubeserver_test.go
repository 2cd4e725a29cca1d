package kubeserver_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
)

func TestMain(m *testing.M) { os.Exit(kubeserver.Run(m)) }

// pod is the part of a Pod the tests read.
type pod struct {
	Metadata struct {
		Name, UID string
	} `json:"metadata"`
	Status struct {
		Phase, PodIP string
	} `json:"status"`
}

// servePod creates a Pod running image as an HTTP server on port 8080
// (the pause program's serve mode) and waits until it runs.
func servePod(t *testing.T, c *kubeserver.Cluster, ns, name, image string) pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"containers": []any{map[string]any{"name": "serve", "image": image, "imagePullPolicy": "Never",
				"command": []string{"/pause", "serve", ":8080"}, "ports": []any{map[string]any{"containerPort": 8080}}}},
			"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false}}
	start := time.Now()
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", body, nil); err != nil {
		t.Fatal(err)
	}
	var p pod
	for {
		if err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+name, nil, &p); err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == "Running" && p.Status.PodIP != "" {
			break
		}
		if p.Status.Phase == "Failed" || p.Status.Phase == "Succeeded" {
			t.Fatalf("pod %s/%s ended: %s", ns, name, p.Status.Phase)
		}
		select {
		case <-ctx.Done():
			var raw map[string]any
			_ = c.Do(context.Background(), http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+name, nil, &raw)
			t.Fatalf("pod %s/%s not running: %v", ns, name, raw["status"])
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("pod %s/%s running on %s after %s", ns, name, p.Status.PodIP, time.Since(start).Round(time.Millisecond))
	return p
}

// getPodIP fetches http://IP:8080/ from this host.
func getPodIP(t *testing.T, ip string) string {
	t.Helper()
	var last error
	for range 50 { // the server may start a moment after the container
		resp, err := http.Get("http://" + net.JoinHostPort(ip, "8080") + "/")
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("pod IP %s: %v", ip, last)
	return ""
}

func TestPodRunsAndServes(t *testing.T) {
	c := kubeserver.Shared(t)
	ns := c.Namespace(t)
	p := servePod(t, c, ns, "serve", kubeserver.PauseImage)
	if got := getPodIP(t, p.Status.PodIP); got != "bulkhead-pause serve\n" {
		t.Fatalf("pod answered %q", got)
	}
	_, subnet, err := net.ParseCIDR(c.PodCIDR)
	if err != nil || !subnet.Contains(net.ParseIP(p.Status.PodIP)) {
		t.Fatalf("pod IP %s outside the pod network %s (%v)", p.Status.PodIP, c.PodCIDR, err)
	}

	t.Run("PortForwardThroughAPIServer", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		got, err := portForwardGet(ctx, c, ns, "serve", 8080)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(got, "bulkhead-pause serve\n") || !strings.HasPrefix(got, "HTTP/1.0 200") {
			t.Fatalf("port-forward answered %q", got)
		}
	})

	t.Run("ExecThroughAPIServer", func(t *testing.T) {
		// The pause program's serve mode fails at once on a bad address:
		// its message comes back on stderr, its exit code as a Status.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, stderr, status, err := execRun(ctx, c, ns, "serve", "/pause", "serve", "no-port")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stderr, "missing port") || !strings.Contains(status, "NonZeroExitCode") || !strings.Contains(status, `"message":"1"`) {
			t.Fatalf("exec: stderr %q, status %q", stderr, status)
		}
	})

	t.Run("LogsThroughAPIServer", func(t *testing.T) {
		// The kubelet's log endpoint, through the API server: proves the
		// API server reaches the kubelet with its client certificate.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+"/api/v1/namespaces/"+ns+"/pods/serve/log", nil)
		resp, err := c.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("logs: %s: %s", resp.Status, b)
		}
	})

	t.Run("ForegroundDeletion", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		opts := map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
		if err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/serve", opts, nil); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for {
			err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/serve", nil, nil)
			if kubeserver.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("pod still there after a foreground delete: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("pod gone %s after a foreground delete", time.Since(start).Round(time.Millisecond))
	})
}

func TestServiceAccountKubeconfigHasOnlyItsRole(t *testing.T) {
	c := kubeserver.Shared(t)
	ns := c.Namespace(t)
	kc := c.ServiceAccountKubeconfig(t, ns, "provider")
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	var token string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "token: "); ok {
			token = v
		}
	}
	if token == "" || !strings.Contains(string(b), "namespace: "+ns) || !strings.Contains(string(b), "server: "+c.Server) {
		t.Fatalf("kubeconfig lacks the token, namespace or server:\n%s", b)
	}
	list := func() int {
		req, _ := http.NewRequest(http.MethodGet, c.Server+"/api/v1/namespaces/"+ns+"/pods", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.HTTPClientNoAuth().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := list(); code != http.StatusForbidden {
		t.Fatalf("listing pods with no Role: %d, want 403", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": map[string]any{"name": "pods-reader"},
		"rules": []any{map[string]any{"apiGroups": []string{""}, "resources": []string{"pods"}, "verbs": []string{"list"}}}}
	binding := map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": map[string]any{"name": "provider-pods-reader"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-reader"},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "provider", "namespace": ns}}}
	for _, obj := range []struct {
		path string
		body any
	}{{"roles", role}, {"rolebindings", binding}} {
		if err := c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/"+obj.path, obj.body, nil); err != nil {
			t.Fatal(err)
		}
	}
	for code := list(); code != http.StatusOK; code = list() {
		if ctx.Err() != nil {
			t.Fatalf("listing pods with the Role: %d, want 200", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestLoadImageFromDocker(t *testing.T) {
	testenv.Require(t, testenv.Docker)
	c := kubeserver.Shared(t)
	// A tiny image FROM scratch, built by Docker: the pause program.
	dir := t.TempDir()
	pause, err := os.ReadFile(c.PauseBinary())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pause"), pause, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY pause /pause\nENTRYPOINT [\"/pause\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ref := "bulkhead-kubeserver-test/serve:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if out, err := exec.Command("docker", "build", "-q", "-t", ref, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", ref).Run() })
	c.LoadImage(t, ref)
	ns := c.Namespace(t)
	p := servePod(t, c, ns, "from-docker", ref)
	if got := getPodIP(t, p.Status.PodIP); got != "bulkhead-pause from-docker\n" {
		t.Fatalf("pod answered %q", got)
	}
}

func TestRestartAPIServer(t *testing.T) {
	c := kubeserver.Shared(t)
	ns := c.Namespace(t)
	p := servePod(t, c, ns, "survivor", kubeserver.PauseImage)
	start := time.Now()
	c.RestartAPIServer(t)
	t.Logf("API server restarted in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got pod
	if err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/survivor", nil, &got); err != nil {
		t.Fatal(err)
	}
	if got.Metadata.UID != p.Metadata.UID || got.Status.Phase != "Running" {
		t.Fatalf("after the restart the pod is %+v, was %+v", got, p)
	}
	// A new object goes through the restarted server to the node.
	servePod(t, c, ns, "after-restart", kubeserver.PauseImage)
}

// TestStopLeavesNothing runs a cluster of its own (beside the shared one)
// with a Pod, stops it, and checks that no process, mount, cgroup,
// bridge or directory of it is left.
func TestStopLeavesNothing(t *testing.T) {
	testenv.Require(t, kubeserver.Needs()...)
	testenv.Require(t, testenv.Condition(kubeserver.Built(), "the test cluster's binaries are not built yet: run `make kube-tools` first"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := kubeserver.New(ctx, kubeserver.Options{Logf: t.Logf})
	if err != nil {
		if c != nil {
			c.Stop()
		}
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.Stop()
		}
	})
	t.Logf("cluster started in %s", time.Since(start).Round(time.Millisecond))
	ns, err := c.CreateNamespace(ctx, "bhk-test-")
	if err != nil {
		t.Fatal(err)
	}
	p := servePod(t, c, ns, "leftover", kubeserver.PauseImage)
	if got := getPodIP(t, p.Status.PodIP); got != "bulkhead-pause leftover\n" {
		t.Fatalf("pod answered %q", got)
	}
	dir, bridge, cg := c.Dir, "bhk-"+filepath.Base(c.Dir), c.CgroupRoot()
	if cg == "" {
		t.Fatal("no cgroup root")
	}
	start = time.Now()
	c.Stop()
	stopped = true
	t.Logf("cluster stopped in %s", time.Since(start).Round(time.Millisecond))

	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there: %v", dir, err)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), dir+"/") {
		t.Errorf("mounts under %s left", dir)
	}
	if _, err := net.InterfaceByName(bridge); err == nil {
		t.Errorf("bridge %s left", bridge)
	}
	for _, h := range []string{"memory", "pids", "cpu", "freezer"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h, cg)); err == nil {
			t.Errorf("cgroup %s:%s left", h, cg)
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(b), dir+"/") {
			t.Errorf("process %s left: %q", e.Name(), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	// The pod network's route went with the bridge (the test never dials
	// a pod IP once its bridge is gone: the packet would leave the machine).
	if out, err := exec.Command("ip", "route", "show", c.PodCIDR).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("route to %s left: %s (%v)", c.PodCIDR, out, err)
	}
}

// TestVolumeAndRuntimeClass: a claim on the default StorageClass binds to
// a new hostPath volume, a Pod that mounts it and names a RuntimeClass with
// the node's second handler runs, and deleting the claim removes the
// volume's directory.
func TestVolumeAndRuntimeClass(t *testing.T) {
	c := kubeserver.Shared(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := "bhk-rc-" + strings.TrimPrefix(ns, "bhk-test-")
	if err := c.Do(ctx, http.MethodPost, "/apis/node.k8s.io/v1/runtimeclasses", map[string]any{
		"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": map[string]any{"name": rc}, "handler": kubeserver.RuntimeHandler}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Do(context.Background(), http.MethodDelete, "/apis/node.k8s.io/v1/runtimeclasses/"+rc, nil, nil)
	})
	claim := map[string]any{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": map[string]any{"name": "work"},
		"spec": map[string]any{"accessModes": []string{"ReadWriteOnce"}, "resources": map[string]any{"requests": map[string]string{"storage": "1Gi"}}}}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/persistentvolumeclaims", claim, nil); err != nil {
		t.Fatal(err)
	}
	var pvc struct {
		Spec   struct{ VolumeName, StorageClassName string } `json:"spec"`
		Status struct{ Phase string }                        `json:"status"`
	}
	for pvc.Status.Phase != "Bound" {
		if err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/persistentvolumeclaims/work", nil, &pvc); err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatalf("claim not bound: %+v", pvc)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pvc.Spec.StorageClassName != kubeserver.StorageClass {
		t.Errorf("claim got class %q, want the default %q", pvc.Spec.StorageClassName, kubeserver.StorageClass)
	}
	var pv struct {
		Spec struct {
			HostPath struct{ Path string } `json:"hostPath"`
		} `json:"spec"`
	}
	if err := c.Do(ctx, http.MethodGet, "/api/v1/persistentvolumes/"+pvc.Spec.VolumeName, nil, &pv); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pv.Spec.HostPath.Path); err != nil {
		t.Fatalf("volume directory: %v", err)
	}
	body := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "with-volume"},
		"spec": map[string]any{
			"runtimeClassName": rc,
			"containers": []any{map[string]any{"name": "serve", "image": kubeserver.PauseImage, "imagePullPolicy": "Never",
				"command":      []string{"/pause", "serve", ":8080"},
				"volumeMounts": []any{map[string]any{"name": "work", "mountPath": "/work"}}}},
			"volumes":                       []any{map[string]any{"name": "work", "persistentVolumeClaim": map[string]any{"claimName": "work"}}},
			"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false}}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", body, nil); err != nil {
		t.Fatal(err)
	}
	var p pod
	for p.Status.Phase != "Running" {
		if err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/with-volume", nil, &p); err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatalf("pod with a volume and a RuntimeClass not running: %+v", p.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fg := map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground", "gracePeriodSeconds": 0}
	if err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/with-volume", fg, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns+"/persistentvolumeclaims/work", nil, nil); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := os.Stat(pv.Spec.HostPath.Path)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("volume directory %s still there after its claim went: %v", pv.Spec.HostPath.Path, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
