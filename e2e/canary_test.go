package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// canaryRun is one harness process started for the canary attack.
type canaryRun struct {
	name string
	args []string
	// uid, when non-zero, runs the harness as that user (a non-root
	// harness: its sandbox processes run as the same uid).
	uid uint32
	// harnessVisible: the sandbox shares the harness's pid namespace, so
	// the probe must see the harness process (and be denied).
	harnessVisible bool
	// separateUser: sandbox processes must not run as root.
	separateUser bool
	// gvisor: the harness finds runsc (built from the module proxy) on PATH.
	gvisor bool
}

// TestSecretCanary runs the attack that found the first promise broken: a
// harness process holding a model API key (the canary) runs a task whose
// command, in the sandbox, reads the environment, command line, memory and
// open files of every process it can see. On every provider and isolation
// mode, with a root and (for plain local sandboxes) a non-root harness,
// the canary must not be found, and sandbox processes must not run as
// root by default.
func TestSecretCanary(t *testing.T) {
	// Readable by the unprivileged harness below (t.TempDir's parent is 0700).
	probeDir, err := os.MkdirTemp("", "bh-e2e-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(probeDir) })
	if err := os.Chmod(probeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(probeDir, "canaryprobe"), "./e2e/testdata/canaryprobe")
	build.Dir = env.repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	manifestPath := filepath.Join(probeDir, "manifest.yaml")
	if err := os.WriteFile(manifestPath, []byte("version: 1\nentries:\n  canaryprobe:\n    type: local_file\n    src: canaryprobe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	var runs []canaryRun
	for _, p := range providers() {
		plain := p.name == "local"
		runs = append(runs, canaryRun{name: p.name, args: p.args, harnessVisible: plain, separateUser: p.users})
	}
	if root {
		// A non-root harness on a machine without bubblewrap: plain
		// processes as the harness's own uid. Only the harness's
		// non-dumpable flag keeps the key from them.
		runs = append(runs, canaryRun{name: "local-nonroot", args: []string{"--provider", "local", "--isolation", "none"},
			uid: 65534, harnessVisible: true})
	}
	// gVisor: the sandbox runs on gVisor's kernel; the harness is not in
	// its process table at all.
	runs = append(runs, canaryRun{name: "local-gvisor", args: []string{"--provider", "local", "--isolation", "gvisor"}, separateUser: root, gvisor: true})
	if root {
		// A non-root harness runs runsc rootless.
		runs = append(runs, canaryRun{name: "local-gvisor-nonroot", args: []string{"--provider", "local", "--isolation", "gvisor"}, uid: 65534, gvisor: true})
	}
	for _, run := range runs {
		t.Run(run.name, func(t *testing.T) {
			for _, p := range providers() {
				if p.name == run.name {
					p.skip(t)
				}
			}
			pathEnv := "PATH=" + os.Getenv("PATH")
			runscBin := ""
			if run.gvisor {
				runscBin = runsc.Require(t)
				pathEnv = "PATH=" + filepath.Dir(runscBin) + string(os.PathListSeparator) + os.Getenv("PATH")
			}
			canary := "bulkhead-canary-" + randomHex(t)
			srv := replay.NewServer(
				replay.Turn{Items: []replay.Item{replay.FunctionCall("probe", "exec_command",
					argsJSON(map[string]any{"cmd": "chmod 755 canaryprobe && ./canaryprobe", "yield_time_ms": 60000}))}},
				replay.Turn{Items: []replay.Item{replay.Message("done")}},
			)
			t.Cleanup(srv.Close)
			state := stateDir(t)
			bin := agentdtest.Harness(t).Dir
			if run.uid != 0 {
				bin = publicBinaries(t, bin)
				if runscBin != "" {
					// The cache below /root is closed to the harness's user.
					if err := copyExecutable(runscBin, filepath.Join(bin, "runsc")); err != nil {
						t.Fatal(err)
					}
					pathEnv = "PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")
				}
				if err := os.Chown(state, int(run.uid), int(run.uid)); err != nil {
					t.Fatal(err)
				}
			}
			args := append([]string{"run", "--state-dir", state, "--agentd", filepath.Join(bin, "sandbox-agentd"), "--manifest", manifestPath}, run.args...)
			args = append(args, "Look around.")
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, "harness"), args...)
			cmd.Env = append(withoutEnv(os.Environ(), "OPENAI_API_KEY", "OPENAI_BASE_URL", "PATH"),
				"OPENAI_API_KEY="+canary, "OPENAI_BASE_URL="+srv.URL(), pathEnv)
			if run.uid != 0 {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: run.uid, Gid: run.uid}}
				cmd.Env = append(cmd.Env, "HOME="+state)
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("harness run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			reqs := srv.Requests()
			if len(reqs) != 2 {
				t.Fatalf("the model was called %d times, want 2\nstderr:\n%s", len(reqs), stderr.String())
			}
			out := callOutputs(reqs[1])["probe"]
			t.Logf("probe output:\n%s", out)
			if !strings.Contains(out, "probe: uid") {
				t.Fatalf("the probe did not run:\n%s", out)
			}
			if !strings.Contains(out, "canary found: none") || strings.Contains(out, canary) {
				t.Errorf("the sandbox reached the harness's API key:\n%s", out)
			}
			if run.separateUser && strings.Contains(out, "probe: uid 0,") {
				t.Errorf("sandbox processes run as root by default:\n%s", out)
			}
			if run.harnessVisible {
				if !strings.Contains(out, "(harness): environ denied, mem denied, fd denied") {
					t.Errorf("the probe did not see the harness process, or could read it:\n%s", out)
				}
			}
			if strings.Contains(stdout.String()+stderr.String(), canary) {
				t.Errorf("the harness printed its API key")
			}
		})
	}
}

// publicBinaries copies the harness and daemon into a directory any user
// may read, for a harness run as another user.
func publicBinaries(t *testing.T, from string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bh-e2e-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"harness", "sandbox-agentd"} {
		data, err := os.ReadFile(filepath.Join(from, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// copyExecutable copies the executable src to dst (mode 0755).
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func withoutEnv(environ []string, names ...string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}

func randomHex(t *testing.T) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
