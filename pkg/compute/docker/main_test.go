package docker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
)

// testEnv is decided once by TestMain: whether the Docker tests run, skip
// or fail, and the label that marks everything this test run creates.
var testEnv struct {
	skip     string // non-empty: skip Docker tests with this line
	fatal    string // non-empty: fail Docker tests with this (CI with Docker)
	fullErr  string // the full image could not be built
	runLabel string // value of runLabelKey for this run
}

const runLabelKey = "test.bulkhead.run"

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	testEnv.runLabel = hex.EncodeToString(b)
	ci := os.Getenv("CI") == "true"

	api, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = api.Ping(ctx)
		cancel()
	}
	if err != nil {
		if ci && dockerCLIAnswers() {
			testEnv.fatal = fmt.Sprintf("CI=true and `docker info` answers, but the Engine API does not: %v", err)
		} else {
			testEnv.skip = fmt.Sprintf("Docker is not available (%v): skipping the Docker provider tests", err)
		}
		return m.Run()
	}
	defer api.Close()

	if os.Getenv("BULKHEAD_TEST_NO_IMAGE_BUILD") != "1" {
		if err := makeImage("image-sandbox"); err != nil {
			if ci {
				testEnv.fatal = "building the sandbox image failed: " + err.Error()
			} else {
				testEnv.skip = "building the sandbox image failed (run `make image` to see why): " + firstLine(err.Error())
			}
			return m.Run()
		}
		if err := makeImage("image-sandbox-full"); err != nil {
			testEnv.fullErr = err.Error()
		}
	}

	code := m.Run()
	if leaked := cleanupRun(api); leaked != "" {
		fmt.Fprintln(os.Stderr, "FAIL: the tests leaked Docker objects (now removed):", leaked)
		code = 1
	}
	return code
}

// dockerCLIAnswers reports whether `docker info` succeeds.
func dockerCLIAnswers() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "docker", "info").Run() == nil
}

// makeImage runs a Makefile image target at the repository root. It is a
// no-op (a few seconds) when the images are up to date.
func makeImage(target string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", root, target)
	env := []string{}
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES":
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("make %s: %w\n%s", target, err, tail(out.String(), 40))
	}
	fmt.Fprintf(os.Stderr, "docker tests: make %s: %s\n", target, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test directory")
		}
		dir = parent
	}
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// cleanupRun removes every container and volume of this test run and says
// which there were (the tests clean up after themselves, so any is a leak).
func cleanupRun(api *client.Client) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", runLabelKey+"="+testEnv.runLabel))
	var leaked []string
	if cs, err := api.ContainerList(ctx, container.ListOptions{All: true, Filters: f}); err == nil {
		for _, c := range cs {
			leaked = append(leaked, "container "+strings.Join(c.Names, ","))
			_ = api.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	}
	if vs, err := api.VolumeList(ctx, volume.ListOptions{Filters: f}); err == nil {
		for _, v := range vs.Volumes {
			leaked = append(leaked, "volume "+v.Name)
			_ = api.VolumeRemove(ctx, v.Name, true)
		}
	}
	return strings.Join(leaked, ", ")
}

// needDocker skips or fails a test as TestMain decided.
func needDocker(t *testing.T) {
	t.Helper()
	if testEnv.fatal != "" {
		t.Fatal(testEnv.fatal)
	}
	if testEnv.skip != "" {
		t.Skip(testEnv.skip)
	}
}

// needFullImage also needs bulkhead/sandbox-full:dev.
func needFullImage(t *testing.T) {
	t.Helper()
	needDocker(t)
	if testEnv.fullErr != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("building bulkhead/sandbox-full:dev failed: " + testEnv.fullErr)
		}
		t.Skip("building bulkhead/sandbox-full:dev failed (run `make image`): " + firstLine(testEnv.fullErr))
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
