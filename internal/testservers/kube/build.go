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
	// that a cache entry built the old way is not reused.
	recipe = "r1"
)

// kubeCommands are the Kubernetes binaries built, in one go build.
var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}

// buildTimeout bounds a cold build (module download and compile of etcd
// and the four Kubernetes binaries on two cores: about 10 minutes).
const buildTimeout = 40 * time.Minute

// Bins are the paths of the built binaries.
type Bins struct {
	// Dir holds them all.
	Dir                                                    string
	Etcd, APIServer, ControllerManager, Scheduler, Kubelet string
	Pause                                                  string // the pause program (static, for the pause image)
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
	if b := os.Getenv("BULKHEAD_TESTSERVERS_DIR"); b != "" {
		return b, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kubeserver: user cache dir: %w", err)
	}
	return filepath.Join(c, "bulkhead", "testservers"), nil
}

// Binaries returns the cluster's binaries, building them first if the
// cache does not hold them: etcd and the Kubernetes binaries from the Go
// module proxy (through throwaway wrapper modules, since `go install`
// refuses modules with replace directives), plus the pause program. A
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
	// Builds hold the lock: any build directory left is from a build
	// whose process died.
	if old, err := filepath.Glob(filepath.Join(base, ".build-kube-*")); err == nil {
		for _, d := range old {
			_ = os.RemoveAll(d)
		}
	}
	tmp, err := os.MkdirTemp(base, ".build-kube-")
	if err != nil {
		return Bins{}, fmt.Errorf("kubeserver: %w", err)
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	out := filepath.Join(tmp, "bin")
	start := time.Now()
	if err := buildEtcd(ctx, filepath.Join(tmp, "etcdwrap"), out); err != nil {
		return Bins{}, err
	}
	logf("kubeserver: built etcd %s in %s", EtcdVersion, time.Since(start).Round(time.Second))
	t := time.Now()
	if err := buildKube(ctx, filepath.Join(tmp, "kubewrap"), out); err != nil {
		return Bins{}, err
	}
	logf("kubeserver: built Kubernetes %s (%s) in %s", KubernetesVersion, strings.Join(kubeCommands, ", "), time.Since(t).Round(time.Second))
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

func buildEtcd(ctx context.Context, dir, out string) error {
	const pkg = "go.etcd.io/etcd/server/v3"
	if err := wrapper(dir, "module example.invalid/etcdwrap\n\ngo 1.24\n", []string{pkg}); err != nil {
		return err
	}
	if _, err := goCmd(ctx, dir, "get", pkg+"@"+EtcdVersion); err != nil {
		return err
	}
	_, err := goCmd(ctx, dir, "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(out, "etcd"), pkg)
	return err
}

// stagingRe matches a replace line of k8s.io/kubernetes' go.mod that points
// a staging module at the source tree.
var stagingRe = regexp.MustCompile(`^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/`)

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
	fmt.Fprintf(&gomod, "module example.invalid/kubewrap\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", KubernetesVersion)
	for _, m := range staging {
		fmt.Fprintf(&gomod, "\t%s => %s %s\n", m, m, stagingVersion)
	}
	gomod.WriteString(")\n")
	pkgs := make([]string, len(kubeCommands))
	for i, c := range kubeCommands {
		pkgs[i] = "k8s.io/kubernetes/cmd/" + c
	}
	if err := wrapper(dir, gomod.String(), pkgs); err != nil {
		return err
	}
	if _, err := goCmd(ctx, dir, "mod", "tidy"); err != nil {
		return err
	}
	const v = "k8s.io/component-base/version"
	minor := strings.Split(KubernetesVersion, ".")[1]
	ldflags := fmt.Sprintf("-s -w -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean",
		v, KubernetesVersion, v, v, minor, v)
	// One invocation, so the four commands share their compiled packages.
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", out + string(filepath.Separator)}, pkgs...)
	_, err = goCmd(ctx, dir, args...)
	return err
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
