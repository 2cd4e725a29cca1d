package runsc

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// TestShimBuilds builds containerd-shim-runsc-v1 from the pinned gVisor
// version (once per machine) and checks that what was cached is the shim:
// a static binary that answers containerd's `-v` with its runtime's
// version line.
func TestShimBuilds(t *testing.T) {
	testenv.Require(t, testenv.Linux, testenv.Tool("go"))
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	start := time.Now()
	bin, err := ShimBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shim %s (%s)", bin, time.Since(start).Round(time.Millisecond))
	if got, ok := ShimCached(); !ok || got != bin {
		t.Fatalf("ShimCached() = %q, %v; want %q, true", got, ok, bin)
	}
	if !strings.HasSuffix(bin, "/"+ShimName) {
		t.Fatalf("shim cached as %s, want a file named %s (containerd finds it by that name)", bin, ShimName)
	}
	out, err := exec.CommandContext(ctx, bin, "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -v: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "ersion") {
		t.Fatalf("%s -v printed no version: %q", bin, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// TestRequire builds runsc (once per machine) and runs a command under it.
func TestRequire(t *testing.T) {
	bin := Require(t)
	if got, ok := Cached(); !ok || got != bin {
		t.Fatalf("Cached() = %q, %v; want %q, true", got, ok, bin)
	}
}
