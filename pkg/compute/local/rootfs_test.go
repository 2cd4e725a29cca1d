package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// TestRootFSChecked: New refuses a sandbox root file system that is not
// there, has no bin/sh, or that other users may write, with an error
// saying how to make one, and one for plain sandboxes.
func TestRootFSChecked(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	state := testenv.SearchableTempDir(t)
	good := agentdtest.RootFS(t)
	noSh := testenv.SearchableTempDir(t)
	open := testenv.SearchableTempDir(t)
	if err := os.MkdirAll(filepath.Join(open, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("busybox", filepath.Join(open, "bin", "sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"missing": filepath.Join(noSh, "nothing"), "no bin/sh": noSh, "world-writable": open} {
		_, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationBubblewrap, RootFS: dir}, zap.NewNop())
		if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "make rootfs") || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: %v, want a failed precondition naming %s and `make rootfs`", name, err, dir)
		}
	}
	if _, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationNone, RootFS: good}, zap.NewNop()); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Errorf("a root file system for plain sandboxes: %v, want ErrInvalidArgument", err)
	}
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationBubblewrap, RootFS: good}, zap.NewNop())
	if err != nil || p.rootFS != good {
		t.Fatalf("New with %s: %v (root %q)", good, err, p.rootFS)
	}
}

// TestRootFSLayout: the root file system laid out around the paths the
// sandbox needs at their host paths: entries bound (links recreated),
// directories on the way made with the tree's modes and their other
// entries bound one by one, what is in the way left out.
func TestRootFSLayout(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"bin", "var/lib/x", "var/tmp", "usr/local/bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "var"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/sandbox-agentd"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	layout, err := rootLayout(root, []string{"/var/lib/bulkhead/local/s1", "/usr/local/bin/sandbox-agentd"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]rootEntry{}
	var order []string
	for _, e := range layout {
		got[e.dest] = e
		order = append(order, e.dest)
	}
	want := map[string]rootEntry{
		"/bin":           {dest: "/bin", src: filepath.Join(root, "bin"), dir: true},
		"/etc":           {dest: "/etc", src: filepath.Join(root, "etc"), dir: true},
		"/lib":           {dest: "/lib", src: "usr/lib", link: true},
		"/var":           {dest: "/var", dir: true, perm: 0o750},
		"/var/lib":       {dest: "/var/lib", dir: true, perm: 0o755},
		"/var/lib/x":     {dest: "/var/lib/x", src: filepath.Join(root, "var/lib/x"), dir: true},
		"/var/tmp":       {dest: "/var/tmp", src: filepath.Join(root, "var/tmp"), dir: true},
		"/usr":           {dest: "/usr", dir: true, perm: 0o755},
		"/usr/local":     {dest: "/usr/local", dir: true, perm: 0o755},
		"/usr/local/bin": {dest: "/usr/local/bin", dir: true, perm: 0o755},
	}
	if len(got) != len(want) {
		t.Errorf("layout %v, want %d entries", order, len(want))
	}
	for dest, w := range want {
		if got[dest] != w {
			t.Errorf("%s: %+v, want %+v", dest, got[dest], w)
		}
	}
	if slices.Index(order, "/var") > slices.Index(order, "/var/lib") || slices.Index(order, "/var/lib") > slices.Index(order, "/var/lib/x") {
		t.Errorf("parents after children: %v", order)
	}
}

// TestRootFSSandbox: a root harness's bubblewrap sandbox on a root file
// system of its own (the one `make rootfs` writes) sees that tree at /,
// none of the host's files (a marker file, /etc/shadow, the state
// directory's other sandboxes, the harness's binaries), and works: its
// accounts resolve by name, git and the shell run, the workspace and home
// are writable, / is not.
func TestRootFSSandbox(t *testing.T) {
	rootfs := agentdtest.RootFS(t)
	state := testenv.SearchableTempDir(t)
	c := rootBwrapClient(t, state, nil, Config{RootFS: rootfs})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	marker := hostMarker(t)
	m := &manifest.Manifest{Users: []manifest.User{{Name: "mate"}}, RunAs: "mate"}
	s := createStarted(ctx, t, c, m)
	other := createStarted(ctx, t, c, nil)
	_, dir := sandboxState(t, s)

	checkRootListing(ctx, t, s, rootfs, dir)

	for _, user := range []string{"root", ""} {
		out, errOut, _ := run(ctx, t, s, user, strings.Join([]string{
			"test -e " + marker + " && echo host-marker",
			"test -e /etc/shadow && echo shadow",
			"test -e " + filepath.Join(state, other.ID()) + " && echo other-sandbox",
			"test -e /etc/hostname && echo host-etc",
			"touch /new 2>/dev/null && echo wrote-root",
			"touch /bin/new 2>/dev/null && echo wrote-bin",
			"echo ws > ws-" + user + " && echo ws-ok",
			"id -un",
			"git --version >/dev/null && echo git-ok",
		}, "; "))
		name := "mate"
		if user == "root" {
			name = "root"
		}
		if want := "ws-ok\n" + name + "\ngit-ok\n"; out != want {
			t.Errorf("as %q inside: %q, want %q (stderr %q)", user, out, want, errOut)
		}
	}
	// Root inside sees of the state directory only its own sandbox's
	// directory, and that only what the sandbox needs (its workspace is
	// at /workspace only); the account's home is its own.
	if out, errOut, _ := run(ctx, t, s, "root", "ls -A "+state+" "+dir+"; pwd; cat ws-root"); out != state+":\n"+s.ID()+"\n\n"+dir+":\netc\nhome\nrun\n"+manifest.DefaultRoot+"\nws\n" {
		t.Errorf("as root inside, the state directory shows %q (stderr %q)", out, errOut)
	}
	if out, errOut, _ := run(ctx, t, s, "", `echo "$HOME"; echo h > "$HOME/h" && echo home-ok`); out != "/home/mate\nhome-ok\n" {
		t.Errorf("the account's home: %q (stderr %q)", out, errOut)
	}
	// The private etc is seeded from the root file system's accounts.
	if b, err := os.ReadFile(filepath.Join(dir, "etc", "passwd")); err != nil || !strings.HasPrefix(string(b), "root:x:0:0:root:/root:/bin/sh\nnobody:") {
		t.Errorf("the sandbox's passwd: %q, %v", b, err)
	}
}

// TestGVisorSpecRootFS: with a root file system of its own, a gVisor
// sandbox's OCI bundle binds the tree's entries (not the host's /) on a
// root holding their mount points, and the tree's /etc under the
// sandbox's own.
func TestGVisorSpecRootFS(t *testing.T) {
	rootfs := agentdtest.RootFS(t)
	state := testenv.SearchableTempDir(t)
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: fake, RootFS: rootfs}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "sess-1")
	for _, d := range []string{"workspace", runDir, "etc", homeDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	argv := []string{agentdBin, "--listen", "unix://" + filepath.Join(dir, runDir, socketName)}
	if err := p.gvisorPrepare(dir, "/srv/app", argv, 0); err != nil {
		t.Fatal(err)
	}
	spec, err := p.gvisorSpec(dir, "/srv/app", argv)
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]ociMount{}
	for _, m := range spec.Mounts {
		mounts[m.Destination] = m
		if m.Source == "/" {
			t.Errorf("the host's / is mounted: %+v", m)
		}
		if m.Type == "bind" {
			// Every mount point is on the root already.
			if _, err := os.Lstat(filepath.Join(gvisorPathsOf(dir).rootfs, m.Destination)); err != nil && !strings.HasPrefix(m.Destination, "/etc/") {
				t.Errorf("no mount point for %s on the OCI root: %v", m.Destination, err)
			}
		}
	}
	if m := mounts["/srv/app"]; m.Source != filepath.Join(dir, "workspace") || !slices.Contains(m.Options, "rw") {
		t.Errorf("/srv/app: %+v, want the workspace, writable", m)
	}
	if m, ok := mounts[filepath.Join(dir, "workspace")]; ok {
		t.Errorf("the workspace is mounted at its host path too: %+v", m)
	}
	if m := mounts["/bin"]; m.Source != filepath.Join(rootfs, "bin") || !slices.Contains(m.Options, "ro") {
		t.Errorf("/bin: %+v, want the root file system's, read-only", m)
	}
	if mounts["/etc/"+hostEtc].Source != filepath.Join(rootfs, "etc") {
		t.Errorf("/etc/.host: %+v", mounts["/etc/"+hostEtc])
	}
	if target, err := os.Readlink(filepath.Join(gvisorPathsOf(dir).etcView, "group")); err != nil || target != filepath.Join(dir, "etc", "group") {
		t.Errorf("/etc/group: %q, %v", target, err)
	}
}

// TestGVisorRootFSSandbox: a gVisor sandbox on a root file system of its
// own sees the tree, and none of the host's files.
func TestGVisorRootFSSandbox(t *testing.T) {
	bin := runsc.Require(t)
	rootfs := agentdtest.RootFS(t)
	state := testenv.SearchableTempDir(t)
	c, err := NewClient(Config{StateDir: state, AgentdPath: agentdBin, Isolation: IsolationGVisor, Runsc: bin, RootFS: rootfs},
		compute.ClientOptions{Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	marker := hostMarker(t)
	s := createStarted(ctx, t, c, nil)
	other := createStarted(ctx, t, c, nil)
	_, dir := sandboxState(t, s)
	checkRootListing(ctx, t, s, rootfs, dir)
	out, errOut, _ := run(ctx, t, s, "root", strings.Join([]string{
		"test -e " + marker + " && echo host-marker",
		"test -e /etc/shadow && echo shadow",
		"test -e " + filepath.Join(state, other.ID()) + " && echo other-sandbox",
		"test -x /bin/busybox && echo busybox",
		"echo ws > ws && echo ws-ok",
		"id -un",
	}, "; "))
	if want := "busybox\nws-ok\nroot\n"; out != want {
		t.Errorf("inside: %q, want %q (stderr %q)", out, want, errOut)
	}
}

// hostMarker returns a file of the host that any user may read, outside
// the paths a sandbox gets fresh (/tmp): a sandbox on a root file system of
// its own must not see it.
func hostMarker(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "bh-marker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "host-marker")
	if err := os.WriteFile(marker, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return marker
}

// checkRootListing checks that / in sandbox s (whose private directory is
// dir) holds the entries of the root file system rootfs, and besides them
// only the first directories of the paths the sandbox needs at their host
// paths (private directory, daemon binary), /home and the workspace root.
func checkRootListing(ctx context.Context, t *testing.T, s *compute.Session, rootfs, dir string) {
	t.Helper()
	out, errOut, code := run(ctx, t, s, "root", "ls -A /")
	if code != 0 {
		t.Fatalf("ls /: exit %d %q", code, errOut)
	}
	entries, err := os.ReadDir(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	inside := strings.Fields(out)
	for _, e := range entries {
		if !slices.Contains(inside, e.Name()) {
			t.Errorf("/ inside lacks the root file system's %s: %q", e.Name(), out)
		}
	}
	allowed := []string{"home", strings.Split(dir, "/")[1], strings.Split(agentdBin, "/")[1], strings.Split(manifest.DefaultRoot, "/")[1]}
	for _, name := range inside {
		if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() == name }) && !slices.Contains(allowed, name) {
			t.Errorf("/ inside holds %s, which is neither the root file system's nor needed: %q", name, out)
		}
	}
}
