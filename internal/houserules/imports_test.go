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
	for _, p := range listDeps(t, module+"/pkg/agentd/...") {
		if strings.HasPrefix(p.ImportPath, module+"/pkg/agentd/server") {
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
		forbid(t, p, "sandbox-agentd stays small and links no model, docker, kubernetes or cloud SDK code",
			append(append(append([]string{"github.com/openai", module + "/pkg/harness"}, containerSDKs()...), cloudSDKs()...), traceExporters()...)...)
	}
}

// cloudSDKs are the import path prefixes of the cloud storage SDKs (and
// GCS's OAuth client): only the packages of a store or a mount backend
// link them.
func cloudSDKs() []string {
	return []string{"github.com/aws", "github.com/Azure", "cloud.google.com", "google.golang.org/api", "golang.org/x/oauth2"}
}

// containerSDKs are the Docker and Kubernetes clients: only their
// providers link them.
func containerSDKs() []string {
	return []string{"github.com/docker", "github.com/moby", "k8s.io", "sigs.k8s.io"}
}

// traceExporters are OpenTelemetry's SDK and exporters: only
// pkg/harness/tracing/traceexport links them.
func traceExporters() []string {
	return []string{"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters"}
}

// openaiRoot is openai-go's root package: its client links every API of
// the SDK (admin, fine-tuning, beta, ...); the harness uses the Responses
// service alone (package responses).
const openaiRoot = "github.com/openai/openai-go/v3"

// A library user links only the providers and stores they import: the
// core of the compute plane (its types, the daemon's client, the
// materializer, the local and remote providers, the snapshot store
// interface with its local store, the mount core) links no cloud SDK and
// no container client; each store and mount backend links its own SDK and
// no other's.
func TestComputeCoreLinksNoCloudSDK(t *testing.T) {
	for _, pkg := range []string{"pkg/compute", "pkg/compute/agentclient", "pkg/compute/materializer", "pkg/compute/local",
		"pkg/compute/remote", "pkg/compute/egress", "pkg/compute/snapshot", "pkg/compute/mount"} {
		for _, p := range listDeps(t, module+"/"+pkg) {
			forbid(t, p, "the core of the compute plane links no storage SDK or container client: they live in the packages using them (snapshot/s3store, mount/s3mount, ...)",
				append(cloudSDKs(), containerSDKs()...)...)
		}
	}
	only := map[string][]string{ // backend -> the SDK prefixes it may link
		"pkg/compute/snapshot/s3store": {"github.com/aws"},
		"pkg/compute/mount/s3mount":    {"github.com/aws"},
		"pkg/compute/mount/gcsmount":   {"golang.org/x/oauth2"},
		"pkg/compute/mount/azuremount": {"github.com/Azure"},
	}
	for pkg, own := range only {
		seen := false
		for _, p := range listDeps(t, module+"/"+pkg) {
			var others []string
			for _, sdk := range append(cloudSDKs(), containerSDKs()...) {
				if slices.Contains(own, sdk) {
					seen = seen || slices.ContainsFunc(p.Deps, func(d string) bool { return strings.HasPrefix(d, sdk+"/") || d == sdk })
					continue
				}
				others = append(others, sdk)
			}
			forbid(t, p, "a store or mount backend links its own SDK and no other", others...)
		}
		if !seen {
			t.Errorf("%s does not list %v among its deps: this test is not looking at real dependency data", pkg, own)
		}
	}
}

// The harness library links no trace exporter (traceexport is apart), no
// cloud SDK, no container client and not openai-go's root client; a
// backend embedding it with the local provider (examples/http-backend)
// links none of them either. The harness binary, which has every
// provider, does not link openai-go's root client.
func TestHarnessLibraryLinksOnlyWhatItUses(t *testing.T) {
	for _, pattern := range []string{module + "/pkg/harness", module + "/pkg/harness/model", module + "/pkg/harness/tracing", module + "/examples/http-backend"} {
		pkgs := listDeps(t, pattern)
		if len(pkgs) != 1 || !slices.ContainsFunc(pkgs[0].Deps, func(d string) bool { return strings.HasPrefix(d, openaiRoot+"/") }) &&
			!strings.HasSuffix(pattern, "/tracing") {
			t.Fatalf("%s: go list did not give its real dependencies (it links openai-go's packages)", pattern)
		}
		forbid(t, pkgs[0], "the harness library and a backend embedding it with the local provider link only what they use",
			append(append(cloudSDKs(), containerSDKs()...), traceExporters()...)...)
		if slices.Contains(pkgs[0].Deps, openaiRoot) {
			t.Errorf("%s depends on %s: construct the Responses service alone (responses.NewResponseService)", pattern, openaiRoot)
		}
	}
	for _, p := range listDeps(t, module+"/cmd/harness") {
		if slices.Contains(p.Deps, openaiRoot) {
			t.Errorf("%s depends on %s: construct the Responses service alone (responses.NewResponseService)", p.ImportPath, openaiRoot)
		}
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

// The harness links nothing under pkg/agentd: what it shares with
// the daemon lives in the pure engines (pkg/archive, pkg/userdb, pkg/patch),
// pkg/errkind and the wire contract (proto/bulkhead/agentd/v1, which is not
// under pkg/agentd).
func TestHarnessLinksNoDaemonInternals(t *testing.T) {
	for _, p := range listDeps(t, module+"/cmd/harness") {
		if !slices.Contains(p.Deps, module+"/pkg/archive") {
			t.Fatalf("%s does not list pkg/archive among its deps: this test is not looking at real dependency data", p.ImportPath)
		}
		forbid(t, p, "the harness links none of the daemon's internals", module+"/pkg/agentd")
	}
}

// The kubernetes provider links the API groups it uses and no other:
// client-go's typed clients (k8s.io/client-go/kubernetes/...) register
// every built-in group at init, about 12 MB of the harness, so it goes
// through client-go's REST client and gentype over a scheme of its own.
func TestKubernetesProviderLinksItsAPIGroupsOnly(t *testing.T) {
	groups := []string{"k8s.io/api/core/v1", "k8s.io/api/networking/v1", "k8s.io/api/rbac/v1"}
	for _, p := range listDeps(t, module+"/pkg/compute/kubernetes") {
		if !slices.Contains(p.Deps, "k8s.io/api/core/v1") {
			t.Fatalf("%s does not list k8s.io/api/core/v1: this test is not looking at real dependency data", p.ImportPath)
		}
		forbid(t, p, "client-go's typed clients and scheme link every API group; use the provider's own REST clientset (client.go)",
			"k8s.io/client-go/kubernetes", "k8s.io/client-go/applyconfigurations")
		for _, d := range p.Deps {
			if strings.HasPrefix(d, "k8s.io/api/") && !slices.Contains(groups, d) {
				t.Errorf("%s depends on %s: the provider links the API groups it uses only (%v)", p.ImportPath, d, groups)
			}
		}
	}
}

// The daemon is the untrusted side: its binary links nothing of the
// trusted side's tree (pkg/compute, pkg/harness), not even for a constant.
func TestDaemonLinksNothingOfTheTrustedSide(t *testing.T) {
	for _, p := range listDeps(t, module+"/cmd/sandbox-agentd") {
		if !slices.Contains(p.Deps, module+"/pkg/agentd/server") {
			t.Fatalf("%s does not list pkg/agentd/server among its deps: this test is not looking at real dependency data", p.ImportPath)
		}
		forbid(t, p, "the daemon links nothing of the trusted side", module+"/pkg/compute", module+"/pkg/harness", module+"/internal/cli")
	}
}

// The wire helpers (pkg/internal/wire: error mapping, the codec, the
// buffer pool) belong to the two ends of the daemon's wire: agentclient
// and the daemon's server. Go's internal rule keeps them inside pkg/; this
// keeps them to those two, tests included.
func TestWireHelpersStayOnTheWire(t *testing.T) {
	out, err := exec.Command("go", "list", "-test", "-json=ImportPath,Imports,TestImports,XTestImports", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := []string{module + "/pkg/compute/agentclient", module + "/pkg/agentd/server", module + "/pkg/internal/wire"}
	wire := module + "/pkg/internal/wire/"
	seen := false
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		// go list -test adds "pkg [pkg.test]" variants; judge the package by its path.
		path, _, _ := strings.Cut(p.ImportPath, " ")
		path = strings.TrimSuffix(path, "_test")
		path = strings.TrimSuffix(path, ".test")
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			imp, _, _ = strings.Cut(imp, " ")
			if !strings.HasPrefix(imp, wire) {
				continue
			}
			ok := slices.ContainsFunc(allowed, func(a string) bool { return path == a || strings.HasPrefix(path, a+"/") })
			seen = seen || path == module+"/pkg/compute/agentclient"
			if !ok {
				t.Errorf("%s imports %s: only agentclient and the daemon's server use the wire helpers", path, imp)
			}
		}
	}
	if !seen {
		t.Fatal("agentclient was not seen importing the wire helpers: this test is not looking at real import data")
	}
}

// The daemon's wire contract (proto/bulkhead/agentd/v1) stays on the
// wire: the harness's side speaks Go types (agentclient's, named again by
// compute.Session), so its messages are imported only by the two ends of
// the wire, their helpers and the contract itself, tests included. Each
// other importer is named here with its reason; testsOnly ones may import
// it from their tests, never from the package itself.
func TestWireTypesStayOnTheWire(t *testing.T) {
	const contract = module + "/proto/bulkhead/agentd/v1"
	allowed := map[string]string{ // package (and those below it) -> why
		"pkg/compute/agentclient":  "the harness's one client of the daemon: it converts the Go types to the wire and back",
		"pkg/agentd/server":        "the daemon's gRPC shim, whose tests check the wire",
		"pkg/internal/wire":        "the wire helpers of those two (errmap, wirecodec, bufpool)",
		"proto/bulkhead/agentd/v1": "the contract itself",
		"cmd/bench/internal/wireexec": "the exec path figure of `make bench` times the daemon's Exec with the raw generated client, " +
			"as it times the grpcfloor beside it, so that the daemon's own share carries no client library's work",
	}
	testsOnly := map[string]string{
		"cmd/sandbox-agentd":     "hostile_test.go speaks raw HTTP/2 to the daemon binary: it frames the wire's method names and messages itself",
		"pkg/compute/kubernetes": "pool_unit_test.go serves a fake daemon from before RotateToken, on the wire",
	}
	within := func(path string, set map[string]string) bool {
		for p := range set {
			if path == module+"/"+p || strings.HasPrefix(path, module+"/"+p+"/") {
				return true
			}
		}
		return false
	}
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		inPackage := slices.Contains(p.Imports, contract)
		inTests := slices.Contains(p.TestImports, contract) || slices.Contains(p.XTestImports, contract)
		if !inPackage && !inTests {
			continue
		}
		seen[p.ImportPath] = true
		switch {
		case within(p.ImportPath, allowed):
		case !inPackage && within(p.ImportPath, testsOnly):
		case inPackage:
			t.Errorf("%s imports the daemon's wire contract (%s): give it agentclient's Go types (compute.Session's methods)", p.ImportPath, contract)
		default:
			t.Errorf("%s's tests import the daemon's wire contract (%s): test through agentclient's Go types (compute.Session's methods)", p.ImportPath, contract)
		}
	}
	for _, p := range []string{"pkg/compute/agentclient", "pkg/agentd/server"} {
		if !seen[module+"/"+p] {
			t.Fatalf("%s was not seen importing %s: this test is not looking at real import data", p, contract)
		}
	}
	for p := range testsOnly {
		if !seen[module+"/"+p] {
			t.Errorf("%s's tests no longer import the wire contract: drop its exception", p)
		}
	}
}
