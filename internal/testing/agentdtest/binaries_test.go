package agentdtest

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Run(m)) }

// TestMakefileBuildFlags keeps Binaries' build in step with `make build`:
// the tags, the static build, -trimpath and the stripped symbols.
func TestMakefileBuildFlags(t *testing.T) {
	data, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mk := string(data)
	tags := regexp.MustCompile(`(?m)^BUILD_TAGS\s*\?=\s*(\S+)\s*$`).FindStringSubmatch(mk)
	if tags == nil || tags[1] != buildTags {
		t.Errorf("the Makefile's BUILD_TAGS = %v, agentdtest builds with %q", tags, buildTags)
	}
	ldflags := regexp.MustCompile(`(?m)^LDFLAGS\s*:=\s*(.*)$`).FindStringSubmatch(mk)
	if ldflags == nil || !strings.HasPrefix(ldflags[1], "-s -w ") {
		t.Errorf("the Makefile's LDFLAGS = %v, agentdtest builds with -s -w", ldflags)
	}
	// The recipe's go build command (the recipe may be several lines).
	recipe := regexp.MustCompile(`(?m)^build:.*\n((?:\t.*\n)+)`).FindStringSubmatch(mk)
	if recipe == nil {
		t.Fatal("no build recipe in the Makefile")
	}
	build := regexp.MustCompile(`CGO_ENABLED=0 \$\(GO\) build [^\n]*`).FindAllString(recipe[1], -1)
	if len(build) == 0 {
		t.Fatalf("make build's recipe runs no \"CGO_ENABLED=0 $(GO) build\":\n%s", recipe[1])
	}
	cmd := build[len(build)-1] // the one that runs (an echo of it may come first)
	for _, want := range []string{"-trimpath", "-tags '$(BUILD_TAGS)'", "-ldflags '$(LDFLAGS)'"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("make build runs %q, without %q: update agentdtest's build to match", cmd, want)
		}
	}
}

// The built daemon carries the build settings and the stamped version, and
// a second call builds nothing new.
func TestBinaries(t *testing.T) {
	b := Binaries(t)
	out, err := exec.Command("go", "version", "-m", b.Agentd).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	for _, want := range []string{"-tags=" + buildTags, "CGO_ENABLED=0", "-trimpath=true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("sandbox-agentd was not built with %s:\n%s", want, out)
		}
	}
	// -ldflags is not recorded with -trimpath: -s shows as no symbol table.
	ef, err := elf.Open(b.Agentd)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	if _, err := ef.Symbols(); !errors.Is(err, elf.ErrNoSymbols) {
		t.Errorf("sandbox-agentd has a symbol table (%v): not built with -ldflags -s", err)
	}
	out, err = exec.Command(b.Agentd, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), Version) || !strings.Contains(string(out), Commit) {
		t.Errorf("sandbox-agentd --version = %q, %v; want %s and %s", out, err, Version, Commit)
	}
	st, err := os.Stat(b.Agentd)
	if err != nil {
		t.Fatal(err)
	}
	again := Binaries(t)
	st2, err := os.Stat(again.Agentd)
	if err != nil {
		t.Fatal(err)
	}
	if again != b || !os.SameFile(st, st2) || !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("the second Binaries call built again: %+v then %+v", b, again)
	}
}
