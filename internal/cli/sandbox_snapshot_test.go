package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
)

// TestSnapshotStoreS3AcrossMachines: two harnesses with separate state
// directories share only an S3 snapshot store. A session created on the
// second starts from the snapshot the first took; snapshot ls, rm and gc
// manage the store; no credential reaches the saved state or an error.
func TestSnapshotStoreS3AcrossMachines(t *testing.T) {
	testenv.Require(t, testenv.Linux) // local sandboxes
	srv := s3server.Start(t)
	bucket := srv.Bucket(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	bin := agentdtest.Binaries(t).Agentd
	store := []string{"--snapshot-store", "s3://" + bucket + "/fleet", "--s3-endpoint", srv.Endpoint}
	stateA, stateB := t.TempDir(), t.TempDir()
	// Plain local sandboxes run as accounts of their own, which must pass
	// through the state directories.
	for _, d := range []string{filepath.Dir(stateA), stateA, stateB} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	runOn := func(ctx context.Context, state string) cliRun {
		base := newCLIRun(ctx, state, bin)
		return func(args ...string) (int, string, string) {
			return base(append(append([]string{}, store...), args...)...)
		}
	}
	runA, runB := runOn(t.Context(), stateA), runOn(t.Context(), stateB)
	t.Cleanup(func() {
		runOn(context.Background(), stateA)("sandbox", "rm", "m1", "--keep-snapshot")
		runOn(context.Background(), stateB)("sandbox", "rm", "m1", "--keep-snapshot")
	})

	mustRun(t, runA, "sandbox", "create", "--id", "m1")
	local := t.TempDir()
	writeTree(t, local, map[string]string{"proj/a.txt": "alpha\n", "proj/sub/b.txt": strings.Repeat("beta\n", 20000)})
	mustRun(t, runA, "sandbox", "cp", filepath.Join(local, "proj"), "m1:proj")
	if out := mustRun(t, runA, "sandbox", "snapshot", "m1"); out != "m1\n" {
		t.Fatalf("snapshot printed %q", out)
	}
	if out := mustRun(t, runA, "sandbox", "snapshot", "ls", "--long"); !strings.Contains(out, "m1") || strings.Contains(out, "\tm1\t-") {
		t.Fatalf("snapshot ls:\n%s", out)
	}
	stateFile, err := os.ReadFile(filepath.Join(stateA, "sessions", "m1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(stateFile), srv.SecretKey) || strings.Contains(string(stateFile), srv.AccessKey) {
		t.Fatal("a credential is in the saved session state")
	}

	// Machine B shares only the store: a session created there under the
	// same id (its default snapshot id) starts from the snapshot.
	if out := mustRun(t, runB, "sandbox", "create", "--id", "m1"); out != "m1\n" {
		t.Fatalf("create on machine B: %q", out)
	}
	if out := mustRun(t, runB, "sandbox", "exec", "m1", "--", "cat", "proj/a.txt"); out != "alpha\n" {
		t.Fatalf("after resume on B: %q", out)
	}
	out := filepath.Join(local, "back")
	mustRun(t, runB, "sandbox", "cp", "m1:proj", out)
	sameTree(t, "workspace moved between machines", readTree(t, out), withDirs(map[string]string{"a.txt": "alpha\n", "sub/b.txt": strings.Repeat("beta\n", 20000)}))

	// ls --json, rm, gc.
	var listed []snapshotEntry
	if err := json.Unmarshal([]byte(mustRun(t, runB, "sandbox", "snapshot", "ls", "--json", "-l")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].ID != "m1" || listed[0].Size == 0 || listed[0].Chunks == 0 || listed[0].Modified.IsZero() {
		t.Fatalf("ls --json: %+v", listed)
	}
	if code, _, errs := runB("sandbox", "snapshot", "rm", "nope"); code == 0 || !strings.Contains(errs, "no snapshot nope") {
		t.Fatalf("rm of an absent snapshot: exit %d, %q", code, errs)
	}
	if out := mustRun(t, runB, "sandbox", "snapshot", "rm", "m1"); out != "removed snapshot m1\n" {
		t.Fatalf("rm: %q", out)
	}
	if out := mustRun(t, runB, "sandbox", "snapshot", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %s", out)
	}
	if out := mustRun(t, runB, "sandbox", "snapshot", "gc", "--grace", "1ns"); !strings.Contains(out, "deleted") || strings.Contains(out, "deleted 0 ") {
		t.Fatalf("gc: %q", out)
	}

	// Wrong credentials: a clear error without them; credentials in the
	// URL are refused.
	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-"+srv.SecretKey[:6])
	code, _, errs := runB("sandbox", "snapshot", "ls")
	if code == 0 || !strings.Contains(errs, "refused the credentials") || strings.Contains(errs, "not-the-secret") || strings.Contains(errs, srv.AccessKey) {
		t.Fatalf("ls with a wrong secret: exit %d, %q", code, errs)
	}
	code, _, errs = newCLIRun(t.Context(), stateB, bin)("--snapshot-store", "s3://AKIA:hunter2@"+bucket, "sandbox", "snapshot", "ls")
	if code == 0 || strings.Contains(errs, "hunter2") || !strings.Contains(errs, "credentials") {
		t.Fatalf("credentials in the URL: exit %d, %q", code, errs)
	}
}
