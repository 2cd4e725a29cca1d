package service_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
)

// Pause, resume, snapshots and forks of API sandboxes over plain JSON.

// putFile writes a sandbox file with a plain PUT.
func putFile(t *testing.T, ctx context.Context, e *env, token, id, path, content string) {
	t.Helper()
	if code, body := httpDo(t, ctx, http.MethodPut, e.url+"/v1/sandboxes/"+id+"/files/"+path, token, strings.NewReader(content)); code != http.StatusOK {
		t.Fatalf("PUT %s: %d %s", path, code, body)
	}
}

// catFiles runs cat over paths in a sandbox and returns its stdout (and
// stderr for missing files).
func catFiles(t *testing.T, ctx context.Context, e *env, token, id string, paths ...string) string {
	t.Helper()
	out := sbxOK(t, ctx, e, token, "RunCommand", obj{"sandboxId": id, "command": "cat " + strings.Join(paths, " ") + " 2>&1"})
	return fieldStr(out, "stdout")
}

// status is a sandbox's status as GetSandbox answers it.
func status(t *testing.T, ctx context.Context, e *env, token, id string) string {
	t.Helper()
	return fieldStr(sbxOK(t, ctx, e, token, "GetSandbox", obj{"sandboxId": id}), "sandbox", "status")
}

// TestSandboxAPIPauseResume: on a provider that cannot keep memory
// (local without gVisor) a pause keeps the workspace and says so; a
// paused sandbox refuses other calls until it is resumed, is listed as
// paused, and is deleted like any other.
func TestSandboxAPIPauseResume(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	putFile(t, ctx, e, acmeToken, id, "state.txt", "kept")

	out := sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})
	if field(out, "keepMemory") != nil || fieldStr(out, "sandbox", "status") != "SANDBOX_STATUS_PAUSED" {
		t.Fatalf("PauseSandbox: %v", out)
	}
	if got := status(t, ctx, e, acmeToken, id); got != "SANDBOX_STATUS_PAUSED" {
		t.Fatalf("GetSandbox of a paused sandbox: %s", got)
	}
	list := sbxOK(t, ctx, e, acmeToken, "ListSandboxes", obj{"status": "SANDBOX_STATUS_PAUSED"})
	if sbs, _ := list["sandboxes"].([]any); len(sbs) != 1 || fieldStr(sbs[0].(obj), "sandboxId") != id {
		t.Fatalf("ListSandboxes of paused ones: %v", list)
	}
	// Other calls are refused while it is paused, saying so.
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "true"}, http.StatusBadRequest, "failed_precondition", "paused")
	sbxRefused(t, ctx, e, acmeToken, "ListSandboxDir", obj{"sandboxId": id}, http.StatusBadRequest, "failed_precondition", "paused")
	sbxRefused(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": id}, http.StatusBadRequest, "failed_precondition", "paused")
	sbxRefused(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": id, "count": 1}, http.StatusBadRequest, "failed_precondition", "paused")
	if code, _ := httpDo(t, ctx, http.MethodGet, e.url+"/v1/sandboxes/"+id+"/files/state.txt", acmeToken, nil); code != http.StatusPreconditionFailed {
		t.Fatalf("GET of a paused sandbox's file: %d", code)
	}
	// Pausing again changes nothing; another tenant's and unknown ids are
	// not found; a malformed id is bad input.
	sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})
	sbxRefused(t, ctx, e, evilToken, "PauseSandbox", obj{"sandboxId": id}, http.StatusNotFound, "not_found")
	sbxRefused(t, ctx, e, evilToken, "ResumeSandbox", obj{"sandboxId": id}, http.StatusNotFound, "not_found")
	sbxRefused(t, ctx, e, acmeToken, "ResumeSandbox", obj{"sandboxId": "sbx-0123456789"}, http.StatusNotFound, "not_found")
	sbxRefused(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": "box-1"}, http.StatusBadRequest, "invalid_argument", "sandbox_id")
	sbxRefused(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id, "keepMemory": true}, http.StatusBadRequest, "invalid_argument", "keepMemory")

	out = sbxOK(t, ctx, e, acmeToken, "ResumeSandbox", obj{"sandboxId": id})
	if fieldStr(out, "sandbox", "status") != "SANDBOX_STATUS_RUNNING" || field(out, "keepMemory") != nil {
		t.Fatalf("ResumeSandbox: %v", out)
	}
	if got := catFiles(t, ctx, e, acmeToken, id, "notes.md", "state.txt"); got != "hellokept" {
		t.Fatalf("files after a resume: %q", got)
	}
	sbxOK(t, ctx, e, acmeToken, "ResumeSandbox", obj{"sandboxId": id}) // running: nothing to do

	// A paused sandbox is deleted with its checkpoint and snapshot.
	sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})
	sbxOK(t, ctx, e, acmeToken, "DeleteSandbox", obj{"sandboxId": id})
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", id)
}

// TestSandboxAPISnapshots: a snapshot keeps a sandbox's workspace for new
// sandboxes, is its tenant's alone, counts against a quota, and is
// deleted without touching the sandboxes made from it.
func TestSandboxAPISnapshots(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Snapshots: 1} })
	ctx := ctxT(t)
	src := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	putFile(t, ctx, e, acmeToken, src, "dir/state.txt", "v1")

	out := sbxOK(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": src, "labels": obj{"stage": "one"}})
	snap := fieldStr(out, "snapshot", "snapshotId")
	if !strings.HasPrefix(snap, "snap-") || fieldStr(out, "snapshot", "sandboxId") != src || fieldNum(out, "snapshot", "sizeBytes") <= 0 ||
		fieldStr(out, "snapshot", "labels", "stage") != "one" {
		t.Fatalf("SnapshotSandbox: %v", out)
	}
	// The quota: one snapshot.
	sbxRefused(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": src}, http.StatusTooManyRequests, "resource_exhausted", "snapshots per tenant")
	// Changes after the snapshot are not in it.
	putFile(t, ctx, e, acmeToken, src, "dir/state.txt", "v2")

	list := sbxOK(t, ctx, e, acmeToken, "ListSnapshots", obj{})
	if snaps, _ := list["snapshots"].([]any); len(snaps) != 1 || fieldStr(snaps[0].(obj), "snapshotId") != snap {
		t.Fatalf("ListSnapshots: %v", list)
	}
	if list := sbxOK(t, ctx, e, acmeToken, "ListSnapshots", obj{"sandboxId": "sbx-0123456789"}); len(list) != 0 {
		t.Fatalf("ListSnapshots of another sandbox: %v", list)
	}

	made := createSandbox(t, ctx, e, acmeToken, obj{"fromSnapshot": snap, "labels": obj{"from": "snap"}})
	if got := catFiles(t, ctx, e, acmeToken, made, "notes.md", "dir/state.txt"); got != "hellov1" {
		t.Fatalf("a sandbox made from the snapshot has %q", got)
	}
	// Its files are its own account's (the restored ones too).
	putFile(t, ctx, e, acmeToken, made, "dir/state.txt", "v1")

	// Another tenant sees none of it.
	if list := sbxOK(t, ctx, e, evilToken, "ListSnapshots", obj{}); len(list) != 0 {
		t.Fatalf("another tenant's ListSnapshots: %v", list)
	}
	sbxRefused(t, ctx, e, evilToken, "CreateSandbox", obj{"fromSnapshot": snap}, http.StatusNotFound, "not_found", "snapshot")
	sbxRefused(t, ctx, e, evilToken, "DeleteSnapshot", obj{"snapshotId": snap}, http.StatusNotFound, "not_found")
	sbxRefused(t, ctx, e, evilToken, "SnapshotSandbox", obj{"sandboxId": src}, http.StatusNotFound, "not_found")
	// Bad input.
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{"fromSnapshot": snap, "manifest": sbxManifest}, http.StatusBadRequest, "invalid_argument", "manifest")
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{"fromSnapshot": "../etc"}, http.StatusBadRequest, "invalid_argument", "from_snapshot")
	sbxRefused(t, ctx, e, acmeToken, "DeleteSnapshot", obj{"snapshotId": "sbx-1"}, http.StatusBadRequest, "invalid_argument", "snapshot_id")
	sbxRefused(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": src, "labels": obj{"Bad Key": "x"}}, http.StatusBadRequest, "invalid_argument", "labels")

	sbxOK(t, ctx, e, acmeToken, "DeleteSnapshot", obj{"snapshotId": snap})
	if list := sbxOK(t, ctx, e, acmeToken, "ListSnapshots", obj{}); len(list) != 0 {
		t.Fatalf("ListSnapshots after DeleteSnapshot: %v", list)
	}
	sbxRefused(t, ctx, e, acmeToken, "DeleteSnapshot", obj{"snapshotId": snap}, http.StatusNotFound, "not_found")
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{"fromSnapshot": snap}, http.StatusNotFound, "not_found")
	if got := catFiles(t, ctx, e, acmeToken, made, "dir/state.txt"); got != "v1" {
		t.Fatalf("a sandbox made from a deleted snapshot has %q", got)
	}
	// Its slot came back.
	sbxOK(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": src})
}

// TestSandboxAPIFork: forks are independent copies of their source's
// workspace as it is now; the count is bounded and checked against the
// sandbox quota before anything is made.
func TestSandboxAPIFork(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Sandboxes: 4} })
	ctx := ctxT(t)
	src := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest, "labels": obj{"team": "a"}, "idleTimeout": "300s", "onIdle": "ON_IDLE_PAUSE"})
	putFile(t, ctx, e, acmeToken, src, "state.txt", "source")

	out := sbxOK(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": src, "count": 2})
	sbs, _ := out["sandboxes"].([]any)
	if len(sbs) != 2 || field(out, "keepMemory") != nil {
		t.Fatalf("ForkSandbox: %v", out)
	}
	a, b := fieldStr(sbs[0].(obj), "sandboxId"), fieldStr(sbs[1].(obj), "sandboxId")
	for _, sb := range sbs {
		o := sb.(obj)
		if fieldStr(o, "status") != "SANDBOX_STATUS_RUNNING" || fieldStr(o, "labels", "team") != "a" || fieldStr(o, "onIdle") != "ON_IDLE_PAUSE" ||
			fieldStr(o, "idleTimeout") != "300s" {
			t.Fatalf("a fork: %v", o)
		}
	}
	if a == b || a == src || b == src {
		t.Fatalf("fork ids %s %s of %s", a, b, src)
	}
	for _, id := range []string{a, b} {
		if got := catFiles(t, ctx, e, acmeToken, id, "notes.md", "state.txt"); got != "hellosource" {
			t.Fatalf("fork %s has %q", id, got)
		}
	}
	// Independent: a write in one is in neither the other nor the source.
	putFile(t, ctx, e, acmeToken, a, "state.txt", "fork a")
	if got := catFiles(t, ctx, e, acmeToken, b, "state.txt"); got != "source" {
		t.Fatalf("fork b after a write in fork a: %q", got)
	}
	if got := catFiles(t, ctx, e, acmeToken, src, "state.txt"); got != "source" {
		t.Fatalf("the source after a write in a fork: %q", got)
	}

	// Bad counts; the quota (3 held of 4: two more do not fit, and
	// nothing is made).
	before, _ := e.prov.List(ctx)
	sbxRefused(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": src}, http.StatusBadRequest, "invalid_argument", "count")
	sbxRefused(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": src, "count": -1}, http.StatusBadRequest, "invalid_argument", "count")
	sbxRefused(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": src, "count": 17}, http.StatusBadRequest, "invalid_argument", "count")
	sbxRefused(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": src, "count": 2}, http.StatusTooManyRequests, "resource_exhausted", "sandboxes per tenant")
	sbxRefused(t, ctx, e, evilToken, "ForkSandbox", obj{"sandboxId": src, "count": 1}, http.StatusNotFound, "not_found")
	if after, _ := e.prov.List(ctx); len(after) != len(before) {
		t.Fatalf("refused forks made sandboxes: %d before, %d after", len(before), len(after))
	}
	// The last slot.
	sbxOK(t, ctx, e, acmeToken, "ForkSandbox", obj{"sandboxId": src, "count": 1})
}

// TestSandboxAPIOnIdlePause: a sandbox made with on_idle PAUSE is paused,
// not deleted, once idle, and its next call resumes it; a paused one is
// still deleted at its ttl.
func TestSandboxAPIOnIdlePause(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest, "ttl": "600s", "idleTimeout": "1s", "onIdle": "ON_IDLE_PAUSE"})
	short := createSandbox(t, ctx, e, acmeToken, obj{"ttl": "4s", "idleTimeout": "1s", "onIdle": "ON_IDLE_PAUSE"})
	putFile(t, ctx, e, acmeToken, id, "state.txt", "kept")
	for status(t, ctx, e, acmeToken, id) != "SANDBOX_STATUS_PAUSED" {
		select {
		case <-ctx.Done():
			t.Fatal("an idle sandbox with on_idle PAUSE was never paused")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := fieldStr(sbxOK(t, ctx, e, acmeToken, "GetSandbox", obj{"sandboxId": id}), "sandbox", "onIdle"); got != "ON_IDLE_PAUSE" {
		t.Fatalf("onIdle: %q", got)
	}
	// The next call resumes it.
	if got := catFiles(t, ctx, e, acmeToken, id, "notes.md", "state.txt"); got != "hellokept" {
		t.Fatalf("files after an idle pause: %q", got)
	}
	if got := status(t, ctx, e, acmeToken, id); got != "SANDBOX_STATUS_RUNNING" && got != "SANDBOX_STATUS_PAUSED" {
		t.Fatalf("after its next call: %s", got)
	}
	// The ttl still applies to a paused sandbox.
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", short)
	// An explicit pause is not undone by a call.
	sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "true"}, http.StatusBadRequest, "failed_precondition", "paused")
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{"onIdle": "ON_IDLE_SLEEP"}, http.StatusBadRequest, "invalid_argument")
}

// TestSandboxAPIIdleMeansIdle: a sandbox busy on its own (a process using
// CPU, no call of the service) is not idle at its idle deadline; once it
// is quiet, it goes.
func TestSandboxAPIIdleMeansIdle(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"ttl": "600s", "idleTimeout": "2s"})
	// Busy for about 8 s, then quiet; the service is not called meanwhile.
	sbxOK(t, ctx, e, acmeToken, "StartProcess", obj{"sandboxId": id,
		"command": "end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do :; done; echo done > done.txt"})
	time.Sleep(5 * time.Second) // two idle timeouts and more
	rec, err := e.store.GetSandbox(ctx, "token:acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Gone || !e.sandboxExists(t, id) {
		t.Fatal("a sandbox whose process kept using CPU was deleted as idle")
	}
	e.waitAPISandboxGone(t, ctx, acmeToken, "token:acme", id)
}

// TestSandboxAPIPauseRestart: a restarted service finds paused sandboxes
// paused and snapshots listed, both counted against their quotas.
func TestSandboxAPIPauseRestart(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Sandboxes: 2, Snapshots: 1} })
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	putFile(t, ctx, e, acmeToken, id, "state.txt", "kept")
	snap := fieldStr(sbxOK(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": id}), "snapshot", "snapshotId")
	sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})

	e.restart()
	if got := status(t, ctx, e, acmeToken, id); got != "SANDBOX_STATUS_PAUSED" {
		t.Fatalf("a paused sandbox after a restart: %s", got)
	}
	sbxRefused(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id, "command": "true"}, http.StatusBadRequest, "failed_precondition", "paused")
	list := sbxOK(t, ctx, e, acmeToken, "ListSnapshots", obj{})
	if snaps, _ := list["snapshots"].([]any); len(snaps) != 1 || fieldStr(snaps[0].(obj), "snapshotId") != snap {
		t.Fatalf("ListSnapshots after a restart: %v", list)
	}
	sbxRefused(t, ctx, e, evilToken, "DeleteSnapshot", obj{"snapshotId": snap}, http.StatusNotFound, "not_found")
	made := createSandbox(t, ctx, e, acmeToken, obj{"fromSnapshot": snap})
	// Both quotas are full: the paused sandbox and the snapshot hold
	// their slots.
	sbxRefused(t, ctx, e, acmeToken, "CreateSandbox", obj{}, http.StatusTooManyRequests, "resource_exhausted", "sandboxes per tenant")
	sbxRefused(t, ctx, e, acmeToken, "SnapshotSandbox", obj{"sandboxId": made}, http.StatusTooManyRequests, "resource_exhausted", "snapshots per tenant")

	sbxOK(t, ctx, e, acmeToken, "ResumeSandbox", obj{"sandboxId": id})
	if got := catFiles(t, ctx, e, acmeToken, id, "notes.md", "state.txt"); got != "hellokept" {
		t.Fatalf("files of a paused sandbox resumed after a restart: %q", got)
	}
	if got := catFiles(t, ctx, e, acmeToken, made, "state.txt"); got != "kept" {
		t.Fatalf("a sandbox made from a snapshot after a restart: %q", got)
	}
}

// TestSandboxAPIPauseKeepsMemory: under gVisor a pause keeps the
// sandbox's memory and processes: a process started before it runs on
// after the resume.
func TestSandboxAPIPauseKeepsMemory(t *testing.T) {
	testenv.Require(t, testenv.Root) // runsc restores only as root
	bin := runsc.Require(t)
	rootfs := agentdtest.RootFS(t)
	e := newEnvWith(t, envOptions{local: func(c *local.Config) {
		c.Isolation, c.Runsc, c.RootFS = local.IsolationGVisor, bin, rootfs
	}})
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	// A counter kept in the shell's memory, written out as it goes.
	started := sbxOK(t, ctx, e, acmeToken, "StartProcess", obj{"sandboxId": id,
		"command": "i=0; while :; do i=$((i+1)); echo $i > count.txt; sleep 0.1; done"})
	pid := fieldStr(started, "process", "processId")
	waitCount := func(least int) int {
		t.Helper()
		for {
			var n int
			if got := catFiles(t, ctx, e, acmeToken, id, "count.txt"); got != "" {
				if _, err := fmt.Sscan(got, &n); err == nil && n >= least {
					return n
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the counter never reached %d", least)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	before := waitCount(3)

	out := sbxOK(t, ctx, e, acmeToken, "PauseSandbox", obj{"sandboxId": id})
	if field(out, "keepMemory") != true || field(out, "sandbox", "keepMemory") != true {
		t.Fatalf("PauseSandbox under gVisor: %v", out)
	}
	out = sbxOK(t, ctx, e, acmeToken, "ResumeSandbox", obj{"sandboxId": id})
	if field(out, "keepMemory") != true {
		t.Fatalf("ResumeSandbox under gVisor: %v", out)
	}
	// The same process counts on from where it was, not from 1.
	waitCount(before + 3)
	procs := sbxOK(t, ctx, e, acmeToken, "ListProcesses", obj{"sandboxId": id})
	found := false
	for _, p := range procs["processes"].([]any) {
		if fieldStr(p.(obj), "processId") == pid && fieldStr(p.(obj), "state") == "PROCESS_STATE_RUNNING" {
			found = true
		}
	}
	if !found {
		t.Fatalf("process %s is not running after the resume: %v", pid, procs)
	}
}
