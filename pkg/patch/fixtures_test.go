package patch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// scenariosDir holds the apply_patch conformance scenarios (input/,
// patch.txt, expected/ per case), vendored from upstream: see its
// PROVENANCE.md. The filesystem capability's tests read the same copy.
const scenariosDir = "testdata/apply-patch-scenarios"

// scenarioRule is what a scenario expects beyond its expected/ tree.
type scenarioRule struct {
	// wantErr is the sentinel the failure must carry; nil for success.
	wantErr error
	// unchanged, with a reason, marks a scenario whose expected/ tree we
	// deliberately do not reproduce: the patch must fail and leave input/
	// exactly as it was.
	unchanged string
}

// scenarioRules lists every scenario that must fail, and every deliberate
// exception. Scenarios not listed must apply and produce expected/.
var scenarioRules = map[string]scenarioRule{
	"005_rejects_empty_patch":               {wantErr: errkind.ErrInvalidArgument},
	"006_rejects_missing_context":           {wantErr: errkind.ErrPatchRejected},
	"007_rejects_missing_file_delete":       {wantErr: errkind.ErrNotFound},
	"008_rejects_empty_update_hunk":         {wantErr: errkind.ErrInvalidArgument},
	"009_requires_existing_file_for_update": {wantErr: errkind.ErrNotFound},
	"012_delete_directory_fails":            {wantErr: errkind.ErrIsDirectory},
	"013_rejects_invalid_hunk_header":       {wantErr: errkind.ErrInvalidArgument},
	"015_failure_after_partial_success_leaves_changes": {
		wantErr: errkind.ErrNotFound,
		unchanged: "the reference applier keeps the Add File that ran before the failing Update File; " +
			"Bulkhead plans the whole patch first and applies all of it or none of it",
	},
}

func TestScenarios(t *testing.T) {
	entries, err := os.ReadDir(scenariosDir)
	if err != nil {
		t.Fatalf("the vendored scenarios: %v", err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		seen[name] = true
		t.Run(name, func(t *testing.T) { runScenario(t, filepath.Join(scenariosDir, name), scenarioRules[name]) })
	}
	// PROVENANCE.md: 23 upstream cases at 24a2d0c6 plus 023 and 024.
	if len(seen) != 25 {
		t.Errorf("%s holds %d scenarios, want the 25 vendored ones", scenariosDir, len(seen))
	}
	for name := range scenarioRules {
		if !seen[name] {
			t.Errorf("scenarioRules names %s, which is not in %s", name, scenariosDir)
		}
	}
}

func runScenario(t *testing.T, dir string, rule scenarioRule) {
	input, err := loadTree(filepath.Join(dir, "input"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := loadTree(filepath.Join(dir, "expected"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(dir, "patch.txt"))
	if err != nil {
		t.Fatal(err)
	}
	got := input.clone()
	changes, err := parseAndPlan(input, string(text))
	if err == nil {
		if cerr := got.commit(changes); cerr != nil {
			t.Fatalf("commit: %v", cerr)
		}
	}

	if rule.unchanged != "" {
		t.Logf("deliberate exception: %s", rule.unchanged)
		want = input
	}
	switch {
	case rule.wantErr == nil && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case rule.wantErr != nil && !errors.Is(err, rule.wantErr):
		t.Fatalf("error = %v, want one wrapping %v", err, rule.wantErr)
	case rule.wantErr != nil && changes != nil:
		t.Fatalf("failed plan returned %d changes", len(changes))
	}
	if d := got.diff(want); d != "" {
		t.Errorf("tree differs from expected:\n%s", d)
	}
}

// parseAndPlan parses text and plans it against src with default options.
func parseAndPlan(src Source, text string) ([]Change, error) {
	p, err := Parse(text, Options{})
	if err != nil {
		return nil, err
	}
	return Plan(src, p, Options{})
}
