// Package e2e proves the whole path the way users run it: the real harness
// and sandbox-agentd binaries, built once by TestMain; the CLI driven as a
// process and the Go library driven directly; the scripted Responses server
// standing in for the model through the real openai-go client; and every
// provider that is available here (local, local isolated with bubblewrap,
// Docker with the locally built images). Tests assert on files, exit codes
// and outputs, never on logs.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// env is decided once by TestMain.
var env struct {
	bin        string // directory with harness and sandbox-agentd
	repo       string // repository root
	dockerSkip string // non-empty: why Docker scenarios skip
	dockerFail string // non-empty: why Docker scenarios fail (CI with Docker)
	bwrapSkip  string // non-empty: why bubblewrap scenarios skip
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	_, file, _, _ := runtime.Caller(0)
	env.repo = filepath.Dir(filepath.Dir(file))
	dir, err := os.MkdirTemp("", "bulkhead-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	env.bin = dir
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "./cmd/harness", "./cmd/sandbox-agentd")
	build.Dir = env.repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: build binaries: %v\n%s", err, out)
		return 1
	}
	ci := os.Getenv("CI") == "true"
	if _, err := exec.LookPath("bwrap"); err != nil {
		env.bwrapSkip = "bwrap (bubblewrap) is not installed: skipping the isolated local provider"
		if ci {
			env.bwrapSkip = ""
		}
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		env.dockerSkip = "Docker does not answer (`docker info` failed): skipping the Docker provider"
	} else {
		mk := exec.Command("make", "image-sandbox", "image-sandbox-full")
		mk.Dir = env.repo
		if out, err := mk.CombinedOutput(); err != nil {
			msg := fmt.Sprintf("make image failed: %v\n%s", err, tail(string(out), 20))
			if ci {
				env.dockerFail = msg
			} else {
				env.dockerSkip = msg
			}
		}
	}
	return m.Run()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// provider is one way of running sandboxes in the scenarios.
type provider struct {
	name string
	// args select it on the harness command line.
	args []string
	// users reports whether sandboxes can create accounts.
	users bool
	// client makes a library client over it (state under dir).
	client func(t *testing.T, dir string, store snapshot.Store, mat materializer.Options) *compute.Client
	// skip says why it is unavailable here ("" when available).
	skip func(t *testing.T)
}

// providers returns every provider, in a stable order.
func providers() []provider {
	localClient := func(iso local.Isolation) func(t *testing.T, dir string, store snapshot.Store, mat materializer.Options) *compute.Client {
		return func(t *testing.T, dir string, store snapshot.Store, mat materializer.Options) *compute.Client {
			log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
			c, err := local.NewClient(local.Config{StateDir: filepath.Join(dir, "local"), AgentdPath: filepath.Join(env.bin, "sandbox-agentd"), Isolation: iso},
				compute.ClientOptions{Snapshots: store, Materializer: mat, Log: log})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	return []provider{
		{name: "local", args: []string{"--provider", "local", "--isolation", "none"}, users: os.Geteuid() == 0,
			client: localClient(local.IsolationNone), skip: func(*testing.T) {}},
		{name: "local-bwrap", args: []string{"--provider", "local", "--isolation", "bubblewrap"}, users: os.Geteuid() == 0,
			client: localClient(local.IsolationBubblewrap), skip: func(t *testing.T) {
				if env.bwrapSkip != "" {
					t.Skip(env.bwrapSkip)
				}
			}},
		{name: "docker", args: []string{"--provider", "docker"}, users: true,
			client: func(t *testing.T, dir string, store snapshot.Store, mat materializer.Options) *compute.Client {
				log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
				p, err := docker.New(docker.Config{StateDir: filepath.Join(dir, "docker")}, log)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close() })
				return compute.NewClient(p, compute.ClientOptions{Snapshots: store, Materializer: mat, Log: log})
			},
			skip: func(t *testing.T) {
				if env.dockerFail != "" {
					t.Fatal(env.dockerFail)
				}
				if env.dockerSkip != "" {
					t.Skip(env.dockerSkip)
				}
			}},
	}
}

// stateDir returns a short state directory (unix socket paths are short).
func stateDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "bh-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	// Sandbox accounts must pass through to the workspaces.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// harness runs the harness binary and returns its output and exit code.
func harness(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.bin, "harness"), args...)
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY=")
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("harness %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
