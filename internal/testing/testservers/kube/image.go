package kubeserver

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// PauseImage is the sandbox ("pause") image of the node's containerd: the
// pause program, built locally, in an image FROM scratch. Its program
// also serves HTTP when run as `/pause serve ADDR` (see pauseSource), so a
// test can run a Pod from it with no registry and no Docker.
const PauseImage = "bulkhead.local/pause:1"

// pauseSource is the pause program: PID 1 of every Pod sandbox. It reaps
// children and exits on SIGTERM or SIGINT. `pause serve ADDR` instead
// serves HTTP on ADDR, answering every request with "bulkhead-pause
// HOSTNAME\n" (a tiny server for tests).
const pauseSource = `package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "serve" {
		host, _ := os.Hostname()
		err := http.ListenAndServe(os.Args[2], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "bulkhead-pause %s\n", host)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var st syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
`

// imageFile is one file of a single-layer image.
type imageFile struct {
	Path string
	Mode int64
	Data []byte
}

// scratchImage writes to w a `docker save` style archive of a one-layer
// image FROM scratch named ref, holding files, with entrypoint.
func scratchImage(w io.Writer, ref string, entrypoint []string, files []imageFile) error {
	var layer bytes.Buffer
	lt := tar.NewWriter(&layer)
	mtime := time.Unix(0, 0)
	for _, f := range files {
		if err := lt.WriteHeader(&tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: f.Mode, Size: int64(len(f.Data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := lt.Write(f.Data); err != nil {
			return err
		}
	}
	if err := lt.Close(); err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerID := hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
	})
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config": configName, "RepoTags": []string{ref}, "Layers": []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerID + "/layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// importPause puts the pause image into the node's containerd.
func (c *Cluster) importPause(ctx context.Context) error {
	bin, err := os.ReadFile(c.bins.Pause)
	if err != nil {
		return fmt.Errorf("kubeserver: pause image: %w", err)
	}
	var archive bytes.Buffer
	if err := scratchImage(&archive, PauseImage, []string{"/pause"}, []imageFile{{Path: "/pause", Mode: 0o755, Data: bin}}); err != nil {
		return fmt.Errorf("kubeserver: pause image: %w", err)
	}
	return c.ImportArchive(ctx, &archive)
}

// ImportArchive imports an image archive (the `docker save` format, or an
// OCI archive) into the node's containerd, where Pods can run it with
// imagePullPolicy IfNotPresent or Never.
func (c *Cluster) ImportArchive(ctx context.Context, r io.Reader) error {
	cmd := exec.CommandContext(ctx, "ctr", "--address", c.containerdSock, "--namespace", "k8s.io", "images", "import", "--no-unpack=false", "-")
	cmd.Stdin = r
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubeserver: ctr images import: %w: %s", err, tail(out))
	}
	return nil
}

// LoadImage makes the local Docker image ref (for instance
// bulkhead/sandbox:dev, built by `make image`) runnable by the node: it is
// exported with `docker save` and imported into the node's containerd. A
// reference without a registry is named docker.io/... there, as the
// kubelet names it.
func (c *Cluster) LoadImage(t testing.TB, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.LoadDockerImage(ctx, ref); err != nil {
		t.Fatalf("%v", err)
	}
}

// LoadDockerImage is LoadImage with a context and an error.
func (c *Cluster) LoadDockerImage(ctx context.Context, ref string) error {
	save := exec.CommandContext(ctx, "docker", "save", ref)
	out, err := save.StdoutPipe()
	if err != nil {
		return fmt.Errorf("kubeserver: docker save %s: %w", ref, err)
	}
	var stderr bytes.Buffer
	save.Stderr = &stderr
	if err := save.Start(); err != nil {
		return fmt.Errorf("kubeserver: docker save %s: %w", ref, err)
	}
	ierr := c.ImportArchive(ctx, out)
	_, _ = io.Copy(io.Discard, out)
	if err := save.Wait(); err != nil {
		return fmt.Errorf("kubeserver: docker save %s: %w: %s", ref, err, strings.TrimSpace(stderr.String()))
	}
	if ierr != nil {
		return fmt.Errorf("kubeserver: load %s: %w", ref, ierr)
	}
	return nil
}
