package filesystem_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
)

// scenariosDir holds the apply_patch conformance scenarios (input/,
// patch.txt, expected/ per case): the one copy in the repository, vendored
// beside the patch engine (see its PROVENANCE.md).
const scenariosDir = "../../../patch/testdata/apply-patch-scenarios"

// scenarioFailures lists the scenarios whose patch must be rejected, each
// with a piece of the message the model gets. A rejected patch leaves
// input/ exactly as it was, which is expected/ for all of them except 015.
var scenarioFailures = map[string]string{
	"005_rejects_empty_patch":               "the patch contains no file operations",
	"006_rejects_missing_context":           "hunk 1 does not match",
	"007_rejects_missing_file_delete":       "the file to delete does not exist",
	"008_rejects_empty_update_hunk":         "invalid patch: line 2",
	"009_requires_existing_file_for_update": "the file to update does not exist",
	"012_delete_directory_fails":            "this is a directory",
	"013_rejects_invalid_hunk_header":       "is not a file operation header",
	// The reference applier keeps the Add File that ran before the failing
	// Update File; the daemon applies all of a patch or none of it.
	"015_failure_after_partial_success_leaves_changes": "the file to update does not exist",
}

// Every shared scenario, end to end through the tool: each runs in its own
// directory of one workspace, as the working directory of the call.
func TestScenarios(t *testing.T) {
	entries, err := os.ReadDir(scenariosDir)
	if err != nil {
		t.Fatalf("the vendored scenarios: %v", err)
	}
	s := newSandbox(t, filesystem.Options{})
	seen := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(scenariosDir, name)
			work := filepath.Join(s.d.Workspace, "scenarios", name)
			if err := os.MkdirAll(work, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.CopyFS(work, os.DirFS(filepath.Join(src, "input"))); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			before := loadTree(t, work)
			text, err := os.ReadFile(filepath.Join(src, "patch.txt"))
			if err != nil {
				t.Fatal(err)
			}
			res := s.call("apply_patch", "scenarios/"+name, string(text))

			want := loadTree(t, filepath.Join(src, "expected"))
			if piece, fails := scenarioFailures[name]; fails {
				if !res.IsError || !strings.Contains(res.Output, piece) || !strings.HasSuffix(res.Output, "No file was changed: the patch applies completely or not at all. Correct it and send it again.") {
					t.Fatalf("want a rejection mentioning %q, got %+v", piece, res)
				}
				want = before
			} else if res.IsError {
				t.Fatalf("rejected: %s", res.Output)
			}
			if got := loadTree(t, work); !equalTrees(got, want) {
				t.Errorf("tree:\n%s\nwant:\n%s", showTree(got), showTree(want))
			}
		})
	}
	for name := range scenarioFailures {
		if !seen[name] {
			t.Errorf("scenarioFailures names %s, which is not in %s", name, scenariosDir)
		}
	}
}

// loadTree maps every path below root to its content ("/" for a directory).
func loadTree(t *testing.T, root string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			tree[filepath.ToSlash(rel)] = "/"
			return nil
		}
		b, err := os.ReadFile(p)
		tree[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return tree
}

func equalTrees(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func showTree(tree map[string]string) string {
	keys := make([]string, 0, len(tree))
	for k := range tree {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + " = " + strings.ReplaceAll(tree[k], "\n", `\n`) + "\n")
	}
	return b.String()
}
