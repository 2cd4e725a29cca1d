package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
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
// root by default. Nor may the key be in the harness's output or its state
// directory (searched during the run and after it).
func TestSecretCanary(t *testing.T) {
	probeDir := buildProbe(t)
	manifestPath := filepath.Join(probeDir, "manifest.yaml")
	if err := os.WriteFile(manifestPath, []byte(probeManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, run := range canaryRuns() {
		t.Run(run.name, func(t *testing.T) {
			runCanary(t, run, canaryCase{manifest: manifestPath})
		})
	}
}

// probeManifest brings the probe (built into the manifest's directory)
// into the workspace.
const probeManifest = "version: 1\nentries:\n  canaryprobe:\n    type: local_file\n    src: canaryprobe\n"

// buildProbe builds the probe into a fresh directory that any user may
// read (the unprivileged harness below reads it; t.TempDir's parent is
// 0700) and returns the directory.
func buildProbe(t *testing.T) string {
	t.Helper()
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
	return probeDir
}

// canaryRuns returns every provider and isolation mode the canary attack
// runs in.
func canaryRuns() []canaryRun {
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
	return runs
}

// canaryCase is what one canary run brings beyond the model API key.
type canaryCase struct {
	// manifest is the run's manifest (it holds the probe).
	manifest string
	// before is a shell command run in the workspace before the probe
	// ("" for none); its output comes first in the probe's output.
	before string
	// env is added to the harness's environment (the values of the
	// secrets the manifest names).
	env []string
	// secrets must appear nowhere: not in the sandbox, the harness's
	// output (logs and traces with extraArgs) or its state directory.
	secrets []string
	// extraArgs go on the harness's command line before the prompt.
	extraArgs []string
}

// canaryResult is what a canary run left to check.
type canaryResult struct {
	// probe is the output of the probe's command, as the model saw it.
	probe string
	// stderr is the harness's (its logs and traces, when asked for).
	stderr string
}

// runCanary runs the harness once in run's mode with an OPENAI_API_KEY
// canary and c, has the model run c.before and the probe in the sandbox,
// and fails the test if the probe found a canary, if the API key or any
// of c.secrets is in the harness's output or in its state directory (while
// the session is live and after the run, snapshots decompressed), or if
// the mode's other promises (separate user, harness denied) do not hold.
func runCanary(t *testing.T, run canaryRun, c canaryCase) canaryResult {
	t.Helper()
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
	cmdline := "chmod 755 canaryprobe && ./canaryprobe"
	if c.before != "" {
		cmdline = c.before + " && " + cmdline
	}
	state := stateDir(t)
	secrets := append([]string{canary}, c.secrets...)
	// The state directory is searched twice: while the run is live (the
	// model's second turn: the session's state, the mounts' baselines and
	// the sandbox's workspace are all there) and after it.
	var live stateSearch
	srv := replay.NewServer(
		replay.Turn{Items: []replay.Item{replay.FunctionCall("probe", "exec_command",
			argsJSON(map[string]any{"cmd": cmdline, "yield_time_ms": 60000}))}},
	)
	srv.EnqueueFunc(func(*replay.Request) replay.Turn {
		live.run(state, secrets)
		return replay.Turn{Items: []replay.Item{replay.Message("done")}}
	})
	t.Cleanup(srv.Close)
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
	// --keep-snapshot: the search after the run covers the workspace's
	// snapshot too (a run deletes it by default).
	args := append([]string{"run", "--keep-snapshot", "--state-dir", state, "--agentd", filepath.Join(bin, "sandbox-agentd"), "--manifest", c.manifest}, run.args...)
	args = append(args, c.extraArgs...)
	args = append(args, "Look around.")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "harness"), args...)
	cmd.Env = append(withoutEnv(os.Environ(), "OPENAI_API_KEY", "OPENAI_BASE_URL", "PATH"),
		"OPENAI_API_KEY="+canary, "OPENAI_BASE_URL="+srv.URL(), pathEnv)
	cmd.Env = append(cmd.Env, c.env...)
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
	if !strings.Contains(out, "canary found: none") || containsAny(out, secrets) {
		t.Errorf("the sandbox reached a credential of the harness:\n%s", out)
	}
	if run.separateUser && strings.Contains(out, "probe: uid 0,") {
		t.Errorf("sandbox processes run as root by default:\n%s", out)
	}
	if run.harnessVisible {
		if !strings.Contains(out, "(harness): environ denied, mem denied, fd denied") {
			t.Errorf("the probe did not see the harness process, or could read it:\n%s", out)
		}
	}
	if containsAny(stdout.String()+stderr.String(), secrets) {
		t.Errorf("the harness printed a credential")
	}
	found, checked, err := live.result()
	if err != nil || checked == 0 {
		t.Fatalf("search the live state directory: %d files searched, %v", checked, err)
	}
	if len(found) > 0 {
		t.Errorf("the harness's state directory held a credential during the run: %s", strings.Join(found, ", "))
	}
	var after stateSearch
	after.run(state, secrets)
	if found, _, err := after.result(); err != nil {
		t.Fatalf("search the state directory: %v", err)
	} else if len(found) > 0 {
		t.Errorf("the harness's state directory holds a credential after the run: %s", strings.Join(found, ", "))
	}
	return canaryResult{probe: out, stderr: stderr.String()}
}

// containsAny reports whether s contains one of needles.
func containsAny(s string, needles []string) bool {
	for _, n := range needles {
		if strings.Contains(s, n) {
			return true
		}
	}
	return false
}

// stateSearch searches a directory for credentials; run may be called
// from the model server's goroutine, result from the test's.
type stateSearch struct {
	mu      sync.Mutex
	done    bool
	found   []string
	checked int
	err     error
}

// maxStateFile bounds what is read of one file (or of one decompressed
// archive) in the state directory.
const maxStateFile = 256 << 20

// zstdMagic starts every zstd frame: snapshots are tar+zstd archives, and
// a credential inside one would not show in its compressed bytes.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// run records the files below dir (regular files; links are not followed)
// whose names or contents, decompressed when they are zstd, contain one of
// needles. A file that cannot be read is an error: an unchecked file
// proves nothing. A file removed during the walk is skipped.
func (s *stateSearch) run(dir string, needles []string) {
	var found []string
	checked := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if containsAny(path, needles) {
			found = append(found, path)
		}
		if !d.Type().IsRegular() || isNamespaceFile(path) {
			return nil
		}
		data, err := readBounded(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		checked++
		if bytes.HasPrefix(data, zstdMagic) {
			dec, err := zstd.NewReader(bytes.NewReader(data))
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			plain, err := io.ReadAll(io.LimitReader(dec, maxStateFile))
			dec.Close()
			if err != nil {
				return fmt.Errorf("%s: decompress: %w", path, err)
			}
			data = append(data, plain...)
		}
		if containsAny(string(data), needles) {
			found = append(found, path)
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done, s.found, s.checked, s.err = true, found, checked, err
}

// result returns what run found and how many files it searched; an error
// if run failed or never ran.
func (s *stateSearch) result() (found []string, checked int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		return nil, 0, errors.New("the state directory was never searched")
	}
	return s.found, s.checked, s.err
}

// nsfsMagic is the file system type of namespace files (/proc/PID/ns/*).
const nsfsMagic = 0x6e736673

// isNamespaceFile reports whether path is a namespace bind-mounted onto a
// file (gVisor keeps one in the sandbox's state): it looks regular but
// holds no bytes, and reading it fails.
func isNamespaceFile(path string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(path, &st) == nil && st.Type == nsfsMagic
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxStateFile))
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
