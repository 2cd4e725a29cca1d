package agentdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRootFS: the root file system images/build.sh writes holds the small
// image's tree (a static busybox behind bin/sh, git, the accounts, the
// mount points), not the daemon, other users may reach and not write it,
// and a second call builds nothing new.
func TestRootFS(t *testing.T) {
	dir := RootFS(t)
	for _, p := range []string{"bin/sh", "bin/busybox", "usr/bin/git", "etc/passwd", "etc/group", "tmp", "proc", "dev", "workspace"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	// wget is GNU wget, not busybox's applet (its shell would run the
	// applet, which dies of SIGSEGV on -T, in preference to any wget file).
	if out, err := exec.Command(filepath.Join(dir, "bin/busybox"), "--list").Output(); err != nil || slices.Contains(strings.Fields(string(out)), "wget") {
		t.Errorf("busybox --list in the root file system: wget is an applet (%v)", err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "usr/bin/wget")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("usr/bin/wget: %v, %v; want GNU wget's executable", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "usr/local/bin/sandbox-agentd")); err == nil {
		t.Error("the root file system holds a daemon: the local provider binds its own")
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			t.Errorf("%s is not searchable by other users (%v)", d, fi.Mode().Perm())
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm()&0o022 != 0 {
		t.Errorf("%s: %v, %v; want it writable by its owner only", dir, fi.Mode(), err)
	}
	if again := RootFS(t); again != dir {
		t.Errorf("a second call gave %s, the first %s", again, dir)
	}
}
