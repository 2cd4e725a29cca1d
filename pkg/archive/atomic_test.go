package archive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// swapFixture is a workspace with entries to replace, preserved excluded
// paths at the top and deeper down, and an archive that changes all of it.
func swapFixture(t *testing.T) (root string, data []byte, opts RestoreOptions) {
	t.Helper()
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "a/new"), "new a content\n", 0o644)
	writeFile(t, filepath.Join(src, "a/mnt/ignored"), "never restored\n", 0o644)
	writeFile(t, filepath.Join(src, "b"), "b is a file now\n", 0o600)
	writeFile(t, filepath.Join(src, "c/d/e"), "deep\n", 0o644)
	if err := os.Symlink("c/d", filepath.Join(src, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "a"), 0o750); err != nil {
		t.Fatal(err)
	}
	data = archiveOf(t, src, WriteOptions{})

	root = t.TempDir()
	writeFile(t, filepath.Join(root, "a/old"), "old a content\n", 0o644)
	writeFile(t, filepath.Join(root, "a/mnt/mounted"), "preserved\n", 0o600)
	writeFile(t, filepath.Join(root, "b/was-a-dir"), "x\n", 0o644)
	writeFile(t, filepath.Join(root, "keep/me"), "top-level preserved\n", 0o644)
	writeFile(t, filepath.Join(root, "z"), "removed by the restore\n", 0o644)
	if err := os.Symlink("/nowhere", filepath.Join(root, "l")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "ro/f"), "in a read-only dir\n", 0o444)
	if err := os.Chmod(filepath.Join(root, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	return root, data, RestoreOptions{Exclude: []string{"a/mnt", "keep"}}
}

func TestSwapFailureRollsBack(t *testing.T) {
	root, data, opts := swapFixture(t)
	// Record the steps of a successful restore on a copy of the fixture.
	var steps []Step
	moves := 0
	{
		r2, d2, o2 := swapFixture(t)
		o2.Fault = func(s Step) error {
			steps = append(steps, s)
			if s.Name == StepOut || s.Name == StepIn {
				moves++
			}
			return nil
		}
		if _, err := Restore(context.Background(), r2, bytes.NewReader(d2), o2); err != nil {
			t.Fatal(err)
		}
	}
	if moves < 8 {
		t.Fatalf("only %d swap steps", moves)
	}
	before := describe(t, root)
	rootInfo, _ := os.Stat(root)
	injected := errors.New("injected failure")
	for _, fail := range steps {
		if fail.Name == StepCleanup { // failures there are logged and ignored
			continue
		}
		opts.Fault = func(s Step) error {
			if s == fail {
				return injected
			}
			return nil
		}
		_, err := Restore(context.Background(), root, bytes.NewReader(data), opts)
		if !errors.Is(err, injected) {
			t.Fatalf("step %v: error %v, want the injected one", fail, err)
		}
		requireSame(t, "workspace after a failed swap", before, describe(t, root))
		requireNoStaging(t, root)
		if fi, _ := os.Stat(root); !fi.ModTime().Equal(rootInfo.ModTime()) {
			t.Errorf("step %v: root mtime changed", fail)
		}
	}

	opts.Fault = nil
	if _, err := Restore(context.Background(), root, bytes.NewReader(data), opts); err != nil {
		t.Fatal(err)
	}
	requireNoStaging(t, root)
	got := describe(t, root)
	for _, p := range []string{"a/new", "a/mnt/mounted", "b", "c/d/e", "l", "keep/me"} {
		if _, ok := got[p]; !ok {
			t.Errorf("%s missing after the restore", p)
		}
	}
	for _, p := range []string{"a/old", "a/mnt/ignored", "b/was-a-dir", "z", "ro"} {
		if _, ok := got[p]; ok {
			t.Errorf("%s still there after the restore", p)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "a")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("kept directory a: mode %v, %v; want the archive's 0750", fi.Mode(), err)
	}
	if before["a/mnt/mounted"] != got["a/mnt/mounted"] || before["keep/me"] != got["keep/me"] {
		t.Error("preserved entries changed")
	}
}

func TestExtractionFailureLeavesNothing(t *testing.T) {
	root, _, opts := swapFixture(t)
	before := describe(t, root)
	// A valid start, then a member that is refused.
	data := craft(t, true, tm{name: "a/x", body: "1"}, tm{name: "new-dir/f", body: "2"}, tm{name: "/abs", body: "3"})
	_, err := Restore(context.Background(), root, bytes.NewReader(data), opts)
	requirePathError(t, err, errkind.ErrPathEscape, "/abs")
	requireSame(t, "workspace", before, describe(t, root))
	requireNoStaging(t, root)
}
