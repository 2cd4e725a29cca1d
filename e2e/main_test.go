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
	"crypto/rand"
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

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// env is decided once by TestMain.
var env struct {
	repo     string // repository root
	imageErr string // non-empty: why `make image` failed (Docker answers)
	// runLabel marks every Docker container and volume of this test run
	// (runLabelKey=runLabel): the tests list, find and clean up only
	// those, never the user's own sandboxes.
	runLabel string
}

// runLabelKey is the label of a test run's Docker objects.
const runLabelKey = "test.bulkhead.run"

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	env.repo = filepath.Dir(filepath.Dir(file))
	env.runLabel = rand.Text()
	// The Docker scenarios need the sandbox images: build them once here,
	// when Docker answers (testenv decides, per test, what a missing Docker
	// or a failed build means).
	dockerUp := exec.Command("docker", "info").Run() == nil
	if dockerUp {
		mk := exec.Command("make", "image-sandbox", "image-sandbox-full")
		mk.Dir = env.repo
		if out, err := mk.CombinedOutput(); err != nil {
			env.imageErr = fmt.Sprintf("make image failed: %v\n%s", err, tail(string(out), 20))
		}
	}
	code := agentdtest.Run(m)
	if dockerUp {
		if leaked, err := removeDockerLeaks(); err != nil || leaked != "" {
			fmt.Fprintf(os.Stderr, "FAIL: the tests left Docker sandboxes (now removed): %s %v\n", leaked, err)
			code = 1
		}
	}
	os.Exit(code)
}

// removeDockerLeaks destroys the sandboxes of this test run (its label)
// that the tests left, and names them; nothing else is looked at.
func removeDockerLeaks() (string, error) {
	dir, err := os.MkdirTemp("", "bh-e2e-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	p, err := docker.New(dockerConfig(dir), zap.NewNop())
	if err != nil {
		return "", err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	infos, err := p.List(ctx)
	var leaked []string
	for _, info := range infos {
		leaked = append(leaked, info.SessionID)
		_ = p.Destroy(ctx, info.State)
	}
	return strings.Join(leaked, ", "), err
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
			c, err := local.NewClient(local.Config{StateDir: filepath.Join(dir, "local"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: iso},
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
				testenv.Require(t, testenv.Bubblewrap)
			}},
		{name: "docker", args: []string{"--provider", "docker", "--label", runLabelKey + "=" + env.runLabel}, users: true,
			client: func(t *testing.T, dir string, store snapshot.Store, mat materializer.Options) *compute.Client {
				log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
				p, err := docker.New(dockerConfig(dir), log)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close() })
				return compute.NewClient(p, compute.ClientOptions{Snapshots: store, Materializer: mat, Log: log})
			},
			skip: func(t *testing.T) {
				testenv.Require(t, testenv.Docker)
				if env.imageErr != "" {
					testenv.Skip(t, env.imageErr)
				}
			}},
	}
}

// dockerConfig is the Docker provider's configuration for a test: its own
// state directory under dir and this run's label.
func dockerConfig(dir string) docker.Config {
	return docker.Config{StateDir: filepath.Join(dir, "docker"), Labels: map[string]string{runLabelKey: env.runLabel}}
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
	cmd := exec.CommandContext(ctx, agentdtest.Harness(t).Harness(), args...)
	// Private cache and state homes: a command that forgot --state-dir
	// must not reach the user's own sandboxes.
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY=", "XDG_CACHE_HOME="+t.TempDir(), "XDG_STATE_HOME="+t.TempDir())
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

// reapAll deletes every sandbox left in a local provider's state
// directory (those of a service the test stopped, which keeps them for
// its next start).
func reapAll(t *testing.T, cfg local.Config) {
	t.Helper()
	p, err := local.New(cfg, zap.NewNop())
	if err != nil {
		t.Errorf("reap the sandboxes left in %s: %v", cfg.StateDir, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	left, err := p.List(ctx)
	if err != nil {
		t.Errorf("list the sandboxes left in %s: %v", cfg.StateDir, err)
	}
	t.Logf("deleting the %d sandboxes the service left in %s", len(left), cfg.StateDir)
	for _, info := range left {
		if err := p.Destroy(ctx, info.State); err != nil {
			t.Errorf("delete sandbox %s left by the service: %v", info.ID, err)
		}
	}
}
