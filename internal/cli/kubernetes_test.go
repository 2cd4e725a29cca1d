package cli

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
)

// TestKubernetesProviderFlags drives `harness sandbox` with --provider
// kubernetes against a real cluster: create, exec, ls, rm.
func TestKubernetesProviderFlags(t *testing.T) {
	testenv.Require(t, testenv.Docker)
	const image = "bulkhead/sandbox:dev"
	err := exec.Command("docker", "image", "inspect", image).Run()
	testenv.Require(t, testenv.Condition(err == nil, image+" is not built (make image)"))
	c := kubeserver.Start(t, kubeserver.Options{})
	c.LoadImage(t, image)
	ns := c.Namespace(t)
	state := testenv.SearchableTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		base := []string{"--state-dir", state, "--provider", "kubernetes", "--kubeconfig", c.AdminKubeconfig, "--namespace", ns, "--label", "test.bulkhead.dev/cli=1"}
		code := Execute(ctx, append(base, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		return code, out.String(), errb.String()
	}
	mustRun(t, run, "sandbox", "create", "--id", "kube-cli")
	if out := mustRun(t, run, "sandbox", "exec", "kube-cli", "--", "sh", "-c", "echo hi from $(hostname)"); !strings.Contains(out, "hi from sandbox") {
		t.Errorf("exec: %q", out)
	}
	// The session remembers its provider, kubeconfig and namespace.
	bare := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Execute(ctx, append([]string{"--state-dir", state}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		return code, out.String(), errb.String()
	}
	if out := mustRun(t, bare, "sandbox", "exec", "kube-cli", "--", "echo", "remembered"); !strings.Contains(out, "remembered") {
		t.Errorf("exec without the kubernetes flags: %q", out)
	}
	if out := mustRun(t, run, "sandbox", "ls"); !strings.Contains(out, "kube-cli") {
		t.Errorf("ls: %q", out)
	}
	mustRun(t, run, "sandbox", "rm", "kube-cli")
	if out := mustRun(t, run, "sandbox", "ls"); strings.Contains(out, "kube-cli") {
		t.Errorf("ls after rm: %q", out)
	}
	// A bad connect mode is a usage error.
	if code, _, errs := run("--kube-connect", "pigeon", "sandbox", "ls"); code == 0 || !strings.Contains(errs, "pigeon") {
		t.Errorf("--kube-connect pigeon: exit %d, %q", code, errs)
	}
}
