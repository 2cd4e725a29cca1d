package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// fuzzSeeds are the archives FuzzRestore starts from, each raw and
// zstd-compressed.
func fuzzSeeds(t testing.TB) map[string][]byte {
	sets := map[string][]tm{
		"tree": {
			{name: "d/", typ: tar.TypeDir}, {name: "d/f", body: "hello\n", mode: 0o600},
			{name: "d/l", typ: tar.TypeSymlink, link: "f"}, {name: "h", typ: tar.TypeLink, link: "d/f"},
			{name: "e/", typ: tar.TypeDir, mode: 0o555},
		},
		"symlink-then-file": {{name: "l", typ: tar.TypeSymlink, link: "/tmp"}, {name: "l/x", body: "x"}},
		"symlink-up":        {{name: "l", typ: tar.TypeSymlink, link: "../.."}, {name: "l/x", body: "x"}},
		"hardlink-out":      {{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}},
		"dotdot":            {{name: "a/../../x", body: "x"}},
		"device":            {{name: "null", typ: tar.TypeChar}},
		"dup":               {{name: "f", body: "1"}, {name: "f", body: "2"}},
	}
	out := map[string][]byte{}
	for name, ms := range sets {
		out[name+"-tar"] = craft(t, false, ms...)
		out[name+"-zst"] = craft(t, true, ms...)
	}
	z := out["tree-zst"]
	out["truncated-zst"] = z[:len(z)/2]
	out["empty"] = nil
	return out
}

// TestWriteFuzzSeeds refreshes testdata/fuzz/FuzzRestore when
// BULKHEAD_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("BULKHEAD_WRITE_FUZZ_SEEDS") != "1" {
		testenv.Optional(t, "set BULKHEAD_WRITE_FUZZ_SEEDS=1 to rewrite the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzRestore")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range fuzzSeeds(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func FuzzRestore(f *testing.F) {
	for _, data := range fuzzSeeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		root, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
		writeFile(t, filepath.Join(root, "existing"), "workspace\n", 0o644)
		writeFile(t, filepath.Join(outside, "sentinel"), "outside\n", 0o644)
		before, outBefore := describe(t, root), describe(t, outside)

		opts := RestoreOptions{Limits: Limits{MaxBytes: 1 << 20, MaxMembers: 200, MaxInputBytes: 1 << 20, RatioMinBytes: 1 << 20}}
		_, err := Restore(context.Background(), root, bytes.NewReader(data), opts)

		requireSame(t, "outside", outBefore, describe(t, outside))
		if ents, _ := os.ReadDir(base); len(ents) != 2 {
			t.Fatalf("the workspace's parent holds %d entries", len(ents))
		}
		requireNoStaging(t, root)
		if err != nil {
			requireSame(t, "workspace after a failed restore", before, describe(t, root))
			return
		}
		// Every link of a restored tree resolves inside it (or nowhere).
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type()&os.ModeSymlink != 0 {
				if target, err := os.Readlink(p); err == nil && filepath.IsAbs(target) {
					t.Errorf("%s: absolute link target %q", p, target)
				}
				if real, err := filepath.EvalSymlinks(p); err == nil && !strings.HasPrefix(real, root) {
					t.Errorf("%s resolves outside the workspace: %s", p, real)
				}
			}
			return nil
		})
	})
}
