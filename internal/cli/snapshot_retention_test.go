package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
)

// snapshotFiles lists the ids in a directory snapshot store.
func snapshotFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".snapshot"); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// TestSnapshotGCRetention: gc removes the snapshots older than --max-age
// (default 7d) or past the newest --max-count (default 50), never one a
// saved session state or a stopped run's state names; --dry-run removes
// nothing; a state it cannot read stops it before it removes anything.
func TestSnapshotGCRetention(t *testing.T) {
	state := t.TempDir()
	store := filepath.Join(state, "snapshots")
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ages := map[string]time.Duration{
		"fresh-1": time.Hour, "fresh-2": 2 * time.Hour, "fresh-3": 3 * time.Hour,
		"old": 8 * 24 * time.Hour, "old-session": 9 * 24 * time.Hour, "old-run": 10 * 24 * time.Hour, "old-named": 30 * 24 * time.Hour,
	}
	for id, age := range ages {
		p := filepath.Join(store, id+".snapshot")
		if err := os.WriteFile(p, []byte(id), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	// Saved states: a session whose snapshot is its id, one that names
	// another snapshot, and a run stopped for approval.
	writeState := func(dir, name string, data []byte, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(state, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(state, dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st := &compute.State{Version: compute.StateVersion, Provider: "local", SessionID: "old-session"}
	data, err := st.Encode()
	writeState("sessions", "old-session.json", data, err)
	st = &compute.State{Version: compute.StateVersion, Provider: "local", SessionID: "s2", SnapshotID: "old-named"}
	data, err = st.Encode()
	writeState("sessions", "s2.json", data, err)
	rs := &harness.RunState{Version: harness.RunStateVersion, Agent: "a",
		Sessions: map[string]*compute.State{"a": {Version: compute.StateVersion, Provider: "local", SessionID: "old-run"}}}
	data, err = rs.Encode()
	writeState("runs", "run-1.json", data, err)

	all := []string{"fresh-1", "fresh-2", "fresh-3", "old", "old-named", "old-run", "old-session"}
	code, out, errs := execute(t, state, "sandbox", "snapshot", "gc", "--dry-run")
	if code != 0 || !strings.Contains(out, "would remove snapshot old (8 days old, past 7d)") ||
		!strings.Contains(out, "kept snapshot old-named (30 days old, past 7d): the saved state "+filepath.Join(state, "sessions", "s2.json")+" names it") ||
		!strings.Contains(out, "kept snapshot old-run") || !strings.Contains(out, "kept snapshot old-session") ||
		!strings.Contains(out, "7 snapshots; retention keeps younger than 7d, the newest 50: would remove 1, kept 3 that saved states name") {
		t.Fatalf("gc --dry-run: exit %d\n%s%s", code, out, errs)
	}
	if got := snapshotFiles(t, store); !slices.Equal(got, all) {
		t.Fatalf("after --dry-run: %v", got)
	}

	code, out, errs = execute(t, state, "sandbox", "snapshot", "gc", "--max-count", "2")
	if code != 0 || !strings.Contains(out, "removed snapshot fresh-3 (not among the newest 2)") || !strings.Contains(out, "removed snapshot old (") {
		t.Fatalf("gc --max-count 2: exit %d\n%s%s", code, out, errs)
	}
	if got, want := snapshotFiles(t, store), []string{"fresh-1", "fresh-2", "old-named", "old-run", "old-session"}; !slices.Equal(got, want) {
		t.Fatalf("after gc --max-count 2: %v, want %v", got, want)
	}

	// Limits off: nothing goes. --max-age takes days and hours.
	if code, out, errs := execute(t, state, "sandbox", "snapshot", "gc", "--max-age", "0", "--max-count", "0"); code != 0 || !strings.Contains(out, "retention keeps no limit: removed 0") {
		t.Fatalf("gc without limits: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := execute(t, state, "sandbox", "snapshot", "gc", "--dry-run", "--max-age", "1d12h"); code != 0 || !strings.Contains(out, "younger than 1d12h") {
		t.Fatalf("gc --max-age 1d12h: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := execute(t, state, "sandbox", "snapshot", "gc", "--max-age", "soon"); code == 0 || !strings.Contains(errs, "7d") {
		t.Fatalf("gc --max-age soon: exit %d, %s", code, errs)
	}

	// A saved state that cannot be read: nothing is removed.
	writeState("sessions", "broken.json", []byte("{"), nil)
	code, _, errs = execute(t, state, "sandbox", "snapshot", "gc", "--max-age", "1m")
	if code == 0 || !strings.Contains(errs, "broken.json") || !strings.Contains(errs, "nothing was removed") {
		t.Fatalf("gc with an unreadable state: exit %d, %s", code, errs)
	}
	if got := snapshotFiles(t, store); len(got) != 5 {
		t.Fatalf("gc with an unreadable state removed snapshots: %v", got)
	}
}

func TestAgeFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "36h": 36 * time.Hour, "90m": 90 * time.Minute, "0": 0} {
		got, err := parseAge(in)
		if err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "7x", "xd", "1d2"} {
		if _, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) accepted", in)
		}
	}
	for d, want := range map[time.Duration]string{7 * 24 * time.Hour: "7d", 36 * time.Hour: "1d12h", 90 * time.Minute: "1h30m", 36 * time.Minute: "36m", 0: "0"} {
		if got := formatAge(d); got != want {
			t.Errorf("formatAge(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestRunDeletesItsSnapshot: harness run deletes the snapshot its sandbox
// took when it closed; with --keep-snapshot it keeps it and says where and
// how to remove it (and that command works).
func TestRunDeletesItsSnapshot(t *testing.T) {
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	example := repoFile(t, "examples/coding-task")
	args := []string{"run", "--state-dir", state, "--agentd", bin, "--isolation", "none",
		"--manifest", filepath.Join(example, "manifest.yaml"), "--replay", filepath.Join(example, "replay.json")}
	out, errOut, code := runCLI(t, append(args, "fix the bug")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if got := snapshotFiles(t, filepath.Join(state, "snapshots")); len(got) != 0 {
		t.Fatalf("the run left snapshots: %v\n%s", got, errOut)
	}

	out, errOut, code = runCLI(t, append(args, "--keep-snapshot", "fix the bug")...)
	if code != 0 {
		t.Fatalf("--keep-snapshot: exit %d\n%s\n%s", code, out, errOut)
	}
	got := snapshotFiles(t, filepath.Join(state, "snapshots"))
	if len(got) != 1 {
		t.Fatalf("--keep-snapshot: snapshots %v\n%s", got, errOut)
	}
	id := got[0]
	rm := "`harness --state-dir " + state + " sandbox snapshot rm " + id + "` removes it"
	if !strings.Contains(errOut, "workspace snapshot kept: "+id+" in "+filepath.Join(state, "snapshots")) || !strings.Contains(errOut, rm) {
		t.Fatalf("--keep-snapshot does not say where the snapshot is and how to remove it:\n%s", errOut)
	}
	rmArgs := strings.Fields(strings.Trim(rm[:strings.LastIndex(rm, "`")+1], "`"))[1:]
	if out, errOut, code := runCLI(t, rmArgs...); code != 0 || out != "removed snapshot "+id+"\n" {
		t.Fatalf("%v: exit %d, %q %q", rmArgs, code, out, errOut)
	}
}
