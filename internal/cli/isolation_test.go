package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// TestIsolationNeverDegradesSilently: on a machine without bubblewrap,
// --isolation auto (the default) refuses to run a task that carries a
// model API key in plain processes, before the model is called; a replay
// that carries no credential runs plain with a warning; --isolation none
// runs with one; and where bubblewrap works, run says it isolates.
func TestIsolationNeverDegradesSilently(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	example := repoFile(t, "examples/coding-task")
	srv := replay.NewServer() // a model that must never be called
	t.Cleanup(srv.Close)
	noBwrap := t.TempDir()
	base := func(state string, more ...string) []string {
		return append([]string{"run", "--state-dir", state, "--agentd", bin, "--manifest", filepath.Join(example, "manifest.yaml")}, more...)
	}

	t.Run("credentials refused", func(t *testing.T) {
		t.Setenv("PATH", noBwrap)
		t.Setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
		t.Setenv("OPENAI_BASE_URL", srv.URL())
		_, errOut, code := runCLI(t, base(testenv.SearchableTempDir(t), "fix the bug")...)
		if code == 0 || !strings.Contains(errOut, "no sandbox isolation is available") || !strings.Contains(errOut, "--isolation none") ||
			!strings.Contains(errOut, "a model API key") {
			t.Fatalf("exit %d, stderr %q; want a refusal naming the credential and --isolation none", code, errOut)
		}
		if strings.Contains(errOut, "sk-test") {
			t.Fatalf("the refusal shows the key: %q", errOut)
		}
		if n := len(srv.Requests()); n != 0 {
			t.Fatalf("the model was called %d times", n)
		}
	})
	t.Run("credential in the environment refused", func(t *testing.T) {
		t.Setenv("PATH", noBwrap)
		t.Setenv("OPENAI_API_KEY", "")
		t.Setenv("GITHUB_TOKEN", "ghp-not-real")
		_, errOut, code := runCLI(t, base(testenv.SearchableTempDir(t), "--replay", filepath.Join(example, "replay.json"), "fix the bug")...)
		if code == 0 || !strings.Contains(errOut, "$GITHUB_TOKEN") {
			t.Fatalf("exit %d, stderr %q; want a refusal naming $GITHUB_TOKEN", code, errOut)
		}
	})
	t.Run("replay without credentials runs plain, warned", func(t *testing.T) {
		t.Setenv("PATH", noBwrap) // the sandbox's processes get a PATH of their own
		t.Setenv("OPENAI_API_KEY", "")
		_, errOut, code := runCLI(t, base(testenv.SearchableTempDir(t), "--replay", filepath.Join(example, "replay.json"), "fix the bug")...)
		if code != 0 || !strings.Contains(errOut, "WARNING: no sandbox isolation is available here") {
			t.Fatalf("exit %d, stderr %q; want a run with the fallback warning", code, errOut)
		}
	})
	t.Run("none is explicit and warned", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "")
		_, errOut, code := runCLI(t, base(testenv.SearchableTempDir(t), "--isolation", "none", "--replay", filepath.Join(example, "replay.json"), "fix the bug")...)
		if code != 0 || !strings.Contains(errOut, "WARNING: --isolation none") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
	t.Run("auto says bubblewrap", func(t *testing.T) {
		testenv.Require(t, testenv.Bubblewrap)
		t.Setenv("OPENAI_API_KEY", "")
		_, errOut, code := runCLI(t, base(testenv.SearchableTempDir(t), "--replay", filepath.Join(example, "replay.json"), "fix the bug")...)
		if code != 0 || !strings.Contains(errOut, "local sandboxes isolated with bubblewrap") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
	t.Run("unknown isolation", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "")
		_, errOut, code := runCLI(t, base(t.TempDir(), "--isolation", "chroot", "--replay", filepath.Join(example, "replay.json"), "x")...)
		if code == 0 || !strings.Contains(errOut, "unknown isolation") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
}
