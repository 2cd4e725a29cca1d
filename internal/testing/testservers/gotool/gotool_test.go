package gotool

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall builds a small program from the module proxy into a private
// cache: nothing is cached before, the binary is after, a second Install
// reuses it, and a version that does not exist fails with the go
// command's words and leaves nothing behind.
func TestInstall(t *testing.T) {
	base := t.TempDir()
	t.Setenv("BULKHEAD_TESTSERVERS_DIR", base)
	p := Program{Name: "stringer", Package: "golang.org/x/tools/cmd/stringer", Version: "v0.40.0"}
	if _, ok := p.Cached(); ok {
		t.Fatal("cached before any build")
	}
	bin, err := p.Install(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := p.Cached(); !ok || got != bin || filepath.Dir(filepath.Dir(bin)) != base {
		t.Fatalf("Cached() = %q, %v after Install gave %q", got, ok, bin)
	}
	if again, err := p.Install(context.Background()); err != nil || again != bin {
		t.Fatalf("second Install: %q, %v", again, err)
	}

	bad := Program{Name: "stringer", Package: p.Package, Version: "v0.0.0-no-such-version"}
	if _, err := bad.Install(t.Context()); err == nil || !strings.Contains(err.Error(), "go install") {
		t.Fatalf("a missing version: %v", err)
	}
	if _, ok := bad.Cached(); ok {
		t.Fatal("a failed build left a binary")
	}
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".build-") {
			t.Errorf("a build directory was left: %s", e.Name())
		}
	}
}
