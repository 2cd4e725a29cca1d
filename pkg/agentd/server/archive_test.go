package server

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// treeOf maps every path below root to a description of it.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out, err := readTree(root)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readTree describes every path below root (mode, symlink target, file
// content).
func readTree(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().String()
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case d.Type().IsRegular():
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		out[rel] = desc
		return nil
	})
	return out, err
}

func sameTree(t *testing.T, want, got map[string]string) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("trees differ:\nwant %v\ngot  %v", want, got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: want %q, got %q", k, v, got[k])
		}
	}
}

func TestArchiveRestoreRoundTrip(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	writeTree(t, td.workspace, map[string]string{"repo/main.go": "package main\n", "repo/README.md": "# hi\n", "notes.txt": "n", "cache/big.bin": "ephemeral"})
	if err := os.Symlink("repo/main.go", filepath.Join(td.workspace, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(td.workspace, "repo/main.go"), 0o755); err != nil {
		t.Fatal(err)
	}
	excl := []string{"cache"}
	before := treeOf(t, td.workspace)
	fp1, err := td.client.Fingerprint(ctx, agentclient.FingerprintOptions{Exclude: excl})
	if err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	stats, err := td.client.Archive(ctx, agentclient.ArchiveOptions{Exclude: excl}, &snap)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Files != 3 || stats.Symlinks != 1 {
		t.Fatalf("stats %v", stats)
	}
	// The model wrecks the workspace; the cache (excluded) changes too.
	if err := os.RemoveAll(filepath.Join(td.workspace, "repo")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, td.workspace, map[string]string{"junk.txt": "x", "cache/big.bin": "new cache"})
	fp2, _ := td.client.Fingerprint(ctx, agentclient.FingerprintOptions{Exclude: excl})
	if fp2 == fp1 {
		t.Fatal("fingerprint did not change")
	}
	if _, err := td.client.Restore(ctx, agentclient.RestoreOptions{Exclude: excl}, bytes.NewReader(snap.Bytes())); err != nil {
		t.Fatal(err)
	}
	after := treeOf(t, td.workspace)
	want := before
	want["cache/big.bin"] = after["cache/big.bin"] // excluded: kept as the workspace had it
	sameTree(t, want, after)
	if b, _ := os.ReadFile(filepath.Join(td.workspace, "cache/big.bin")); string(b) != "new cache" {
		t.Fatalf("excluded path was not preserved: %q", b)
	}
	fp3, _ := td.client.Fingerprint(ctx, agentclient.FingerprintOptions{Exclude: excl})
	if fp3 != fp1 {
		t.Fatalf("fingerprint after restore %s, want %s", fp3, fp1)
	}
}

func TestRestoreRejectsMaliciousArchiveChangingNothing(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	writeTree(t, td.workspace, map[string]string{"keep.txt": "precious"})
	before := treeOf(t, td.workspace)
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	for _, h := range []*tar.Header{
		{Name: "ok.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg},
		{Name: "../escape.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte("hi"))
	}
	tw.Close()
	_, err := td.client.Restore(ctx, agentclient.RestoreOptions{}, bytes.NewReader(evil.Bytes()))
	if !errors.Is(err, errkind.ErrPathEscape) && !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("want a path error, got %v", err)
	}
	sameTree(t, before, treeOf(t, td.workspace))
	if _, err := os.Stat(filepath.Join(filepath.Dir(td.workspace), "escape.txt")); !os.IsNotExist(err) {
		t.Fatal("a member escaped the workspace")
	}
}

func TestRestoreInterruptedChangesNothing(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	// Large enough that cutting the archive in half always cuts inside the
	// file's content (not in the end-of-archive blocks).
	writeTree(t, td.workspace, map[string]string{"a.txt": strings.Repeat("A", 64<<10)})
	var snap bytes.Buffer
	if _, err := td.client.Archive(ctx, agentclient.ArchiveOptions{Compression: agentclient.CompressionNone}, &snap); err != nil {
		t.Fatal(err)
	}
	writeTree(t, td.workspace, map[string]string{"a.txt": "changed", "b.txt": "B"})
	before := treeOf(t, td.workspace)
	// The archive ends halfway (a truncated snapshot): the daemon's
	// extraction fails, rolls back, and only then answers.
	if _, err := td.client.Restore(ctx, agentclient.RestoreOptions{}, bytes.NewReader(snap.Bytes()[:snap.Len()/2])); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("truncated archive: want ErrInvalidArgument, got %v", err)
	}
	sameTree(t, before, treeOf(t, td.workspace))
	// The source fails halfway: the client aborts the stream and returns at
	// once; the daemon's restore fails and rolls back on its own time (the
	// archive package tests cancellation at every step).
	half := io.MultiReader(bytes.NewReader(snap.Bytes()[:snap.Len()/2]), errReader{})
	if _, err := td.client.Restore(ctx, agentclient.RestoreOptions{}, half); err == nil {
		t.Fatal("want an error")
	}
	eventuallySameTree(t, before, td.workspace)
	// Garbage is refused cleanly too (this call may queue behind the
	// aborted restore above, which the daemon serializes).
	if _, err := td.client.Restore(ctx, agentclient.RestoreOptions{}, bytes.NewReader([]byte("not an archive at all"))); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("garbage: want ErrInvalidArgument, got %v", err)
	}
	eventuallySameTree(t, before, td.workspace)
}

// eventuallySameTree waits until the tree at root equals want. The
// daemon may be rolling back meanwhile, so a path that vanishes under the
// walk (its staging directory being removed) only means: look again.
func eventuallySameTree(t *testing.T, want map[string]string, root string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := readTree(root)
		if err == nil && maps.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatal(err)
			}
			sameTree(t, want, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source failed") }

// oldFiles and newFiles are the trees of the interrupted-restore tests:
// the workspace before, and what the archive holds.
var (
	oldFiles = map[string]string{"README": "old readme\n", "repo/main.go": "package main // old\n", "old.txt": "old\n"}
	newFiles = map[string]string{"README": "new readme\n", "repo/main.go": "package main // new\n", "repo/new.txt": "new\n"}
)

// interruptedRestore leaves ws as a daemon killed at step at of a restore
// leaves it: the old tree partly replaced by the archive's, and the
// restore's journal in the workspace's private area. It returns the id of
// the interrupted restore and the tree a complete restore makes.
func interruptedRestore(t *testing.T, ws string, at archive.Step) (string, map[string]string) {
	t.Helper()
	ctx := ctxT(t)
	src, ref := t.TempDir(), t.TempDir()
	writeTree(t, src, newFiles)
	var data bytes.Buffer
	if _, err := archive.Write(ctx, src, &data, archive.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	writeTree(t, ref, oldFiles)
	if _, err := archive.Restore(ctx, ref, bytes.NewReader(data.Bytes()), archive.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	writeTree(t, ws, oldFiles)
	done := make(chan bool)
	go func() {
		returned := false
		defer func() { done <- returned }()
		// The hook ends the goroutine where the process would die:
		// nothing after that step runs, not even a rollback.
		_, _ = archive.Restore(ctx, ws, bytes.NewReader(data.Bytes()), archive.RestoreOptions{Fault: func(s archive.Step) error {
			if s == at {
				runtime.Goexit()
			}
			return nil
		}})
		returned = true
	}()
	if <-done {
		t.Fatalf("the restore did not stop at %v", at)
	}
	id, err := archive.Pending(ws)
	if err != nil || id == "" {
		t.Fatalf("no pending restore after the interruption: %q, %v", id, err)
	}
	return id, treeOf(t, ref)
}

// TestStartupRecoversInterruptedRestore starts a daemon on a workspace a
// killed daemon left mid-swap: before it serves anything the restore is
// rolled forward, so the workspace is exactly the archive's tree with
// nothing left behind, and it archives that tree.
func TestStartupRecoversInterruptedRestore(t *testing.T) {
	ws := filepath.Join(t.TempDir(), "ws")
	_, want := interruptedRestore(t, ws, archive.Step{Name: archive.StepOut, N: 2})
	if maps.Equal(want, treeOf(t, ws)) {
		t.Fatal("the interrupted restore already left the new tree")
	}
	td := newTestDaemon(t, func(c *agentd.Config) { c.WorkspaceRoot = ws })
	sameTree(t, want, treeOf(t, ws)) // no private area, stage or backup either
	if id, err := archive.Pending(ws); id != "" || err != nil {
		t.Fatalf("still pending after the start: %q, %v", id, err)
	}
	var snap bytes.Buffer
	if _, err := td.client.Archive(ctxT(t), agentclient.ArchiveOptions{}, &snap); err != nil {
		t.Fatalf("Archive after the recovery: %v", err)
	}
}

// TestArchiveRefusedWhileRestoreIncomplete starts a daemon on a workspace
// whose interrupted restore cannot be completed (a sandbox process wrote
// where a staged entry must go): Archive, Fingerprint and Restore are
// refused with FailedPrecondition naming the restore and the entry, over
// the wire, and nothing changes. Once the entry is removed (through the
// daemon, which did not restart), the next call completes the restore
// first and succeeds.
func TestArchiveRefusedWhileRestoreIncomplete(t *testing.T) {
	ctx := ctxT(t)
	ws := filepath.Join(t.TempDir(), "ws")
	id, want := interruptedRestore(t, ws, archive.Step{Name: archive.StepIn, N: 1})
	writeTree(t, ws, map[string]string{"README": "written by a sandbox process meanwhile\n"})
	td := newTestDaemon(t, func(c *agentd.Config) { c.WorkspaceRoot = ws })
	stuck, err := readTree(ws)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Archive": func() error {
			_, err := td.client.Archive(ctx, agentclient.ArchiveOptions{}, io.Discard)
			return err
		},
		"Fingerprint": func() error {
			_, err := td.client.Fingerprint(ctx, agentclient.FingerprintOptions{})
			return err
		},
		"Restore": func() error {
			var empty bytes.Buffer
			tw := tar.NewWriter(&empty)
			_ = tw.Close()
			_, err := td.client.Restore(ctx, agentclient.RestoreOptions{}, &empty)
			return err
		},
	}
	for name, call := range calls {
		err := call()
		if status.Code(err) != codes.FailedPrecondition || !errors.Is(err, errkind.ErrFailedPrecondition) {
			t.Fatalf("%s during an incomplete restore: %v, want FailedPrecondition", name, err)
		}
		if msg := err.Error(); !strings.Contains(msg, id) || !strings.Contains(msg, "README") {
			t.Fatalf("%s: %q does not name restore %s and README", name, msg, id)
		}
		sameTree(t, stuck, treeOf(t, ws))
	}
	if err := td.client.Remove(ctx, "README", agentclient.RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := td.client.Fingerprint(ctx, agentclient.FingerprintOptions{}); err != nil {
		t.Fatalf("Fingerprint once the way is clear: %v", err)
	}
	sameTree(t, want, treeOf(t, ws))
	if err := calls["Archive"](); err != nil {
		t.Fatalf("Archive after the recovery: %v", err)
	}
}
