package manifest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The package stays pure: only the standard library (no networking
// packages) and the YAML module, no other Bulkhead package, and no
// package-level variables except error sentinels and the embedded schema.
func TestPackageIsPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			thirdParty := strings.Contains(strings.Split(p, "/")[0], ".")
			switch {
			case p == "go.yaml.in/yaml/v3", p == "embed":
			case thirdParty:
				t.Errorf("%s imports %s; only the YAML module is allowed", name, p)
			case p == "net" || p == "net/http" || p == "os/exec" || p == "syscall" || strings.HasPrefix(p, "net/rpc"):
				t.Errorf("%s imports %s; the package is pure", name, p)
			}
		}
		full, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range full.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if !strings.HasPrefix(id.Name, "Err") && id.Name != "schemaText" && id.Name != "_" {
						t.Errorf("%s: package-level variable %s", name, id.Name)
					}
				}
			}
		}
	}
}
