package houserules

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// listedPackage is what TestEveryPackageHasDoc needs of `go list`.
type listedPackage struct {
	ImportPath     string
	Dir            string
	Name           string
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string // files for other platforms or build tags
	TestGoFiles    []string
}

// TestEveryPackageHasDoc checks that every package of the module has a
// package doc comment (`// Package x ...`, `// Command-name ...` for a
// main) in one of its files. Generated files do not count and packages made
// only of generated files are skipped; testdata is never listed. A package
// of tests only (e2e) may carry its doc comment in a test file.
func TestEveryPackageHasDoc(t *testing.T) {
	out, err := exec.Command("go", "list", "-e", "-json=ImportPath,Dir,Name,GoFiles,CgoFiles,IgnoredGoFiles,TestGoFiles", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for dec.More() {
		var p listedPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		files := append(append(append([]string(nil), p.GoFiles...), p.CgoFiles...), p.IgnoredGoFiles...)
		has, handWritten := packageDoc(t, p.Dir, p.Name, files)
		if handWritten == 0 {
			// Tests only (or nothing but generated code and tests).
			has, handWritten = packageDoc(t, p.Dir, p.Name, p.TestGoFiles)
		}
		if handWritten == 0 {
			continue
		}
		checked++
		if !has {
			t.Errorf("%s has no package doc comment: add one (a doc.go, or above the package clause of its main file)", p.ImportPath)
		}
	}
	if checked < 10 {
		t.Fatalf("only %d packages checked: go list did not list the module", checked)
	}
}

// packageDoc parses the package clause (and comments) of files in dir that
// belong to package name and reports whether one of the hand-written ones
// has a doc comment, and how many hand-written ones there were.
func packageDoc(t *testing.T, dir, name string, files []string) (has bool, handWritten int) {
	t.Helper()
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, filepath.Join(dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Errorf("parse %s: %v", filepath.Join(dir, f), err)
			continue
		}
		if af.Name.Name != name || ast.IsGenerated(af) {
			continue
		}
		handWritten++
		if af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != "" {
			has = true
		}
	}
	return has, handWritten
}
