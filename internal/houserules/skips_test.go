package houserules

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// testenvPath is the one package allowed to skip a test itself.
const testenvPath = module + "/internal/testing/testenv"

// skipMethods are testing.TB's ways to skip a test.
var skipMethods = map[string]bool{"Skip": true, "Skipf": true, "SkipNow": true}

// directSkips returns the places in one Go source file that use a Skip,
// Skipf or SkipNow method other than the testenv package's functions: a
// test that skips itself, where a green CI run would hide it. It reads the
// syntax only, so any method of that name counts (no type in this module
// has one, and none should).
func directSkips(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	testenvName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == testenvPath {
			testenvName = "testenv"
			if imp.Name != nil {
				testenvName = imp.Name.Name
			}
		}
	}
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || !skipMethods[sel.Sel.Name] {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && testenvName != "" && id.Name == testenvName {
			return true
		}
		found = append(found, fmt.Sprintf("%s: %s", fset.Position(sel.Pos()), render(sel)))
		return true
	})
	return found, nil
}

// render renders a selector as it is written (x.Method, s.t.Method).
func render(sel *ast.SelectorExpr) string {
	var b strings.Builder
	var walk func(e ast.Expr)
	walk = func(e ast.Expr) {
		switch v := e.(type) {
		case *ast.Ident:
			b.WriteString(v.Name)
		case *ast.SelectorExpr:
			walk(v.X)
			b.WriteString("." + v.Sel.Name)
		default:
			b.WriteString("(...)")
		}
	}
	walk(sel)
	return b.String()
}

// moduleRoot is the directory of go.mod, two levels above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root: %v", err)
	}
	return root
}

// TestEverySkipGoesThroughTestenv: no test outside internal/testing/testenv calls
// a testing Skip method (Skip, Skipf, SkipNow) itself. A missing part of the
// machine goes through testenv.Require or testenv.Skip (a failure under
// CI=true), an opt-in test through testenv.Optional or testenv.Short.
func TestEverySkipGoesThroughTestenv(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	var found []string
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case rel == ".":
				return nil
			case rel == filepath.Join("internal", "testing", "testenv"), d.Name() == "testdata", d.Name() == "vendor",
				strings.HasPrefix(d.Name(), "."), d.Name() == "node_modules":
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module (tools/)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		places, err := directSkips(fset, path, nil)
		if err != nil {
			return err
		}
		for _, p := range places {
			found = append(found, strings.TrimPrefix(p, root+string(filepath.Separator)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read only %d Go files below %s: not the whole module", files, root)
	}
	for _, f := range found {
		t.Errorf("%s: skips the test directly; use testenv.Require/Skip (a missing part of the machine) or testenv.Optional/Short (opt-in)", f)
	}
}

// The checker itself: it finds each direct skip, whatever the receiver,
// and lets testenv's functions through, under an alias too.
func TestDirectSkipsFindsThem(t *testing.T) {
	src := `package x

import (
	"testing"

	te "github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

func TestA(t *testing.T) {
	te.Require(t, te.Root)
	te.Skip(t, "a missing part")
	if false {
		t.SKIP("direct")
	}
	t.Run("sub", func(t *testing.T) { t.SKIPf("%d", 1) })
}

func BenchmarkB(b *testing.B) { b.SKIP("direct") }

type h struct{ t *testing.T }

func (x h) f() { x.t.SKIPNow() }

var skip = (*testing.T).SKIP
`
	// The fixture spells the methods SKIP so that no search for direct
	// skips in the tree finds this file; the checker sees them as written.
	src = strings.ReplaceAll(src, "SKIP", "Skip")
	got, err := directSkips(token.NewFileSet(), "x_test.go", src)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.ReplaceAll("x_test.go:13:3: t.SKIP|x_test.go:15:36: t.SKIPf|x_test.go:18:33: b.SKIP|"+
		"x_test.go:22:18: x.t.SKIPNow|x_test.go:24:12: (...).SKIP", "SKIP", "Skip"), "|")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("directSkips found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
