package houserules

import (
	"encoding/json"
	"os/exec"
	"slices"
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

// allowOnly fails for every dependency of p inside the module that is not
// one of allowed (exact import paths).
func allowOnly(t *testing.T, p pkgInfo, why string, allowed ...string) {
	t.Helper()
	for _, d := range p.Deps {
		if (d == module || strings.HasPrefix(d, module+"/")) && !slices.Contains(allowed, d) {
			t.Errorf("%s depends on %s: %s", p.ImportPath, d, why)
		}
	}
}

// The pure engines (the patch engine, the archive engine, the account
// database) are shared by the daemon and the harness: they link nothing of
// the module but the error kinds, and no gRPC, so neither side drags the
// other's internals in through them. The error kinds are a leaf.
func TestPureEnginesAreLeaves(t *testing.T) {
	for _, engine := range []string{module + "/pkg/patch", module + "/pkg/archive", module + "/pkg/userdb"} {
		pkgs := listDeps(t, engine)
		if len(pkgs) != 1 || !slices.Contains(pkgs[0].Deps, module+"/pkg/errkind") {
			t.Fatalf("%s: go list did not give its real dependencies (it imports pkg/errkind)", engine)
		}
		allowOnly(t, pkgs[0], "a pure engine links nothing of the module but pkg/errkind", module+"/pkg/errkind")
		forbid(t, pkgs[0], "a pure engine has no gRPC", "google.golang.org/grpc")
	}
	for _, p := range listDeps(t, module+"/pkg/errkind") {
		allowOnly(t, p, "pkg/errkind is a leaf: it imports nothing of the module")
	}
}

// The harness links nothing under pkg/compute/agentd: what it shares with
// the daemon lives in the pure engines (pkg/archive, pkg/userdb, pkg/patch),
// pkg/errkind and the wire contract (proto/bulkhead/agentd/v1, which is not
// under pkg/compute/agentd).
func TestHarnessLinksNoDaemonInternals(t *testing.T) {
	for _, p := range listDeps(t, module+"/cmd/harness") {
		if !slices.Contains(p.Deps, module+"/pkg/archive") {
			t.Fatalf("%s does not list pkg/archive among its deps: this test is not looking at real dependency data", p.ImportPath)
		}
		forbid(t, p, "the harness links none of the daemon's internals", module+"/pkg/compute/agentd")
	}
}
