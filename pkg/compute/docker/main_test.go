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

	"github.com/moby/moby/client"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// testEnv is decided once by TestMain: what stops the Docker tests (each
// test then skips or fails through testenv), and the label that marks
// everything this test run creates.
var testEnv struct {
	noAPI    string // non-empty: the Engine API does not answer
	imageErr string // non-empty: the sandbox image could not be built
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

	api, err := client.New(client.FromEnv)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = api.Ping(ctx, client.PingOptions{})
		cancel()
	}
	if err != nil {
		testEnv.noAPI = fmt.Sprintf("the Docker Engine API does not answer: %v", err)
		return m.Run()
	}
	defer api.Close()

	if os.Getenv("BULKHEAD_TEST_NO_IMAGE_BUILD") != "1" {
		if err := makeImage("image-sandbox"); err != nil {
			testEnv.imageErr = err.Error()
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
	f := make(client.Filters).Add("label", runLabelKey+"="+testEnv.runLabel)
	var leaked []string
	if cs, err := api.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err == nil {
		for _, c := range cs.Items {
			leaked = append(leaked, "container "+strings.Join(c.Names, ","))
			_, _ = api.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		}
	}
	if vs, err := api.VolumeList(ctx, client.VolumeListOptions{Filters: f}); err == nil {
		for _, v := range vs.Items {
			leaked = append(leaked, "volume "+v.Name)
			_, _ = api.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true})
		}
	}
	return strings.Join(leaked, ", ")
}

// needDocker skips or fails a test as TestMain's findings say: no Docker
// at all skips it, CI included (testenv.Docker); a Docker whose CLI
// answers but whose Engine API does not, or a failed image build, is a
// missing part: a skip, or a failure under CI=true.
func needDocker(t *testing.T) {
	t.Helper()
	if testEnv.noAPI != "" {
		testenv.Require(t, testenv.Docker)
		testenv.Skip(t, testEnv.noAPI)
	}
	if testEnv.imageErr != "" {
		testenv.Skip(t, "building the sandbox image failed (run `make image`): "+testEnv.imageErr)
	}
}

// needFullImage also needs bulkhead/sandbox-full:dev.
func needFullImage(t *testing.T) {
	t.Helper()
	needDocker(t)
	if testEnv.fullErr != "" {
		testenv.Skip(t, "building bulkhead/sandbox-full:dev failed (run `make image`): "+testEnv.fullErr)
	}
}
