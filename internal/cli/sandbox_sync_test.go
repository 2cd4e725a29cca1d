package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
)

// syncBucket is a Versity bucket with helpers to read and write its keys.
type syncBucket struct {
	t      *testing.T
	srv    *s3server.Server
	bucket string
}

func (b syncBucket) put(key, body string) {
	b.t.Helper()
	if _, err := b.srv.Client().PutObject(b.t.Context(), &s3.PutObjectInput{Bucket: aws.String(b.bucket), Key: aws.String(key), Body: strings.NewReader(body)}); err != nil {
		b.t.Fatal(err)
	}
}

// get returns the object at key and whether there is one.
func (b syncBucket) get(key string) (string, bool) {
	b.t.Helper()
	out, err := b.srv.Client().GetObject(b.t.Context(), &s3.GetObjectInput{Bucket: aws.String(b.bucket), Key: aws.String(key)})
	if err != nil {
		var coded interface{ ErrorCode() string }
		if errors.As(err, &coded) && coded.ErrorCode() == "NoSuchKey" {
			return "", false
		}
		b.t.Fatal(err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return string(data), true
}

func (b syncBucket) want(files map[string]string) {
	b.t.Helper()
	for key, want := range files {
		got, ok := b.get(key)
		switch {
		case want == "" && ok:
			b.t.Fatalf("%s is still in the bucket (%q)", key, got)
		case want != "" && got != want:
			b.t.Fatalf("%s = %q (present %v), want %q", key, got, ok, want)
		}
	}
}

// TestSandboxSyncAndRmFromTheCLI: each command is a fresh harness (its own
// Mounter), as separate processes would be, sharing only the state
// directory. `sandbox sync` uploads a writable mount's changes, new files
// and deletions from a sandbox another command created, reports a remote
// change as a conflict (exit non-zero, the remote copy kept) and still
// syncs the rest; `sandbox rm` refuses to remove a sandbox whose mounts do
// not sync (nothing removed), removes it with --no-sync without uploading,
// and otherwise syncs first. The saved baselines go with the session.
func TestSandboxSyncAndRmFromTheCLI(t *testing.T) {
	testenv.Require(t, testenv.Linux) // local sandboxes
	testenv.Require(t, testenv.Root)  // the mount belongs to the run_as account
	srv := s3server.Start(t)
	b := syncBucket{t: t, srv: srv, bucket: srv.Bucket(t)}
	b.put("w/edit.txt", "before")
	b.put("w/gone.txt", "delete me")
	b.put("w/theirs.txt", "t1")
	t.Setenv("BH_TEST_SYNC_ID", srv.AccessKey)
	t.Setenv("BH_TEST_SYNC_SECRET", srv.SecretKey)
	m := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(m, []byte(`version: 1
entries:
  out:
    type: s3_mount
    bucket: `+b.bucket+`
    prefix: w
    endpoint: `+srv.Endpoint+`
    region: `+srv.Region+`
    read_only: false
    credentials: {access_key_id: {secret: BH_TEST_SYNC_ID}, secret_access_key: {secret: BH_TEST_SYNC_SECRET}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	state := testenv.SearchableTempDir(t)
	agentd := agentdtest.Binaries(t).Agentd
	run := newCLIRun(ctx, state, agentd)
	t.Cleanup(func() {
		cleanup := newCLIRun(context.Background(), state, agentd)
		cleanup("sandbox", "rm", "--no-sync", "sy")
		cleanup("sandbox", "rm", "--no-sync", "sy2")
	})
	baselines := func() []os.DirEntry {
		entries, err := os.ReadDir(filepath.Join(state, "mount-baselines"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return entries
	}

	mustRun(t, run, "sandbox", "create", "--id", "sy", "--manifest", m)
	if len(baselines()) != 1 {
		t.Fatalf("create saved no mount baseline in the state directory: %v", baselines())
	}
	mustRun(t, run, "sandbox", "exec", "sy", "--", "sh", "-c", "cd out && printf after > edit.txt && rm gone.txt && printf new > new.txt")
	out := mustRun(t, run, "sandbox", "sync", "sy")
	if !strings.Contains(out, "2 uploaded, 1 deleted, 1 unchanged, 0 conflicts") {
		t.Fatalf("sync said:\n%s", out)
	}
	b.want(map[string]string{"w/edit.txt": "after", "w/new.txt": "new", "w/gone.txt": "", "w/theirs.txt": "t1"})

	// A remote change meets a local one: a conflict, the rest synced.
	b.put("w/theirs.txt", "t2 remote")
	mustRun(t, run, "sandbox", "exec", "sy", "--", "sh", "-c", "cd out && printf mine > theirs.txt && printf third > edit.txt")
	code, out, errOut := run("sandbox", "sync", "sy")
	if code == 0 || !strings.Contains(out, "conflict: out/theirs.txt") || !strings.Contains(errOut, "out/theirs.txt") {
		t.Fatalf("sync with a conflict: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	b.want(map[string]string{"w/edit.txt": "third", "w/theirs.txt": "t2 remote"})

	// rm syncs first; the standing conflict stops it, and nothing is
	// removed.
	mustRun(t, run, "sandbox", "exec", "sy", "--", "sh", "-c", "printf fourth > out/edit.txt")
	if code, out, errOut := run("sandbox", "rm", "sy"); code == 0 || !strings.Contains(errOut, "--no-sync") {
		t.Fatalf("rm with a conflict: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if out := mustRun(t, run, "sandbox", "exec", "sy", "--", "cat", "out/edit.txt"); out != "fourth" {
		t.Fatalf("the sandbox was touched by a refused rm: edit.txt = %q", out)
	}
	b.want(map[string]string{"w/edit.txt": "fourth", "w/theirs.txt": "t2 remote"}) // the sync ran; only the conflict stayed
	mustRun(t, run, "sandbox", "exec", "sy", "--", "sh", "-c", "printf fifth > out/edit.txt")
	mustRun(t, run, "sandbox", "rm", "--no-sync", "sy")
	b.want(map[string]string{"w/edit.txt": "fourth", "w/theirs.txt": "t2 remote"})
	if out := mustRun(t, run, "sandbox", "ls"); strings.Contains(out, "sy") {
		t.Fatalf("rm --no-sync left the sandbox:\n%s", out)
	}
	if left := baselines(); len(left) != 0 {
		t.Fatalf("rm left the session's mount baselines: %v", left)
	}

	// A clean rm syncs the last changes before it removes.
	mustRun(t, run, "sandbox", "create", "--id", "sy2", "--manifest", m)
	mustRun(t, run, "sandbox", "exec", "sy2", "--", "sh", "-c", "printf last > out/last.txt && rm out/new.txt")
	out = mustRun(t, run, "sandbox", "rm", "sy2")
	if !strings.Contains(out, "1 uploaded, 1 deleted") || !strings.Contains(out, "removed session sy2") {
		t.Fatalf("rm said:\n%s", out)
	}
	b.want(map[string]string{"w/last.txt": "last", "w/new.txt": ""})
	if left := baselines(); len(left) != 0 {
		t.Fatalf("rm left the session's mount baselines: %v", left)
	}
	// No sandbox: sync says so.
	mustRun(t, run, "sandbox", "create", "--id", "sy", "--manifest", m)
	mustRun(t, run, "sandbox", "rm", "--keep-snapshot", "sy")
	if code, _, errOut := run("sandbox", "sync", "sy"); code == 0 || !strings.Contains(errOut, "gone") {
		t.Fatalf("sync of a removed sandbox: exit %d, stderr %q", code, errOut)
	}
}
