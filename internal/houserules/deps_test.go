package houserules

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the committed dependency lists (testdata/deps-*.txt) from go list")

// updateCommand is how a reviewed change of the dependency lists is made.
const updateCommand = "go test ./internal/houserules -run TestDependencyLists -update"

// depList is one committed dependency list: every package a binary (or a
// library embedded in users' programs) links, as `make build` builds it.
// A new dependency shows in review as a diff of the list (tailscale's
// depaware idea).
type depList struct {
	file    string // under testdata/
	pattern string // the package, relative to the module root
	// std lists the standard library's packages too (not its internal/
	// and vendor/ ones, which change with every Go release): for the
	// daemon, whose every package is a size and an attack-surface cost.
	std bool
}

// depLists are the lists kept: the two binaries and the library backends
// embed.
func depLists() []depList {
	return []depList{
		{file: "deps-harness.txt", pattern: "./cmd/harness"},
		{file: "deps-sandbox-agentd.txt", pattern: "./cmd/sandbox-agentd", std: true},
		{file: "deps-pkg-harness.txt", pattern: "./pkg/harness"},
	}
}

// depPlatform is the platform the lists are computed for: the dependency
// graph differs between systems (golang.org/x/sys/unix, build-tagged
// files), and these binaries are Linux ones. CGO_ENABLED=0 as make build.
var depPlatform = []string{"GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0"}

// buildTags returns the tags `make build` passes (the Makefile's
// BUILD_TAGS default), so that the lists follow the Makefile.
func buildTags(t *testing.T, root string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), "?=")
		if ok && strings.TrimSpace(name) == "BUILD_TAGS" {
			return strings.TrimSpace(value)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatal("the Makefile sets no BUILD_TAGS default: the dependency lists would not be make build's")
	return ""
}

// goListDeps returns the sorted packages pattern links (itself included),
// as `make build` builds it: without the standard library, or with its
// public packages when std is set.
func goListDeps(t *testing.T, root, tags, pattern string, std bool) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}} {{.Standard}}", pattern)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), depPlatform...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps %s: %v\n%s", pattern, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	var pkgs []string
	for line := range strings.Lines(string(out)) {
		path, standard, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if standard == "true" && (!std || path == "internal" || strings.HasPrefix(path, "internal/") ||
			strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal") || strings.HasPrefix(path, "vendor/")) {
			continue
		}
		pkgs = append(pkgs, path)
	}
	slices.Sort(pkgs)
	return pkgs
}

// listHeader is the comment a list file starts with.
func listHeader(l depList, tags string) string {
	what := "outside the standard library"
	if l.std {
		what = "(the standard library's public ones included)"
	}
	return fmt.Sprintf("# Every package %s links %s: go list -deps -tags %s, with %s.\n"+
		"# A change here is a new or dropped dependency: review it. Regenerate with\n#\t%s\n",
		strings.TrimPrefix(l.pattern, "./"), what, tags, strings.Join(depPlatform, " "), updateCommand)
}

// readList returns the packages of a committed list (comments and blank
// lines skipped).
func readList(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			pkgs = append(pkgs, line)
		}
	}
	return pkgs, nil
}

// diffLists returns the packages of got missing from want (added) and
// those of want missing from got (removed); both are sorted.
func diffLists(want, got []string) (added, removed []string) {
	for _, p := range got {
		if _, found := slices.BinarySearch(want, p); !found {
			added = append(added, p)
		}
	}
	for _, p := range want {
		if _, found := slices.BinarySearch(got, p); !found {
			removed = append(removed, p)
		}
	}
	return added, removed
}

// TestDependencyLists: the packages cmd/harness, cmd/sandbox-agentd and
// pkg/harness link are the committed lists in testdata/ (DESIGN: every
// binary has a committed dependency list; a new dependency is a reviewed
// diff). With -update it rewrites them.
func TestDependencyLists(t *testing.T) {
	root := moduleRoot(t)
	tags := buildTags(t, root)
	for _, l := range depLists() {
		t.Run(l.file, func(t *testing.T) {
			got := goListDeps(t, root, tags, l.pattern, l.std)
			if !slices.Contains(got, module+strings.TrimPrefix(l.pattern, ".")) || len(got) < 10 {
				t.Fatalf("go list -deps %s listed %d packages, not the package itself: not real dependency data", l.pattern, len(got))
			}
			path := filepath.Join(root, "internal", "houserules", "testdata", l.file)
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(listHeader(l, tags)+strings.Join(got, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := readList(path)
			if err != nil {
				t.Fatalf("%v: create it with\n\t%s", err, updateCommand)
			}
			if !slices.IsSorted(want) {
				t.Errorf("testdata/%s is not sorted: regenerate it with\n\t%s", l.file, updateCommand)
				slices.Sort(want)
			}
			added, removed := diffLists(want, got)
			if len(added) == 0 && len(removed) == 0 {
				return
			}
			var b strings.Builder
			for _, p := range added {
				b.WriteString("\n+ " + p)
			}
			for _, p := range removed {
				b.WriteString("\n- " + p)
			}
			t.Errorf("%s links other packages than testdata/%s says (+ new, - gone):%s\n"+
				"If the change is meant, review it and update the list (commit it with the change):\n\t%s",
				l.pattern, l.file, b.String(), updateCommand)
		})
	}
}

// The diff the test prints: what is new and what is gone.
func TestDiffLists(t *testing.T) {
	added, removed := diffLists([]string{"a", "b", "d"}, []string{"b", "c", "d", "e"})
	if strings.Join(added, ",") != "c,e" || strings.Join(removed, ",") != "a" {
		t.Fatalf("added %v, removed %v", added, removed)
	}
}
