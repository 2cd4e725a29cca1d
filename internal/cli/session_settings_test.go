package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// fakeAPIServer records the paths it is asked for and refuses everything.
type fakeAPIServer struct {
	*httptest.Server
	mu    sync.Mutex
	paths []string
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden by the test","reason":"Forbidden","code":403}`))
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPIServer) requests() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.paths, "\n")
}

// writeTwoContextKubeconfig writes a kubeconfig with contexts a (current,
// namespace ns-a) and b (namespace ns-b) on two API servers.
func writeTwoContextKubeconfig(t *testing.T, dir, serverA, serverB string) string {
	kc := `apiVersion: v1
kind: Config
current-context: a
clusters:
- name: a
  cluster: {server: "` + serverA + `"}
- name: b
  cluster: {server: "` + serverB + `"}
users:
- name: u
  user: {token: not-a-real-token}
contexts:
- name: a
  context: {cluster: a, user: u, namespace: ns-a}
- name: b
  context: {cluster: b, user: u, namespace: ns-b}
`
	p := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubeSessionSettingsRemembered: a session remembers the kubernetes
// connection settings it was made with; later commands use them unless
// flags say otherwise, and a --provider other than the session's is an
// error.
func TestKubeSessionSettingsRemembered(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBECONFIG", filepath.Join(dir, "absent"))
	t.Setenv("HOME", dir)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	a, b := newFakeAPIServer(t), newFakeAPIServer(t)
	kc := writeTwoContextKubeconfig(t, dir, a.URL, b.URL)
	state := t.TempDir()

	// What create resolves and saves: the kubeconfig made absolute, the
	// context and namespace actually used.
	t.Chdir(dir)
	g := &globals{stateDir: state, image: "img:1", kube: kubeFlags{kubeconfig: "kubeconfig", context: "b", connect: "exec", pullPolicy: "Always"}}
	cfg, rc, err := g.kubernetesConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != b.URL || cfg.Namespace != "ns-b" || cfg.ImagePullPolicy != "Always" {
		t.Fatalf("config: host %s namespace %s pull %s", rc.Host, cfg.Namespace, cfg.ImagePullPolicy)
	}
	const id, key = "kube-s", "0123456789abcdef"
	ps, _ := json.Marshal(map[string]any{"version": 1, "namespace": "ns-b", "pod": "bulkhead-" + key, "key": key, "session_id": id, "workspace": "/workspace"})
	if _, err := saveState(g, &compute.State{Version: compute.StateVersion, Provider: "kubernetes", SessionID: id, Started: true, ProviderState: ps}); err != nil {
		t.Fatal(err)
	}
	if err := saveSettings(g, id, "kubernetes"); err != nil {
		t.Fatal(err)
	}
	saved, err := loadSettings(g, id)
	if err != nil || saved == nil {
		t.Fatalf("settings: %v %v", saved, err)
	}
	want := sessionSettings{Provider: "kubernetes", Image: "img:1", Kubeconfig: kc, KubeContext: "b", Namespace: "ns-b", KubeConnect: "exec", KubePullPolicy: "Always"}
	if *saved != want {
		t.Fatalf("saved %+v, want %+v", *saved, want)
	}
	// Without a context flag the current context is the one remembered.
	g2 := &globals{stateDir: state, kube: kubeFlags{kubeconfig: kc}}
	if _, _, err := g2.kubernetesConfig(); err != nil {
		t.Fatal(err)
	}
	if s := g2.currentSettings("kubernetes"); s.KubeContext != "a" || s.Namespace != "ns-a" {
		t.Fatalf("defaults resolved to %+v", s)
	}

	run := func(args ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out, errb bytes.Buffer
		code := Execute(ctx, append([]string{"--state-dir", state}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		return code, errb.String()
	}
	podPath := "GET /api/v1/namespaces/ns-b/pods/bulkhead-" + key
	// No flags at all: the saved kubeconfig and context (server b).
	if code, errs := run("sandbox", "exec", id, "--", "true"); code == 0 || strings.Contains(errs, "KUBERNETES_MASTER") || !strings.Contains(b.requests(), podPath) {
		t.Fatalf("exec without flags: exit %d, %q; server b saw %q", code, errs, b.requests())
	}
	if a.requests() != "" {
		t.Fatalf("server a was asked: %q", a.requests())
	}
	// A flag wins over the saved setting.
	if code, _ := run("--kube-context", "a", "sandbox", "exec", id, "--", "true"); code == 0 || !strings.Contains(a.requests(), podPath) {
		t.Fatalf("--kube-context a: exit %d; server a saw %q", code, a.requests())
	}
	// Another provider than the session's is refused.
	if code, errs := run("--provider", "docker", "sandbox", "exec", id, "--", "true"); code == 0 || !strings.Contains(errs, "is a kubernetes sandbox, not --provider docker") {
		t.Fatalf("--provider docker: exit %d, %q", code, errs)
	}
	// A session without saved settings (an older harness's) and no
	// kubeconfig anywhere: a clear message.
	if err := removeSettings(g, id); err != nil {
		t.Fatal(err)
	}
	if code, errs := run("sandbox", "exec", id, "--", "true"); code == 0 || !strings.Contains(errs, "no kubeconfig found: give --kubeconfig") {
		t.Fatalf("without settings: exit %d, %q", code, errs)
	}
	// rm removes the sidecar with the state.
	if err := saveSettings(g, id, "kubernetes"); err != nil {
		t.Fatal(err)
	}
	if err := removeState(g, id); err != nil {
		t.Fatal(err)
	}
	if s, err := loadSettings(g, id); s != nil || err != nil {
		t.Fatalf("settings after removeState: %v %v", s, err)
	}
}

// TestKubeFlagTexts checks the new flags' help and their usage errors.
func TestKubeFlagTexts(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Execute(t.Context(), append([]string{"--state-dir", t.TempDir()}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		return code, out.String(), errb.String()
	}
	_, help, _ := run("sandbox", "create", "--help")
	for _, want := range []string{"--pool string", "claim a ready Pod from this warm pool", "--kube-pull-policy string", "Always, IfNotPresent or Never",
		"--kube-context string", "docker and kubernetes sandboxes: KEY=VALUE label", "a session remembers it"} {
		if !strings.Contains(help, want) {
			t.Errorf("create --help lacks %q", want)
		}
	}
	if code, _, errs := run("--provider", "local", "sandbox", "create", "--pool", "warm"); code == 0 || !strings.Contains(errs, "--pool: warm pools are kubernetes sandboxes'") {
		t.Errorf("--pool on local: exit %d, %q", code, errs)
	}
	dir := t.TempDir()
	kc := writeTwoContextKubeconfig(t, dir, "https://127.0.0.1:1", "https://127.0.0.1:1")
	if code, _, errs := run("--provider", "kubernetes", "--kubeconfig", kc, "--kube-pull-policy", "Sometimes", "sandbox", "ls"); code == 0 || !strings.Contains(errs, `--kube-pull-policy "Sometimes"`) {
		t.Errorf("--kube-pull-policy Sometimes: exit %d, %q", code, errs)
	}
	g := &globals{kube: kubeFlags{kubeconfig: kc, pool: "warm"}}
	cfg, _, err := g.kubernetesConfig()
	if err != nil || len(cfg.Pools) != 1 || cfg.Pools[0].Name != "warm" || cfg.Pools[0].Size != 0 {
		t.Errorf("--pool warm: pools %+v, %v", cfg.Pools, err)
	}
}
