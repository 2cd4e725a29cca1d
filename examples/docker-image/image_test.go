// Package dockerimage holds the test of the docker-image example: build.sh
// bakes a freshly built sandbox-agentd into a local base image, and the
// daemon answers inside it, both alone and as a Docker provider sandbox.
package dockerimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// bases are the images the test extends, in order of preference; `make
// image` builds them locally.
var bases = []string{"bulkhead/sandbox-full:dev", "bulkhead/sandbox:dev"}

// availableBase returns the first base image present. A Docker that does
// not answer skips the test (testenv.Docker, CI included); with a working
// Docker, no base image is a missing part (run `make image`): it skips,
// or fails under CI=true.
func availableBase(t *testing.T) string {
	t.Helper()
	testenv.Require(t, testenv.Docker)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, b := range bases {
		if exec.CommandContext(ctx, "docker", "image", "inspect", b).Run() == nil {
			return b
		}
	}
	testenv.Skip(t, "neither "+strings.Join(bases, " nor ")+" is in the local image store (run `make image`)")
	return ""
}

func TestImage(t *testing.T) {
	base := availableBase(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	tag := "bulkhead/example-agentd:test-" + suffix
	version := "example-" + suffix

	// Build from a tag of the test's own: another package's `make image`
	// may import the base again meanwhile, and images/build.sh then
	// removes the image the base's tag pointed at, unless another tag
	// holds it (a build in progress does not).
	pinned := "bulkhead/example-base:test-" + suffix
	if out, err := exec.Command("docker", "image", "tag", base, pinned).CombinedOutput(); err != nil {
		t.Fatalf("docker image tag %s %s: %v\n%s", base, pinned, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "image", "rm", pinned).Run() })

	// Build with the example's script, stamping a version no other binary
	// has, so the daemon that answers is the one just copied in.
	build := exec.Command("./build.sh", pinned, tag)
	build.Env = append(os.Environ(), "VERSION="+version, "COMMIT=test")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build.sh %s %s: %v\n%s", pinned, tag, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "image", "rm", "--force", tag).Run() })

	out, err := exec.Command("docker", "run", "--rm", "--network", "none", tag, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "sandbox-agentd "+version+" (test)" {
		t.Fatalf("docker run %s --version: %v\n%s", tag, err, out)
	}

	// The image is a working sandbox: the Docker provider runs it with
	// its own arguments, and the daemon creates the manifest's account and
	// runs a command as it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	dir, err := os.MkdirTemp("", "bh-image-") // short: unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Labelled as this test's own: nothing else on the engine is looked at.
	p, err := docker.New(docker.Config{Image: tag, StateDir: dir, Labels: map[string]string{"test.bulkhead.run": suffix}}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	client := compute.NewClient(p, compute.ClientOptions{Log: log})
	sess, err := client.Create(ctx, compute.CreateOptions{Manifest: &manifest.Manifest{
		Users: []manifest.User{{Name: "analyst"}},
		RunAs: "analyst",
		Entries: map[string]*manifest.Entry{
			"hello.txt": {Type: manifest.TypeFile, Content: []byte("hello from the image\n")},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the image's removal, so it runs first.
	t.Cleanup(func() { _ = client.Delete(context.Background(), sess) })
	if err := sess.Start(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := sess.Agent().Info(ctx)
	if err != nil || info.Version != version {
		t.Fatalf("the sandbox's daemon: %v, version %q, want %q", err, info.Version, version)
	}
	res, err := sess.Exec(ctx, compute.ProcessSpec{
		Command: "id -un && cat hello.txt",
		User:    "analyst",
	}, compute.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(bytes.TrimSpace(res.Stdout)); res.Exit.ExitCode != 0 || got != "analyst\nhello from the image" {
		t.Fatalf("exit %d, stdout %q, stderr %q", res.Exit.ExitCode, res.Stdout, res.Stderr)
	}
}
