package houserules

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// architectureDoc is the project's record of its layout and rules; the
// tests of this package are the rules it lists.
const architectureDoc = "../../docs/ARCHITECTURE.md"

// selfTests are tests of this package that check its own helpers, not a
// rule of the house.
var selfTests = []string{"TestDiffLists", "TestDirectSkipsFindsThem"}

// TestArchitectureNamesEveryRule: docs/ARCHITECTURE.md names every rule
// test of this package, and every test it names exists, so the written
// rules and the checked ones cannot drift apart.
func TestArchitectureNamesEveryRule(t *testing.T) {
	doc, err := os.ReadFile(architectureDoc)
	if err != nil {
		t.Fatalf("the rules of the house are written in docs/ARCHITECTURE.md: %v", err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9]*`).FindAllString(string(doc), -1) {
		named[m] = true
	}
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				defined[fn.Name.Name] = true
			}
		}
	}
	if len(defined) == 0 {
		t.Fatal("no tests found in this package")
	}
	for name := range named {
		if !defined[name] {
			t.Errorf("docs/ARCHITECTURE.md names %s, which internal/houserules does not define", name)
		}
	}
	for name := range defined {
		if !named[name] && !slices.Contains(selfTests, name) {
			t.Errorf("internal/houserules defines %s, which docs/ARCHITECTURE.md does not name: write its rule there", name)
		}
	}
}
