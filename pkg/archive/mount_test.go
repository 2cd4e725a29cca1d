package archive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// mountTmpfs mounts a tmpfs at dir, or skips the test when it may not.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		testenv.Skip(t, fmt.Sprintf("cannot mount a tmpfs (root with CAP_SYS_ADMIN): %v", err))
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

// TestMountPoints restores over a workspace with mount points: excluded
// ones are preserved in place (and never descended into); one that is not
// excluded cannot be moved, and the restore is undone.
func TestMountPoints(t *testing.T) {
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "a/file"), "from the archive\n", 0o644)
	writeFile(t, filepath.Join(src, "top"), "top\n", 0o644)
	data := archiveOf(t, src, WriteOptions{})

	root := t.TempDir()
	mountTmpfs(t, filepath.Join(root, "mnt"))
	mountTmpfs(t, filepath.Join(root, "a/deep/mnt"))
	writeFile(t, filepath.Join(root, "mnt/data"), "mounted data\n", 0o600)
	writeFile(t, filepath.Join(root, "a/deep/mnt/data"), "deep mounted data\n", 0o600)
	writeFile(t, filepath.Join(root, "a/old"), "old\n", 0o600)

	opts := RestoreOptions{Exclude: []string{"mnt", "a/deep/mnt"}}
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), opts); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	for p, want := range map[string]string{"mnt/data": "mounted data\n", "a/deep/mnt/data": "deep mounted data\n",
		"a/file": "from the archive\n", "top": "top\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "a/old")); !os.IsNotExist(err) {
		t.Errorf("a/old survived: %v", err)
	}
	requireNoStaging(t, root)

	// Without the excludes the restore refuses to move the mount points,
	// naming the first, and changes nothing.
	before := describe(t, root)
	_, err := Restore(context.Background(), root, bytes.NewReader(data), RestoreOptions{})
	requirePathError(t, err, errkind.ErrFailedPrecondition, "a/deep/mnt")
	requireSame(t, "workspace with mount points", before, describe(t, root))
	requireNoStaging(t, root)

	// Should a mount slip through (mounted during the restore), the swap
	// cannot move a mount point itself, and the restore is undone.
	opts.Exclude = []string{"a/deep/mnt"}
	opts.Fault = func(s Step) error {
		if s == (Step{Name: StepOut, N: 1}) {
			mountTmpfs(t, filepath.Join(root, "top"))
		}
		return nil
	}
	if err := os.Remove(filepath.Join(root, "top")); err != nil { // a file so far
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "top"), 0o755); err != nil {
		t.Fatal(err)
	}
	before = describe(t, root)
	_, err = Restore(context.Background(), root, bytes.NewReader(data), opts)
	requirePathError(t, err, errkind.ErrFailedPrecondition, "")
	_ = unix.Unmount(filepath.Join(root, "top"), unix.MNT_DETACH)
	requireSame(t, "workspace with a late mount point", before, describe(t, root))
	requireNoStaging(t, root)
}

// TestRemoveTreeStopsAtMounts checks that removing a directory never
// empties a filesystem mounted below it.
func TestRemoveTreeStopsAtMounts(t *testing.T) {
	root := t.TempDir()
	mountTmpfs(t, filepath.Join(root, "victim/a/mnt"))
	writeFile(t, filepath.Join(root, "victim/a/mnt/precious"), "keep\n", 0o600)
	writeFile(t, filepath.Join(root, "victim/b/f"), "x\n", 0o600)
	writeFile(t, filepath.Join(root, "victim/ro/f"), "x\n", 0o600)
	_ = os.Chmod(filepath.Join(root, "victim/ro"), 0o500)
	rt, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	tr, err := openTree(rt)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	if err := tr.remove("victim"); !errors.Is(err, errMountPoint) {
		t.Fatalf("remove = %v, want errMountPoint", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "victim/a/mnt/precious")); err != nil || string(b) != "keep\n" {
		t.Fatalf("mounted file: %q, %v", b, err)
	}
	for _, gone := range []string{"victim/b", "victim/ro"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s not removed: %v", gone, err)
		}
	}
}
