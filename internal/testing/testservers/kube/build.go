package kubeserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gotool"
)

// Versions the cluster runs. Kubernetes 1.34 is deliberate: it is the last
// minor whose kubelet accepts cgroup v1 without being told to
// (failCgroupV1 defaults to true from 1.35), and containerd 1.x (Debian
// bookworm ships 1.6) is still a supported runtime for it. etcd 3.6 is the
// series Kubernetes 1.34 is released with.
const (
	KubernetesVersion = "v1.34.4"
	EtcdVersion       = "v3.6.16"
	// recipe changes whenever the way the binaries are built changes, so
	// that a cache entry built the old way is not reused (r2: etcd and the
	// NetworkPolicy enforcer built in the same go build as Kubernetes).
	recipe = "r2"
)

// kubeCommands are the Kubernetes binaries built, in one go build.
var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}

// etcdModule is etcd's server module, whose root is etcd's main package.
const etcdModule = "go.etcd.io/etcd/server/v3"

// buildTimeout bounds a cold build (module download and compile of etcd,
// the four Kubernetes binaries and the enforcer: about 12 CPU-minutes; 14
// minutes of wall time on two cores beside CI's other cold builds).
const buildTimeout = 40 * time.Minute

// Bins are the paths of the built binaries.
type Bins struct {
	// Dir holds them all.
	Dir                                                    string
	Etcd, APIServer, ControllerManager, Scheduler, Kubelet string
	Pause                                                  string // the pause program (static, for the pause image)
	NetworkPolicy                                          string // the NetworkPolicy enforcer (netpol.go)
}

func binsIn(dir string) Bins {
	return Bins{
		Dir:               dir,
		Etcd:              filepath.Join(dir, "etcd"),
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		Scheduler:         filepath.Join(dir, "kube-scheduler"),
		Kubelet:           filepath.Join(dir, "kubelet"),
		Pause:             filepath.Join(dir, "pause"),
		NetworkPolicy:     filepath.Join(dir, netpolName),
	}
}

// CacheDir is where the binaries of this version live:
// DIR/bulkhead/testservers/kube-VERSION-... under the user cache directory
// (BULKHEAD_TESTSERVERS_DIR overrides DIR/bulkhead/testservers).
func CacheDir() (string, error) {
	base, err := cacheBase()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, cacheKey()), nil
}

func cacheKey() string {
	return "kube-" + KubernetesVersion + "-etcd-" + EtcdVersion + "-" + recipe + "-" + runtime.GOOS + "-" + runtime.GOARCH
}

func cacheBase() (string, error) {
	base, err := gotool.CacheDir()
	if err != nil {
		return "", fmt.Errorf("kubeserver: %w", err)
	}
	return base, nil
}

// Binaries returns the cluster's binaries, building them first if the
// cache does not hold them: the Kubernetes binaries, etcd and the
// NetworkPolicy enforcer from the Go module proxy, in one go build of a
// throwaway wrapper module (`go install` refuses modules with replace
// directives, and one build compiles the packages the three share, gRPC,
// protobuf, client-go and etcd's client among them, once), plus the pause
// program. A
// file lock makes test binaries running in parallel wait for one build;
// the finished directory is renamed into place, so a half-built cache is
// never seen. logf (may be nil) hears progress.
func Binaries(ctx context.Context, logf func(string, ...any)) (Bins, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir, err := CacheDir()
	if err != nil {
		return Bins{}, err
	}
	b := binsIn(dir)
	defer tidyCache(dir)
	if complete(dir) {
		return b, nil
	}
	base := filepath.Dir(dir)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return Bins{}, fmt.Errorf("kubeserver: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(base, cacheKey()+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Bins{}, fmt.Errorf("kubeserver: lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Bins{}, fmt.Errorf("kubeserver: lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing the file unlocks too
	if complete(dir) {
		return b, nil // another process built them while we waited
	}
	_ = os.RemoveAll(dir) // an incomplete leftover (cannot happen through rename, but be sure)
	// Builds hold the lock: any build directory of this cache entry left
	// is from a build whose process died.
	if old, err := filepath.Glob(filepath.Join(base, ".build-"+cacheKey()+"-*")); err == nil {
		for _, d := range old {
			_ = os.RemoveAll(d)
		}
	}
	tmp, err := os.MkdirTemp(base, ".build-"+cacheKey()+"-")
	if err != nil {
		return Bins{}, fmt.Errorf("kubeserver: %w", err)
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	out := filepath.Join(tmp, "bin")
	start := time.Now()
	if err := buildKube(ctx, filepath.Join(tmp, "kubewrap"), out); err != nil {
		return Bins{}, err
	}
	logf("kubeserver: built Kubernetes %s (%s), etcd %s and kube-network-policies %s in %s", KubernetesVersion,
		strings.Join(kubeCommands, ", "), EtcdVersion, NetworkPolicyVersion, time.Since(start).Round(time.Second))
	if err := buildPause(ctx, filepath.Join(tmp, "pausesrc"), filepath.Join(out, "pause")); err != nil {
		return Bins{}, err
	}
	if err := os.WriteFile(filepath.Join(out, ".complete"), []byte(time.Since(start).Round(time.Second).String()+"\n"), 0o644); err != nil {
		return Bins{}, fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.Rename(out, dir); err != nil {
		return Bins{}, fmt.Errorf("kubeserver: install the binaries: %w", err)
	}
	return b, nil
}

// tidyCache marks the cache entry dir used (when it is complete) and
// removes the entries of other Kubernetes versions or build recipes that
// were not used for gotool.StaleAfter (about 1 GB each). Failures are
// ignored: the cache stays usable.
func tidyCache(dir string) {
	now := time.Now()
	if complete(dir) {
		gotool.MarkUsed(dir, now)
	}
	_, _ = gotool.PruneStale(filepath.Dir(dir), "kube-", filepath.Base(dir), gotool.StaleAfter, now)
}

// Built reports whether the binaries are in the cache already.
func Built() bool {
	dir, err := CacheDir()
	return err == nil && complete(dir)
}

func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ".complete"))
	return err == nil
}

// goCmd runs the go command in dir with a clean module setup.
func goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("kubeserver: building the cluster needs the go command on PATH: %w", err)
	}
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=mod -buildvcs=false")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubeserver: go %s: %w\n%s", strings.Join(args, " "), err, tail(out))
	}
	return out, nil
}

// wrapper writes a throwaway module in dir that imports pkgs under a
// build tag (so `go mod tidy` keeps their requirements).
func wrapper(dir, gomod string, pkgs []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	var tools strings.Builder
	tools.WriteString("//go:build tools\n\npackage tools\n\nimport (\n")
	for _, p := range pkgs {
		fmt.Fprintf(&tools, "\t_ %q\n", p)
	}
	tools.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tools.go"), []byte(tools.String()), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return nil
}

// stagingRe matches a replace line of k8s.io/kubernetes' go.mod that points
// a staging module at the source tree.
var stagingRe = regexp.MustCompile(`^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/`)

// buildKube builds the Kubernetes commands, etcd and the NetworkPolicy
// enforcer into out in one go build of a wrapper module in dir that
// requires all three (etcd at EtcdVersion, the enforcer's module at
// NetworkPolicyVersion, patched; Kubernetes' staging modules at their
// release versions).
func buildKube(ctx context.Context, dir, out string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	// k8s.io/kubernetes' own go.mod names its staging modules; the proxy
	// serves each of them as k8s.io/X v0.MINOR.PATCH.
	dl, err := goCmd(ctx, dir, "mod", "download", "-json", "k8s.io/kubernetes@"+KubernetesVersion)
	if err != nil {
		return err
	}
	var info struct{ GoMod, Error string }
	if err := json.Unmarshal(dl, &info); err != nil || info.GoMod == "" {
		return fmt.Errorf("kubeserver: go mod download k8s.io/kubernetes@%s: %v %s", KubernetesVersion, err, info.Error)
	}
	staging, err := stagingModules(info.GoMod)
	if err != nil {
		return err
	}
	stagingVersion := "v0" + strings.TrimPrefix(KubernetesVersion, "v1")
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module example.invalid/kubewrap\n\ngo 1.24.0\n\nrequire (\n\tk8s.io/kubernetes %s\n\t%s %s\n\t%s %s\n)\n\nreplace (\n",
		KubernetesVersion, etcdModule, EtcdVersion, netpolModule, NetworkPolicyVersion)
	for _, m := range staging {
		fmt.Fprintf(&gomod, "\t%s => %s %s\n", m, m, stagingVersion)
	}
	gomod.WriteString(")\n")
	pkgs := make([]string, 0, len(kubeCommands)+2)
	for _, c := range kubeCommands {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c)
	}
	pkgs = append(pkgs, etcdModule)
	if err := wrapper(dir, gomod.String(), pkgs); err != nil {
		return err
	}
	// The enforcer's main is a package of the wrapper module.
	if err := os.MkdirAll(filepath.Join(dir, netpolName), 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, netpolName, "main.go"), []byte(netpolMain), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if _, err := goCmd(ctx, dir, "mod", "tidy"); err != nil {
		return err
	}
	// What the other requirements pulled in must not move etcd or the
	// enforcer off the versions the cache is named after.
	for mod, want := range map[string]string{etcdModule: EtcdVersion, netpolModule: NetworkPolicyVersion} {
		if got, err := moduleVersion(ctx, dir, mod); err != nil {
			return err
		} else if got.Version != want {
			return fmt.Errorf("kubeserver: %s resolved to %s, not %s: the recipe in build.go needs updating", mod, got.Version, want)
		}
	}
	if err := patchNetpol(ctx, dir); err != nil {
		return err
	}
	const v = "k8s.io/component-base/version"
	minor := strings.Split(KubernetesVersion, ".")[1]
	ldflags := fmt.Sprintf("-s -w -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean",
		v, KubernetesVersion, v, v, minor, v)
	// One invocation, so the commands share their compiled packages.
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", out + string(filepath.Separator)}, pkgs...)
	args = append(args, "./"+netpolName)
	if _, err := goCmd(ctx, dir, args...); err != nil {
		return err
	}
	// go names a main package after its path's last element before a
	// major version suffix: etcd's is "server".
	if err := os.Rename(filepath.Join(out, "server"), filepath.Join(out, "etcd")); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	return nil
}

// moduleVersion is `go list -m -json mod` in the module at dir.
func moduleVersion(ctx context.Context, dir, mod string) (struct{ Dir, Version string }, error) {
	var m struct{ Dir, Version string }
	b, err := goCmd(ctx, dir, "list", "-m", "-json", mod)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Dir == "" {
		return m, fmt.Errorf("kubeserver: go list -m %s: %v: %s", mod, err, tail(b))
	}
	return m, nil
}

// stagingModules lists the modules that k8s.io/kubernetes' go.mod (at path)
// replaces with its staging directories.
func stagingModules(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kubeserver: %w", err)
	}
	defer f.Close()
	var mods []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := stagingRe.FindStringSubmatch(sc.Text()); m != nil {
			mods = append(mods, m[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kubeserver: read %s: %w", path, err)
	}
	if len(mods) == 0 {
		return nil, errors.New("kubeserver: k8s.io/kubernetes' go.mod replaces no staging module: the build recipe needs updating")
	}
	return mods, nil
}

func buildPause(ctx context.Context, dir, out string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.invalid/pause\n\ngo 1.24\n"), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(pauseSource), 0o644); err != nil {
		return fmt.Errorf("kubeserver: %w", err)
	}
	_, err := goCmd(ctx, dir, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, ".")
	return err
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 3000 {
		s = "..." + s[len(s)-3000:]
	}
	return s
}
