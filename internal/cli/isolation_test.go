package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// TestIsolationNeverDegradesSilently: on a machine without bubblewrap,
// --isolation auto (the default) refuses to run, with or without a model
// API key in the environment, before the model is called, saying how to
// ask for plain processes (--isolation none), which then run with a
// warning; where bubblewrap works, run says it isolates.
func TestIsolationNeverDegradesSilently(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	example := repoFile(t, "examples/coding-task")
	srv := replay.NewServer() // a model that must never be called
	t.Cleanup(srv.Close)
	noBwrap := t.TempDir()
	base := func(state string, more ...string) []string {
		return append([]string{"run", "--state-dir", state, "--agentd", bin, "--manifest", filepath.Join(example, "manifest.yaml")}, more...)
	}
	refused := func(t *testing.T, errOut string, code int) {
		t.Helper()
		if code == 0 || !strings.Contains(errOut, "no sandbox isolation is available") || !strings.Contains(errOut, "--isolation none") {
			t.Fatalf("exit %d, stderr %q; want a refusal naming --isolation none", code, errOut)
		}
	}

	t.Run("with a model key, refused", func(t *testing.T) {
		t.Setenv("PATH", noBwrap)
		t.Setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
		t.Setenv("OPENAI_BASE_URL", srv.URL())
		_, errOut, code := runCLI(t, base(testenv.SearchableTempDir(t), "fix the bug")...)
		refused(t, errOut, code)
		if strings.Contains(errOut, "sk-test") {
			t.Fatalf("the refusal shows the key: %q", errOut)
		}
		if n := len(srv.Requests()); n != 0 {
			t.Fatalf("the model was called %d times", n)
		}
	})
	// No guess about credentials: a replay that carries none (and no
	// credential anywhere in the environment) is refused all the same.
	t.Run("without credentials, refused", func(t *testing.T) {
		t.Setenv("PATH", noBwrap)
		t.Setenv("OPENAI_API_KEY", "")
		state := testenv.SearchableTempDir(t)
		_, errOut, code := runCLI(t, base(state, "--replay", filepath.Join(example, "replay.json"), "fix the bug")...)
		refused(t, errOut, code)
		if ents, _ := os.ReadDir(filepath.Join(state, "local")); len(ents) != 0 {
			t.Fatalf("a refused run left sandboxes: %v", ents)
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

// TestSandboxRootFS: --sandbox-rootfs gives local sandboxes the root file
// system it names (local.Config.RootFS): the example task runs on the one
// `make rootfs` writes, and a directory that is none is refused, saying
// how to make one.
func TestSandboxRootFS(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	example := repoFile(t, "examples/coding-task")
	t.Setenv("OPENAI_API_KEY", "")
	args := func(rootfs string) []string {
		return []string{"run", "--state-dir", testenv.SearchableTempDir(t), "--agentd", bin, "--isolation", "bubblewrap", "--sandbox-rootfs", rootfs,
			"--manifest", filepath.Join(example, "manifest.yaml"), "--replay", filepath.Join(example, "replay.json"), "fix the bug"}
	}
	testenv.Require(t, testenv.Bubblewrap)
	missing := filepath.Join(t.TempDir(), "no-rootfs")
	if _, errOut, code := runCLI(t, args(missing)...); code == 0 || !strings.Contains(errOut, missing) || !strings.Contains(errOut, "make rootfs") {
		t.Errorf("a missing root file system: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code := runCLI(t, args(agentdtest.RootFS(t))...)
	if code != 0 {
		t.Fatalf("the example on the sandbox root file system: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
