package workspace

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// commitFixture is a workspace with files a commit changes.
func commitFixture(t *testing.T) *env {
	e := newEnv(t)
	e.put(t, "src/main.go", "package main\n", 0o640)
	e.put(t, "src/old.go", "package old\n", 0o644)
	e.put(t, "src/moved.go", "package moved\n", 0o600)
	e.put(t, "src/renamed.go", "package renamed\n", 0o644)
	e.put(t, "docs/readme.md", "# readme\n", 0o644)
	return e
}

// fullCommit touches every kind of change, including a new directory.
func fullCommit(e *env) []FileChange {
	return []FileChange{
		{Kind: ChangeWrite, Path: "src/main.go", Content: []byte("package main // v2\n")},
		{Kind: ChangeWrite, Path: "pkg/new/new.go", Content: []byte("package new\n")},
		{Kind: ChangeDelete, Path: "src/old.go"},
		{Kind: ChangeMove, Path: "src/moved.go", NewPath: "lib/moved.go", Content: []byte("package moved // v2\n")},
		{Kind: ChangeMove, Path: "src/renamed.go", NewPath: "docs/renamed.go"},
		{Kind: ChangeWrite, Path: "docs/readme.md", Content: []byte("# readme v2\n"), Mode: 0o600},
	}
}

func TestCommitApplies(t *testing.T) {
	e := commitFixture(t)
	must(t, e.w.Commit(context.Background(), nil, fullCommit(e)))
	want := map[string]struct {
		content string
		mode    os.FileMode
	}{
		"src/main.go":     {"package main // v2\n", 0o640},
		"pkg/new/new.go":  {"package new\n", 0o644},
		"lib/moved.go":    {"package moved // v2\n", 0o600},
		"docs/renamed.go": {"package renamed\n", 0o644},
		"docs/readme.md":  {"# readme v2\n", 0o600},
	}
	for p, w := range want {
		b, err := os.ReadFile(e.path(p))
		must(t, err)
		bytesEqual(t, b, []byte(w.content))
		if fi, _ := os.Stat(e.path(p)); fi.Mode() != w.mode {
			t.Errorf("%s mode %v, want %v", p, fi.Mode(), w.mode)
		}
	}
	for _, p := range []string{"src/old.go", "src/moved.go", "src/renamed.go"} {
		if _, err := os.Lstat(e.path(p)); !os.IsNotExist(err) {
			t.Errorf("%s still exists", p)
		}
	}
	if left := tempFiles(t, e.root); len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// TestCommitRollbackAtEveryStep fails the commit before each step in turn
// and checks nothing changed.
func TestCommitRollbackAtEveryStep(t *testing.T) {
	injected := errors.New("injected failure")
	for step := range len(fullCommit(nil)) {
		t.Run("", func(t *testing.T) {
			e := commitFixture(t)
			before := fileSnapshot(t, e.root)
			e.w.hooks = &testHooks{beforeCommitStep: func(i int) error {
				if i == step {
					return injected
				}
				return nil
			}}
			err := e.w.Commit(context.Background(), nil, fullCommit(e))
			if !errors.Is(err, injected) {
				t.Fatalf("error %v", err)
			}
			var pe *errkind.PathError
			if !errors.As(err, &pe) || pe.Op != "commit" {
				t.Fatalf("error %#v", err)
			}
			if d := diffSnapshots(before, fileSnapshot(t, e.root)); d != "" {
				t.Fatalf("step %d: workspace changed:\n%s", step, d)
			}
		})
	}
}

// TestCommitRollbackReadOnlyDirMidway makes a target directory read-only
// for the run_as user between two steps: the later rename fails for real,
// and the earlier steps are undone.
func TestCommitRollbackReadOnlyDirMidway(t *testing.T) {
	requireRoot(t)
	e := commitFixture(t)
	nobody := e.user(t, "nobody")
	for _, d := range []string{".", "src", "docs"} {
		must(t, os.Chown(e.path(d), 65534, 65534))
	}
	for _, f := range []string{"src/main.go", "src/old.go", "docs/readme.md"} {
		must(t, os.Chown(e.path(f), 65534, 65534))
	}
	before := fileSnapshot(t, e.root)
	e.w.hooks = &testHooks{beforeCommitStep: func(i int) error {
		if i == 2 {
			must(t, os.Chmod(e.path("docs"), 0o555))
		}
		return nil
	}}
	t.Cleanup(func() { _ = os.Chmod(e.path("docs"), 0o755) })
	err := e.w.Commit(context.Background(), nobody, []FileChange{
		{Kind: ChangeWrite, Path: "src/main.go", Content: []byte("changed")},
		{Kind: ChangeDelete, Path: "src/old.go"},
		{Kind: ChangeWrite, Path: "docs/readme.md", Content: []byte("changed")},
	})
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	if !errors.Is(err, syscall.EACCES) {
		t.Fatalf("not the real EACCES: %v", err)
	}
	if d := diffSnapshots(before, fileSnapshot(t, e.root)); d != "" {
		t.Fatalf("workspace changed:\n%s", d)
	}
}

// TestCommitValidation checks bad commits are refused before anything is
// staged.
func TestCommitValidation(t *testing.T) {
	for _, c := range []struct {
		name    string
		changes []FileChange
		want    error
		path    string
	}{
		{"duplicate path", []FileChange{
			{Kind: ChangeWrite, Path: "src/main.go", Content: []byte("a")},
			{Kind: ChangeWrite, Path: "src/../src/main.go", Content: []byte("b")},
		}, errkind.ErrInvalidArgument, "src/../src/main.go"},
		{"delete missing", []FileChange{{Kind: ChangeDelete, Path: "nope"}}, errkind.ErrNotFound, "nope"},
		{"delete directory", []FileChange{{Kind: ChangeDelete, Path: "src"}}, errkind.ErrIsDirectory, "src"},
		{"write directory", []FileChange{{Kind: ChangeWrite, Path: "docs", Content: []byte("x")}}, errkind.ErrIsDirectory, "docs"},
		{"move onto directory", []FileChange{{Kind: ChangeMove, Path: "src/main.go", NewPath: "docs"}}, errkind.ErrIsDirectory, "docs"},
		{"move to /", []FileChange{{Kind: ChangeMove, Path: "src/main.go", NewPath: "/"}}, errkind.ErrPathEscape, "/"},
		{"unknown kind", []FileChange{{Path: "x"}}, errkind.ErrInvalidArgument, "x"},
		{"escape late in the list", []FileChange{
			{Kind: ChangeWrite, Path: "new/a.go", Content: []byte("a")},
			{Kind: ChangeWrite, Path: "../b.go", Content: []byte("b")},
		}, errkind.ErrPathEscape, "../b.go"},
		{"write under a file", []FileChange{{Kind: ChangeWrite, Path: "src/main.go/x", Content: []byte("x")}}, errkind.ErrNotDirectory, "src/main.go/x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := commitFixture(t)
			before := snapshot(t, e.root)
			err := e.w.Commit(context.Background(), nil, c.changes)
			checkErr(t, e, err, c.want)
			var pe *errkind.PathError
			errors.As(err, &pe)
			if pe.Path != c.path {
				t.Errorf("error path %q, want %q", pe.Path, c.path)
			}
			if d := diffSnapshots(before, snapshot(t, e.root)); d != "" {
				t.Fatalf("workspace changed:\n%s", d)
			}
		})
	}
}

// TestCommitMoveIntoGrantWithContent moves a file out of the workspace
// into a writable grant, which works when the content is given.
func TestCommitMoveIntoGrantWithContent(t *testing.T) {
	e := commitFixture(t)
	err := e.w.Commit(context.Background(), nil, []FileChange{
		{Kind: ChangeMove, Path: "src/main.go", NewPath: e.grantRW + "/main.go"},
	})
	checkErr(t, e, err, errkind.ErrInvalidArgument)
	must(t, e.w.Commit(context.Background(), nil, []FileChange{
		{Kind: ChangeMove, Path: "src/main.go", NewPath: e.grantRW + "/main.go", Content: []byte("moved")},
	}))
	b, _ := os.ReadFile(e.grantRW + "/main.go")
	bytesEqual(t, b, []byte("moved"))
	if _, err := os.Stat(e.path("src/main.go")); !os.IsNotExist(err) {
		t.Fatal("source kept")
	}
}
