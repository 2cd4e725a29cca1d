package houserules

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/bulkhead-dev/bulkhead"

type pkgInfo struct {
	ImportPath string
	Deps       []string
}

// listDeps returns every package matching pattern with its transitive deps.
func listDeps(t *testing.T, pattern string) []pkgInfo {
	t.Helper()
	out, err := exec.Command("go", "list", "-json=ImportPath,Deps", pattern).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pattern, err)
	}
	var pkgs []pkgInfo
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkgInfo
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func forbid(t *testing.T, p pkgInfo, why string, prefixes ...string) {
	t.Helper()
	for _, d := range p.Deps {
		for _, pre := range prefixes {
			if d == pre || strings.HasPrefix(d, pre+"/") {
				t.Errorf("%s depends on %s: %s", p.ImportPath, d, why)
			}
		}
	}
}

func TestComputeAndManifestNeverImportHarness(t *testing.T) {
	for _, pattern := range []string{module + "/pkg/compute/...", module + "/pkg/manifest/..."} {
		for _, p := range listDeps(t, pattern) {
			forbid(t, p, "the compute plane must not depend on the harness", module+"/pkg/harness")
		}
	}
}

func TestDaemonLogicHasNoGRPCOrProviders(t *testing.T) {
	shimSeen := false
	for _, p := range listDeps(t, module+"/pkg/compute/agentd/...") {
		if strings.HasPrefix(p.ImportPath, module+"/pkg/compute/agentd/server") {
			// The gRPC shim: it must show up with gRPC among its deps, or
			// this test is not looking at real dependency data.
			for _, d := range p.Deps {
				shimSeen = shimSeen || d == "google.golang.org/grpc"
			}
			continue
		}
		forbid(t, p, "agentd's logic has no gRPC and knows no provider",
			"google.golang.org/grpc", module+"/pkg/compute/local", module+"/pkg/compute/docker",
			module+"/pkg/compute/remote", module+"/pkg/compute/agentclient")
	}
	if !shimSeen {
		t.Fatal("the server shim's dependencies were not listed")
	}
}

func TestDaemonBinaryLinksNoHeavyClients(t *testing.T) {
	for _, p := range listDeps(t, module+"/cmd/sandbox-agentd") {
		forbid(t, p, "sandbox-agentd stays small and links no model, docker or kubernetes code",
			"github.com/openai", "github.com/docker", "github.com/moby", "k8s.io", "sigs.k8s.io", module+"/pkg/harness")
	}
}
