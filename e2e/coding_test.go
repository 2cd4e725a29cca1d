package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
)

// treeFiles maps the relative paths of the regular files under root to
// their contents.
func treeFiles(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diffTrees lists the paths whose content differs between a and b.
func diffTrees(a, b map[string]string) []string {
	var out []string
	for p, v := range a {
		if w, ok := b[p]; !ok || w != v {
			out = append(out, p)
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// TestCodingTask is scenario 1: the seed's coding task through the CLI on
// every provider. The model reads repo/task.md, runs the failing test,
// applies a patch, reruns the test, which passes; the final workspace
// differs from the example repository by exactly the fix.
func TestCodingTask(t *testing.T) {
	example := filepath.Join(env.repo, "examples", "coding-task")
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			state := stateDir(t)
			export := filepath.Join(t.TempDir(), "ws")
			args := append([]string{"run", "--state-dir", state, "--agentd", agentdtest.Binaries(t).Agentd}, p.args...)
			args = append(args, "--manifest", filepath.Join(example, "manifest.yaml"),
				"--replay-without-key", filepath.Join(example, "replay.json"), "--export", export,
				"Open repo/task.md, fix the bug, run the tests and summarize.")
			out, errOut, code := harness(t, "", args...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, want := range []string{"FAIL credit_note_total 10000 2500 = 12500, want 7500", "Process exited with code 1",
				"Updated repo/lib/credit_note.sh", "all tests passed", "Process exited with code 0"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			got := treeFiles(t, filepath.Join(export, "repo"))
			want := treeFiles(t, filepath.Join(example, "repo"))
			if d := diffTrees(got, want); len(d) != 1 || d[0] != filepath.Join("lib", "credit_note.sh") {
				t.Fatalf("the workspace differs from the repository in %v; want exactly lib/credit_note.sh", d)
			}
			if fixed := strings.Replace(want["lib/credit_note.sh"], "invoice + credit", "invoice - credit", 1); got["lib/credit_note.sh"] != fixed {
				t.Errorf("the fix is not exactly the expected one:\n%s", got["lib/credit_note.sh"])
			}
			// Nothing is left running: the runner owned the sandbox.
			if out, _, _ := harness(t, "", append([]string{"sandbox", "ls", "--state-dir", state}, p.args...)...); strings.Contains(out, "running") {
				t.Errorf("sandboxes left:\n%s", out)
			}
		})
	}
}

var resumeHint = regexp.MustCompile(`--resume (\S+)`)

// TestResumeAcrossProcesses is scenario 3: a run stops for the approval of
// a command and the harness exits; a new harness process resumes the
// RunState, the same sandbox is reattached and the approved command runs;
// then the sandbox is deleted and a third process brings the workspace
// back from the snapshot with the files intact.
func TestResumeAcrossProcesses(t *testing.T) {
	example := filepath.Join(env.repo, "examples", "coding-task")
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			state := stateDir(t)
			base := append([]string{"--state-dir", state, "--agentd", agentdtest.Binaries(t).Agentd}, p.args...)
			runArgs := append(append([]string{"run"}, base...), "--manifest", filepath.Join(example, "manifest.yaml"),
				"--replay", filepath.Join(example, "replay.json"), "--allow-command", `cat .*`)
			// Run 1: stops before the first test run (not an allowed command).
			out, errOut, code := harness(t, "", append(runArgs, "fix the bug")...)
			if code != 3 {
				t.Fatalf("run 1: exit %d, want 3\n%s\n%s", code, out, errOut)
			}
			m := resumeHint.FindStringSubmatch(errOut)
			if m == nil || !strings.Contains(errOut, "call_2  $ sh tests/test_credit_note.sh") {
				t.Fatalf("run 1: no pending test command or resume hint:\n%s", errOut)
			}
			// Whatever happens below, the run's sandbox is removed at the end.
			if data, err := os.ReadFile(m[1]); err == nil {
				var st struct {
					Sessions map[string]struct {
						SessionID string `json:"session_id"`
					} `json:"sessions"`
				}
				if json.Unmarshal(data, &st) == nil {
					for _, s := range st.Sessions {
						id := s.SessionID
						t.Cleanup(func() { harness(t, "", append([]string{"sandbox", "rm", id}, base...)...) })
					}
				}
			}
			lsBefore, _, _ := harness(t, "", append([]string{"sandbox", "ls", "--json"}, base...)...)

			// Run 2, a new process: approve everything and keep the sandbox.
			out, errOut, code = harness(t, "", append(runArgs, "--resume", m[1], "--approve-all", "--keep")...)
			if code == 3 {
				// Each later command needs approval too: approve as asked.
				for code == 3 {
					mm := resumeHint.FindStringSubmatch(errOut)
					if mm == nil {
						t.Fatalf("run 2: no resume hint:\n%s", errOut)
					}
					out, errOut, code = harness(t, "", append(runArgs, "--resume", mm[1], "--approve-all", "--keep")...)
				}
			}
			if code != 0 || !strings.Contains(out, "all tests passed") {
				t.Fatalf("run 2: exit %d\n%s\n%s", code, out, errOut)
			}
			lsAfter, _, _ := harness(t, "", append([]string{"sandbox", "ls", "--json"}, base...)...)
			kept := regexp.MustCompile(`sandbox kept: (\S+)`).FindStringSubmatch(errOut)
			if kept == nil {
				t.Fatalf("run 2: the sandbox was not kept:\n%s", errOut)
			}
			id := kept[1]
			// The same sandbox (directory or container), not a replacement.
			before, after := sandboxOf(t, lsBefore, id), sandboxOf(t, lsAfter, id)
			if before == "" || before != after {
				t.Fatalf("run 2 did not reattach the same sandbox: before %q after %q\n%s\n%s", before, after, lsBefore, lsAfter)
			}

			// Delete the sandbox, keep its snapshot; a third process rebuilds it.
			if out, errOut, code := harness(t, "", append([]string{"sandbox", "rm", id, "--keep-snapshot"}, base...)...); code != 0 {
				t.Fatalf("rm: exit %d\n%s\n%s", code, out, errOut)
			}
			if out, errOut, code := harness(t, "", append([]string{"sandbox", "resume", id}, base...)...); code != 0 || !strings.Contains(out+errOut, "rebuilt") {
				t.Fatalf("resume: exit %d\n%s\n%s", code, out, errOut)
			}
			out, errOut, code = harness(t, "", append(append([]string{"sandbox", "exec", id}, base...), "--", "sh", "-c", "cd repo && sh tests/test_credit_note.sh")...)
			if code != 0 || !strings.Contains(out, "all tests passed") {
				t.Fatalf("after the rebuild: exit %d\n%s\n%s", code, out, errOut)
			}
			if _, _, code := harness(t, "", append([]string{"sandbox", "rm", id}, base...)...); code != 0 {
				t.Fatalf("final rm: exit %d", code)
			}
		})
	}
}

// sandboxOf returns the provider's id of the running sandbox of session id
// in `sandbox ls --json` output (other tests' sandboxes may be listed too).
func sandboxOf(t *testing.T, lsJSON, id string) string {
	t.Helper()
	var entries []struct {
		SessionID string `json:"session_id"`
		Sandbox   string `json:"sandbox"`
		Running   bool   `json:"running"`
	}
	if err := json.Unmarshal([]byte(lsJSON), &entries); err != nil {
		t.Fatalf("sandbox ls --json: %v\n%s", err, lsJSON)
	}
	for _, e := range entries {
		if e.SessionID == id && e.Running {
			return e.Sandbox
		}
	}
	return ""
}
