package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
)

// TestSandboxPauseResume drives `harness sandbox pause` and `resume` on
// a gVisor sandbox: a process counting into the sandbox's /tmp (a tmpfs in
// its memory) counts on after the resume, ls says paused in between, and
// rm removes a paused sandbox without restoring it.
func TestSandboxPauseResume(t *testing.T) {
	testenv.Require(t, testenv.Root) // runsc restores only as root
	bin := agentdtest.Binaries(t).Agentd
	runscBin := runsc.Require(t)
	rootfs := agentdtest.RootFS(t)
	t.Setenv("PATH", filepath.Dir(runscBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	state := testenv.SearchableTempDir(t)
	mf := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(mf, []byte("run_as: root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	newRun := func(ctx context.Context) cliRun {
		return func(args ...string) (int, string, string) {
			var out, errb bytes.Buffer
			base := []string{"--state-dir", state, "--provider", "local", "--isolation", "gvisor", "--sandbox-rootfs", rootfs, "--agentd", bin}
			code := Execute(ctx, append(base, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
			return code, out.String(), errb.String()
		}
	}
	run := newRun(t.Context())
	t.Cleanup(func() {
		newRun(context.Background())("sandbox", "rm", "--no-sync", "p1")
		newRun(context.Background())("sandbox", "rm", "--no-sync", "p2")
	})
	mustRun(t, run, "sandbox", "create", "--id", "p1", "--manifest", mf)
	mustRun(t, run, "sandbox", "exec", "p1", "--", "sh", "-c",
		`echo kept > kept.txt; setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &`)
	count := func() int {
		t.Helper()
		out := mustRun(t, run, "sandbox", "exec", "p1", "--", "cat", "/tmp/count")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("count %q", out)
		}
		return n
	}
	before := count()
	out := mustRun(t, run, "sandbox", "pause", "p1")
	if !strings.Contains(out, "session p1: paused with its memory and processes") || !strings.Contains(out, "harness sandbox resume p1") {
		t.Fatalf("pause printed %q", out)
	}
	if out := mustRun(t, run, "sandbox", "pause", "p1"); !strings.Contains(out, "paused already") {
		t.Fatalf("a second pause printed %q", out)
	}
	var listed []lsEntry
	if err := json.Unmarshal([]byte(mustRun(t, run, "sandbox", "ls", "--json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || !listed[0].Paused || listed[0].Running || listed[0].sandboxColumn() != "paused" {
		t.Fatalf("ls: %+v", listed)
	}
	out = mustRun(t, run, "sandbox", "resume", "p1")
	if !strings.Contains(out, "session p1: restored from its pause") {
		t.Fatalf("resume printed %q", out)
	}
	if after := count(); after <= before {
		t.Fatalf("the count went from %d to %d: the process did not run on", before, after)
	}
	if out := mustRun(t, run, "sandbox", "exec", "p1", "--", "cat", "kept.txt"); out != "kept\n" {
		t.Fatalf("kept.txt: %q", out)
	}
	// A command on a paused sandbox restores it, and says so.
	mustRun(t, run, "sandbox", "pause", "p1")
	code, out, errOut := run("sandbox", "exec", "p1", "--", "cat", "kept.txt")
	if code != 0 || out != "kept\n" || !strings.Contains(errOut, "was paused; restored it") {
		t.Fatalf("exec on a paused sandbox: exit %d, %q, %q", code, out, errOut)
	}
	// rm of a paused sandbox.
	mustRun(t, run, "sandbox", "pause", "p1")
	if out := mustRun(t, run, "sandbox", "rm", "--no-sync", "p1"); !strings.Contains(out, "removed session p1") {
		t.Fatalf("rm printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(state, "local", "p1")); !os.IsNotExist(err) {
		t.Fatalf("rm left the paused sandbox: %v", err)
	}
}

// TestSandboxPauseUnimplemented: a sandbox that cannot be paused (plain
// processes) is refused, saying why, and keeps running.
func TestSandboxPauseUnimplemented(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	run := newCLIRun(t.Context(), state, bin)
	t.Cleanup(func() { newCLIRun(context.Background(), state, bin)("sandbox", "rm", "u1") })
	mustRun(t, run, "sandbox", "create", "--id", "u1")
	code, _, errOut := run("sandbox", "pause", "u1")
	if code == 0 || !strings.Contains(errOut, "cannot be paused") || !strings.Contains(errOut, "gVisor") {
		t.Fatalf("pause of a plain sandbox: exit %d, stderr %q", code, errOut)
	}
	if out := mustRun(t, run, "sandbox", "exec", "u1", "--", "echo", "on"); out != "on\n" {
		t.Fatalf("after the refused pause: %q", out)
	}
}
