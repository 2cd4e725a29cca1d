package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// repoFile returns a path in the repository.
func repoFile(t *testing.T, rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", rel)
}

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code = Execute(ctx, args, Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return out.String(), errb.String(), code
}

// TestRunExampleTaskWithReplay runs the README's main job: the example
// coding task, a recorded model session replayed through the real
// openai-go client, real tools in a real local sandbox.
func TestRunExampleTaskWithReplay(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	state, export := testenv.SearchableTempDir(t), filepath.Join(t.TempDir(), "ws")
	example := repoFile(t, "examples/coding-task")
	t.Setenv("OPENAI_API_KEY", "")
	out, errOut, code := runCLI(t, "run", "--state-dir", state, "--agentd", bin, "--isolation", "none",
		"--manifest", filepath.Join(example, "manifest.yaml"), "--replay-without-key", filepath.Join(example, "replay.json"),
		"--export", export, "fix the bug")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "OPENAI_API_KEY is not set") || !strings.Contains(errOut, "[REPLAY]") {
		t.Errorf("the replay is not labelled: %q", errOut)
	}
	for _, want := range []string{"$ cat task.md   (in repo)", "FAIL credit_note_total 10000 2500 = 12500, want 7500",
		"apply_patch: update repo/lib/credit_note.sh", "all tests passed", "Fixed `repo/lib/credit_note.sh`", "== done: 6 turns"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The exported workspace holds exactly the fix.
	fixed, err := os.ReadFile(filepath.Join(export, "repo", "lib", "credit_note.sh"))
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := os.ReadFile(filepath.Join(example, "repo", "lib", "credit_note.sh"))
	if want := strings.Replace(string(orig), "invoice + credit", "invoice - credit", 1); string(fixed) != want {
		t.Errorf("exported credit_note.sh:\n%s", fixed)
	}
	for _, f := range []string{"task.md", "tests/test_credit_note.sh"} {
		a, _ := os.ReadFile(filepath.Join(export, "repo", f))
		b, _ := os.ReadFile(filepath.Join(example, "repo", f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s changed", f)
		}
	}
	// The run cleaned its sandbox up.
	if entries, _ := os.ReadDir(filepath.Join(state, "local")); len(entries) != 0 {
		t.Errorf("sandbox directories left: %v", entries)
	}
}

func TestRunJSONAndFailures(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	example := repoFile(t, "examples/coding-task")
	out, errOut, code := runCLI(t, "run", "--state-dir", state, "--agentd", bin, "--isolation", "none", "--json",
		"--manifest", filepath.Join(example, "manifest.yaml"), "--replay", filepath.Join(example, "replay.json"), "fix it")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last["kind"] != "result" {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("not JSON: %q", l)
		}
	}

	// A replay that runs out of turns fails with a one-line reason.
	short := filepath.Join(t.TempDir(), "short.json")
	if err := os.WriteFile(short, []byte(`{"turns":[{"items":[{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\"cmd\":\"true\"}"}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runCLI(t, "run", "--state-dir", state, "--agentd", bin, "--isolation", "none", "--replay", short, "x")
	errLines := strings.Split(strings.TrimSpace(errOut), "\n")
	if last := errLines[len(errLines)-1]; code == 0 || !strings.HasPrefix(last, "harness run: turn 2: ") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// Bad input: a missing manifest changes nothing and says why.
	_, errOut, code = runCLI(t, "run", "--state-dir", state, "--manifest", "/nonexistent/m.yaml", "--replay", short, "x")
	if code == 0 || !strings.Contains(errOut, "m.yaml") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// No key and no replay: a clear error.
	t.Setenv("OPENAI_API_KEY", "")
	_, errOut, code = runCLI(t, "run", "--state-dir", state, "x")
	if code == 0 || !strings.Contains(errOut, "OPENAI_API_KEY") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// TestRunStopsForApprovalAndResumes is the approval flow across processes:
// the run stops before apply_patch with exit code 3 and a saved RunState;
// a second invocation approves the call and finishes the task.
func TestRunStopsForApprovalAndResumes(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	state, export := testenv.SearchableTempDir(t), filepath.Join(t.TempDir(), "ws")
	example := repoFile(t, "examples/coding-task")
	common := []string{"--state-dir", state, "--agentd", bin, "--isolation", "none",
		"--manifest", filepath.Join(example, "manifest.yaml"), "--replay", filepath.Join(example, "replay.json"),
		"--approval-for", "apply_patch"}
	out, errOut, code := runCLI(t, append([]string{"run"}, append(common, "fix the bug")...)...)
	if code != 3 {
		t.Fatalf("exit %d, want 3 (stopped for approval)\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "call_4  apply_patch: update repo/lib/credit_note.sh") {
		t.Fatalf("stderr lacks the pending call:\n%s", errOut)
	}
	i := strings.Index(errOut, "--resume ")
	if i < 0 {
		t.Fatalf("no resume hint:\n%s", errOut)
	}
	statePath := strings.Fields(errOut[i+len("--resume "):])[0]
	// The sandbox stays alive (persisted) while the run waits, and so does
	// its snapshot, which the stopped run's state names.
	if entries, _ := os.ReadDir(filepath.Join(state, "local")); len(entries) != 1 {
		t.Fatalf("sandboxes while waiting: %v", entries)
	}
	if got := snapshotFiles(t, filepath.Join(state, "snapshots")); len(got) != 1 {
		t.Fatalf("snapshots while waiting: %v", got)
	}
	if _, out, _ := execute(t, state, "sandbox", "snapshot", "gc", "--max-age", "1ns"); !strings.Contains(out, "removed 0, kept 1 that saved states name") {
		t.Fatalf("gc while the run waits: %s", out)
	}
	// A wrong id is refused and changes nothing.
	if _, errOut, code := runCLI(t, append([]string{"run", "--resume", statePath, "--approve", "call_99"}, common...)...); code == 0 || !strings.Contains(errOut, "call_99") {
		t.Fatalf("bad approve: exit %d %q", code, errOut)
	}
	out, errOut, code = runCLI(t, append([]string{"run", "--resume", statePath, "--approve", "call_4", "--export", export}, common...)...)
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "all tests passed") || !strings.Contains(out, "== done: 6 turns") {
		t.Fatalf("resumed output:\n%s", out)
	}
	fixed, _ := os.ReadFile(filepath.Join(export, "repo", "lib", "credit_note.sh"))
	if !strings.Contains(string(fixed), "invoice - credit") {
		t.Fatalf("not fixed:\n%s", fixed)
	}
	if entries, _ := os.ReadDir(filepath.Join(state, "local")); len(entries) != 0 {
		t.Fatalf("sandboxes left after the run: %v", entries)
	}
	if got := snapshotFiles(t, filepath.Join(state, "snapshots")); len(got) != 0 {
		t.Fatalf("snapshots left after the resumed run: %v", got)
	}
}

func TestRunAsksInteractively(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	example := repoFile(t, "examples/coding-task")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	// Refuse the patch with a reason: the model sees it, and the recorded
	// session goes on (its test run then still fails, which the replay does
	// not know about; what matters here is the decision's path).
	code := Execute(ctx, []string{"run", "--state-dir", testenv.SearchableTempDir(t), "--agentd", bin, "--isolation", "none",
		"--manifest", filepath.Join(example, "manifest.yaml"), "--replay", filepath.Join(example, "replay.json"),
		"--approval-for", "apply_patch", "--interactive", "fix"},
		Streams{In: strings.NewReader("not like this\n"), Out: &out, Err: &errb})
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "Approve apply_patch: update repo/lib/credit_note.sh?") {
		t.Errorf("no prompt:\n%s", errb.String())
	}
	if !strings.Contains(out.String(), "not like this") || !strings.Contains(out.String(), "tests failed") {
		t.Errorf("the rejection did not reach the run:\n%s", out.String())
	}
}

// TestRunOnARemoteSandbox: a daemon started by someone else (here, the
// test), reached by address and token file; the run works in it and leaves
// it running.
func TestRunOnARemoteSandbox(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	dir := t.TempDir()
	token := "remote-test-token-0123456789"
	for _, f := range []string{"daemon-token", "harness-token"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	socket := filepath.Join(dir, "agentd.sock")
	daemon := exec.Command(bin, "--listen", "unix://"+socket, "--token-file", filepath.Join(dir, "daemon-token"),
		"--workspace", filepath.Join(dir, "ws"), "--etc-root", "/")
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })
	example := repoFile(t, "examples/coding-task")
	var out, errOut string
	var code int
	for i := 0; i < 100; i++ { // the daemon needs a moment to listen
		out, errOut, code = runCLI(t, "run", "--state-dir", t.TempDir(), "--provider", "remote", "--address", "unix://"+socket,
			"--token-file", filepath.Join(dir, "harness-token"), "--manifest", filepath.Join(example, "manifest.yaml"),
			"--replay", filepath.Join(example, "replay.json"), "fix")
		if code == 0 || !strings.Contains(errOut, "unavailable") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != 0 || !strings.Contains(out, "all tests passed") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	// The sandbox is someone else's: still running, workspace in place.
	if daemon.ProcessState != nil {
		t.Fatal("the remote daemon was stopped")
	}
	fixed, err := os.ReadFile(filepath.Join(dir, "ws", "repo", "lib", "credit_note.sh"))
	if err != nil || !strings.Contains(string(fixed), "invoice - credit") {
		t.Fatalf("remote workspace: %q %v", fixed, err)
	}
}
