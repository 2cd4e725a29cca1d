package archive

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fpTree builds a small tree, creating its entries in the given order.
func fpTree(t *testing.T, reverse bool) string {
	t.Helper()
	root := t.TempDir()
	steps := []func(){
		func() { writeFile(t, filepath.Join(root, "a/one"), "1\n", 0o644) },
		func() { writeFile(t, filepath.Join(root, "a/two"), "2\n", 0o600) },
		func() { writeFile(t, filepath.Join(root, "b/three"), "3\n", 0o755) },
		func() { writeFile(t, filepath.Join(root, "c"), "see\n", 0o644) },
		func() { _ = os.MkdirAll(filepath.Join(root, "empty"), 0o755) },
		func() { writeFile(t, filepath.Join(root, "skip/x"), "excluded\n", 0o644) },
		func() { _ = os.Symlink("a/one", filepath.Join(root, "link")) },
	}
	if reverse {
		for i := len(steps) - 1; i >= 0; i-- {
			steps[i]()
		}
	} else {
		for _, s := range steps {
			s()
		}
	}
	return root
}

func TestFingerprint(t *testing.T) {
	opts := FingerprintOptions{Exclude: []string{"skip"}, Extra: []byte(`{"manifest":1}`)}
	a, b := fpTree(t, false), fpTree(t, true)
	fa := fingerprint(t, a, opts)
	if !strings.HasPrefix(fa, FingerprintVersion+":") || len(fa) != len(FingerprintVersion)+1+64 {
		t.Fatalf("fingerprint %q", fa)
	}
	if fb := fingerprint(t, b, opts); fa != fb {
		t.Fatalf("same tree, created in another order: %s vs %s", fa, fb)
	}
	if again := fingerprint(t, a, opts); again != fa {
		t.Fatal("fingerprint not stable")
	}
	// Times do not count.
	_ = os.Chtimes(filepath.Join(a, "c"), time.Unix(1, 0), time.Unix(1, 0))
	if got := fingerprint(t, a, opts); got != fa {
		t.Error("an mtime change changed the fingerprint")
	}
	// Excluded paths do not count.
	writeFile(t, filepath.Join(a, "skip/x"), "changed\n", 0o600)
	writeFile(t, filepath.Join(a, "skip/new"), "new\n", 0o600)
	if got := fingerprint(t, a, opts); got != fa {
		t.Error("a change below an excluded path changed the fingerprint")
	}
	// Temporary files and Restore's directories do not count.
	writeFile(t, filepath.Join(a, "a/.bulkhead-tmp-9"), "tmp\n", 0o600)
	_ = os.Mkdir(filepath.Join(a, ReservedPrefix+"stage-1"), 0o700)
	if got := fingerprint(t, a, opts); got != fa {
		t.Error("a temporary file changed the fingerprint")
	}

	changes := map[string]func(root string){
		"one byte":      func(r string) { writeFile(t, filepath.Join(r, "a/one"), "2\n", 0o644) },
		"appended byte": func(r string) { writeFile(t, filepath.Join(r, "a/one"), "1\n\n", 0o644) },
		"file mode":     func(r string) { _ = os.Chmod(filepath.Join(r, "a/two"), 0o640) },
		"dir mode":      func(r string) { _ = os.Chmod(filepath.Join(r, "b"), 0o700) },
		"name":          func(r string) { _ = os.Rename(filepath.Join(r, "c"), filepath.Join(r, "d")) },
		"symlink target": func(r string) {
			_ = os.Remove(filepath.Join(r, "link"))
			_ = os.Symlink("a/two", filepath.Join(r, "link"))
		},
		"new empty dir": func(r string) { _ = os.Mkdir(filepath.Join(r, "empty2"), 0o755) },
		"removed file":  func(r string) { _ = os.Remove(filepath.Join(r, "c")) },
		"file to hard link": func(r string) {
			_ = os.Remove(filepath.Join(r, "c"))
			_ = os.Link(filepath.Join(r, "a/one"), filepath.Join(r, "c"))
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			r := fpTree(t, false)
			change(r)
			if got := fingerprint(t, r, opts); got == fa {
				t.Errorf("fingerprint unchanged")
			}
		})
	}
	if got := fingerprint(t, b, FingerprintOptions{Exclude: opts.Exclude, Extra: []byte("other")}); got == fa {
		t.Error("a different Extra gave the same fingerprint")
	}
	if got := fingerprint(t, b, FingerprintOptions{Extra: opts.Extra}); got == fa {
		t.Error("dropping the exclude gave the same fingerprint")
	}
}

func TestFingerprintCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Fingerprint(ctx, fpTree(t, false), FingerprintOptions{}); err == nil {
		t.Fatal("Fingerprint with a canceled context succeeded")
	}
}
