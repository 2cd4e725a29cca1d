package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// crashHelperEnv, set in the environment of this test binary, makes it a
// helper process (see TestMain) that restores an archive and kills itself
// with SIGKILL at a chosen step, the way a daemon dies.
const crashHelperEnv = "BULKHEAD_ARCHIVE_CRASH_HELPER"

// crashSpec is what the helper process restores, and where it dies.
type crashSpec struct {
	Root    string   `json:"root"`
	Archive string   `json:"archive"`
	Exclude []string `json:"exclude"`
	At      Step     `json:"at"`
}

// Exit codes of the helper when it does not die.
const (
	helperFailed     = 2 // the restore returned an error
	helperNotReached = 3 // the restore succeeded without reaching the step
)

// crashHelper is the helper process: it runs a Restore whose Fault hook
// sends SIGKILL to its own process at the chosen step, and returns an exit
// code only when it did not die.
func crashHelper() int {
	var spec crashSpec
	if err := json.Unmarshal([]byte(os.Getenv(crashHelperEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		return helperFailed
	}
	f, err := os.Open(spec.Archive)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		return helperFailed
	}
	defer f.Close()
	opts := RestoreOptions{Exclude: spec.Exclude, Fault: func(s Step) error {
		if s == spec.At {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
		return nil
	}}
	if _, err := Restore(context.Background(), spec.Root, f, opts); err != nil {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		return helperFailed
	}
	return helperNotReached
}

// killedRestore runs the helper process on spec and fails unless SIGKILL
// ended it.
func killedRestore(t *testing.T, spec crashSpec) {
	t.Helper()
	env, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+string(env))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("kill at %v: the helper was not killed: %v\n%s", spec.At, err, stderr.Bytes())
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("kill at %v: the helper ended with %v, not SIGKILL\n%s", spec.At, err, stderr.Bytes())
	}
}

// bigSwapTree writes the workspace: n top-level files, a
// directory that holds an excluded cache (so that it is swapped entry by
// entry) and an excluded top-level directory, all with pinned times.
func bigSwapTree(t *testing.T, root, prefix string, n int) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		p := filepath.Join(root, fmt.Sprintf("%s-%04d", prefix, i))
		if err := os.WriteFile(p, fmt.Appendf(nil, "%s file %d\n", prefix, i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(root, "deep", prefix+".txt"), prefix+" deep\n", 0o600)
	writeFile(t, filepath.Join(root, "deep/cache/data"), "excluded cache\n", 0o644)
	writeFile(t, filepath.Join(root, "keep/me"), "excluded\n", 0o644)
	if err := os.Symlink(prefix+"-0001", filepath.Join(root, prefix+"-link")); err != nil {
		t.Fatal(err)
	}
	pinTimes(t, root)
}

// memDir returns a temporary directory in memory (/dev/shm) when there is
// one, else on the usual temporary filesystem. What a killed process
// leaves is the same on every filesystem (the kernel outlives it); in
// memory, the thousands of files the test writes cost no disk time.
func memDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "archive-crash-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestRestoreKilledMidSwapRecovers is the scenario with a real
// process kill: archive 3,000 files, put 3,000 others in the workspace,
// restore in a helper process that SIGKILLs itself at a chosen step
// (after k of n moves, between journal writes, during the cleanup), then
// recover as a restarted daemon does. Every time the workspace is exactly
// the old tree (killed before the stage was complete) or exactly the new
// one (after), with nothing left behind.
func TestRestoreKilledMidSwapRecovers(t *testing.T) {
	const n = 3000
	base := memDir(t)
	src := filepath.Join(base, "src")
	bigSwapTree(t, src, "new", n)
	exclude := []string{"deep/cache", "keep"}
	archivePath := filepath.Join(base, "archive.tar.zst")
	if err := os.WriteFile(archivePath, archiveOf(t, src, WriteOptions{Exclude: exclude}), 0o600); err != nil {
		t.Fatal(err)
	}
	workspace := func(name string) string {
		root := filepath.Join(base, name)
		bigSwapTree(t, root, "old", n)
		return root
	}
	restoreRef := func(root string) {
		f, err := os.Open(archivePath)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := Restore(context.Background(), root, f, RestoreOptions{Exclude: exclude}); err != nil {
			t.Fatal(err)
		}
	}
	ref := workspace("reference")
	oldTree := describe(t, ref)
	restoreRef(ref)
	newTree := describe(t, ref)

	j := func(p phase) Step { return Step{Name: StepJournal + string(p), N: 1} }
	type killPoint struct {
		at      Step
		wantNew bool // the stage was complete: rolled forward
	}
	points := []killPoint{
		{Step{Name: StepExtract, N: 1}, false},
		{j(phaseSwapOut), false}, // the stage is complete, the journal not yet
		{Step{Name: StepOut, N: 1}, true},
		{Step{Name: StepOut, N: 110}, true},
		{Step{Name: StepOut, N: n}, true},
		{j(phaseSwapIn), true},
		{Step{Name: StepIn, N: 110}, true},
		{Step{Name: StepIn, N: n + 1}, true},
		{j(phaseDone), true},
		{Step{Name: StepCleanup, N: 2}, true},
	}
	if testing.Short() { // the kills mid-swap only
		points = slices.DeleteFunc(points, func(p killPoint) bool { return p.at.N != 110 })
	}
	for i, p := range points {
		root := workspace(fmt.Sprintf("ws%02d", i))
		killedRestore(t, crashSpec{Root: root, Archive: archivePath, Exclude: exclude, At: p.at})
		if p.at == (Step{Name: StepOut, N: 110}) {
			// The state: some old files moved away, most still
			// visible, and a naive archive would snapshot that.
			if _, err := os.Lstat(filepath.Join(root, "old-0000")); err == nil {
				t.Fatal("no file was moved before the kill")
			}
			if _, err := os.Lstat(filepath.Join(root, "old-2000")); err != nil {
				t.Fatalf("old-2000: %v", err)
			}
			if _, err := Write(context.Background(), root, &bytes.Buffer{}, WriteOptions{Exclude: exclude}); err == nil {
				t.Fatal("Write snapshots a half-swapped workspace")
			}
		}
		if _, err := Recover(root, RecoverOptions{}); err != nil {
			t.Fatalf("kill at %v: Recover: %v", p.at, err)
		}
		want, name := oldTree, "old"
		if p.wantNew {
			want, name = newTree, "new"
		}
		if d := diff(want, describe(t, root)); len(d) > 0 {
			if len(d) > 20 {
				d = append(d[:20], fmt.Sprintf("... and %d more", len(d)-20))
			}
			t.Fatalf("kill at %v: the workspace is not exactly the %s tree:\n%s", p.at, name, strings.Join(d, "\n"))
		}
		requireNoStaging(t, root)
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
	}
}
