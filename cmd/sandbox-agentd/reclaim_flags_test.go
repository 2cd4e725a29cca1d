package main

import (
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/server"
)

// TestReclaimGrowthFlag checks that --reclaim-growth-bytes reaches the
// config, defaults to server.DefaultReclaimGrowth, and that a negative
// value is refused by validation.
func TestReclaimGrowthFlag(t *testing.T) {
	base := []string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth", "--workspace", t.TempDir()}
	cfg, _, err := parseFlags(base)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ReclaimGrowth != server.DefaultReclaimGrowth {
		t.Fatalf("default ReclaimGrowth %d; want %d", cfg.ReclaimGrowth, server.DefaultReclaimGrowth)
	}
	for v, want := range map[string]int64{"0": 0, "1048576": 1 << 20} {
		cfg, _, err := parseFlags(append(base, "--reclaim-growth-bytes", v))
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("--reclaim-growth-bytes %s: %v", v, err)
		}
		if cfg.ReclaimGrowth != want {
			t.Fatalf("--reclaim-growth-bytes %s: ReclaimGrowth %d; want %d", v, cfg.ReclaimGrowth, want)
		}
	}
	cfg, _, err = parseFlags(append(base, "--reclaim-growth-bytes", "-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--reclaim-growth-bytes") {
		t.Fatalf("--reclaim-growth-bytes -1: Validate() = %v; want an error naming the flag", err)
	}
	if _, _, err := parseFlags(append(base, "--reclaim-growth-bytes", "lots")); err == nil {
		t.Fatal("--reclaim-growth-bytes lots: parsed")
	}
}
