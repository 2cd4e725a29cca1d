package loopdev

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeSysBlock points sysBlock at a directory with loop devices backed as
// given ("" for none) and a disk that is no loop device.
func fakeSysBlock(t *testing.T, backing map[string]string) {
	t.Helper()
	root := t.TempDir()
	real := sysBlock
	sysBlock = root
	t.Cleanup(func() { sysBlock = real })
	for name, file := range backing {
		dir := filepath.Join(root, name, "loop")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(dir, "backing_file"), []byte(file+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "sda"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestBacking(t *testing.T) {
	fakeSysBlock(t, map[string]string{"loop0": "/s/a.img", "loop1": "/s/b.img (deleted)", "loop2": ""})
	for dev, want := range map[string]string{
		"/dev/loop0":      "/s/a.img",
		"/dev/loop1":      "/s/b.img", // removed while attached
		"/dev/loop2":      "",         // attached to nothing
		"/dev/loop9":      "",         // no such device
		"/dev/sda":        "",
		"loop0":           "",
		"/dev/loop0/../x": "",
	} {
		if got := Backing(dev); got != want {
			t.Errorf("Backing(%q) = %q, want %q", dev, got, want)
		}
	}
}

func TestBackedBy(t *testing.T) {
	fakeSysBlock(t, map[string]string{"loop10": "/s/a.img", "loop2": "/s/a.img (deleted)", "loop3": "/s/b.img", "loop4": ""})
	if got, want := BackedBy("/s/a.img"), []string{"/dev/loop10", "/dev/loop2"}; !slices.Equal(got, want) {
		t.Errorf("BackedBy(a) = %q, want %q", got, want)
	}
	if got := BackedBy("/s/c.img"); len(got) != 0 {
		t.Errorf("BackedBy(c) = %q, want none", got)
	}
}

func TestFindMkfsFallbacks(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	notExec, prog := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := FindMkfs([]string{filepath.Join(dir, "none"), dir, notExec, prog}); err != nil || got != prog {
		t.Errorf("FindMkfs = %q, %v; want %q", got, err, prog)
	}
	if _, err := FindMkfs([]string{notExec}); err == nil || !strings.Contains(err.Error(), "install e2fsprogs") {
		t.Errorf("FindMkfs without one: %v", err)
	}
}
