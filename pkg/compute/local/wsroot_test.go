package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/computetest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// TestSandboxRootRefused: a workspace root an isolated sandbox cannot
// have (one of its own system directories, or one that would cover its
// private directories or its daemon) is refused before anything is made,
// without naming a host path; a plain sandbox ignores the root (it sees
// the host path).
func TestSandboxRootRefused(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	agentd := "/opt/bulkhead/bin/sandbox-agentd"
	p := &Provider{cfg: Config{StateDir: state, AgentdPath: agentd}, bwrap: "/usr/bin/bwrap", isolation: IsolationBubblewrap}
	for _, root := range []string{"/proc", "/proc/x", "/dev/shm/w", "/sys", "/etc", "/etc/app", "/run/w", "/home", "/home/agent", "/tmp",
		state, filepath.Dir(state), filepath.Join(state, "x"), "/opt", "/opt/bulkhead", agentd, "/", "/a/../b"} {
		_, err := p.sandboxRoot(&manifest.Manifest{Root: root})
		if !errors.Is(err, compute.ErrInvalidArgument) {
			t.Errorf("root %s: %v, want an invalid argument", root, err)
			continue
		}
		if strings.Contains(err.Error(), state) && !strings.HasPrefix(root, state) && root != filepath.Dir(state) {
			t.Errorf("root %s: the error names the state directory: %v", root, err)
		}
	}
	for _, root := range []string{"", "/workspace", "/srv/app", "/tmp/ws", "/var/tmp/w", "/opt/other", "/homework"} {
		got, err := p.sandboxRoot(&manifest.Manifest{Root: root})
		want := root
		if root == "" {
			want = manifest.DefaultRoot
		}
		if err != nil || got != want {
			t.Errorf("root %q: %q, %v, want %q", root, got, err, want)
		}
	}
	if got, err := p.sandboxRoot(nil); err != nil || got != manifest.DefaultRoot {
		t.Errorf("no manifest: %q, %v", got, err)
	}
	plain := &Provider{cfg: p.cfg, isolation: IsolationNone}
	if got, err := plain.sandboxRoot(&manifest.Manifest{Root: "/proc"}); err != nil || got != "" {
		t.Errorf("a plain sandbox's root: %q, %v, want the host path", got, err)
	}
}

// TestBubblewrapWorkspaceAtManifestRoot: a bubblewrap sandbox sees its
// workspace at the manifest's root, never at its host path (see
// checkWorkspaceRoots).
func TestBubblewrapWorkspaceAtManifestRoot(t *testing.T) {
	testenv.Require(t, testenv.Bubblewrap)
	env, stateDir := providerEnvWith(t, IsolationBubblewrap)
	checkWorkspaceRoots(t, env, stateDir)
}

// TestGVisorWorkspaceAtManifestRoot is TestBubblewrapWorkspaceAtManifestRoot
// under gVisor.
func TestGVisorWorkspaceAtManifestRoot(t *testing.T) {
	bin := runsc.Require(t)
	env, stateDir := gvisorEnv(t, bin)
	checkWorkspaceRoots(t, env, stateDir)
}

// checkWorkspaceRoots checks where isolated sandboxes of env (over
// stateDir) see their workspace: at /workspace by default, at the
// manifest's root when it sets one (one the host lacks, and one whose
// directory the host has, which stays untouched), the same after a
// replacement; processes start there, the daemon says so (Info), file
// calls accept it, and their errors name it, never the host path, which
// the sandbox does not see.
func checkWorkspaceRoots(t *testing.T, env computetest.Env, stateDir string) {
	existing, err := os.MkdirTemp("/var/tmp", "bh-root-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(existing) })
	for _, tc := range []struct{ name, root string }{
		{"Default", ""},
		{"MissingOnHost", "/srv/app"},
		{"ExistingOnHost", existing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			store, err := snapshot.NewLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			c := env.NewClient(t, store)
			m := &manifest.Manifest{Root: tc.root}
			want := m.WorkspaceRoot()
			s := createStarted(ctx, t, c, m)
			st, dir := sandboxState(t, s)
			hostWS := filepath.Join(dir, "workspace")
			checkSeesRoot(ctx, t, s, want, hostWS)
			if b, err := os.ReadFile(filepath.Join(hostWS, "f.txt")); err != nil || string(b) != "hi\n" {
				t.Errorf("the file written at %s is not in the host workspace: %q, %v", want, b, err)
			}
			if tc.root == existing {
				if entries, err := os.ReadDir(existing); err != nil || len(entries) != 0 {
					t.Errorf("the host's %s changed: %v, %v", existing, entries, err)
				}
			}
			if tc.name != "Default" {
				return
			}
			// A replacement (its daemon died) sees the same path, with
			// the workspace kept.
			for _, pr := range sandboxProcesses(sandboxMarkers(dir)) {
				_ = syscall.Kill(pr.pid, syscall.SIGKILL)
			}
			if err := waitNoDaemons(ctx, dir, sandboxMarkers(dir)); err != nil {
				t.Fatal(err)
			}
			_ = s.Release()
			checkSeesRoot(ctx, t, resumeStarted(ctx, t, env.NewClient(t, store), st), want, hostWS)
		})
	}
	if entries, err := os.ReadDir("/srv/app"); err == nil {
		t.Errorf("a sandbox made /srv/app on the host: %v", entries)
	}
}

// checkSeesRoot checks that sandbox s sees its workspace at root and
// nothing at its host path hostWS.
func checkSeesRoot(ctx context.Context, t *testing.T, s *compute.Session, root, hostWS string) {
	t.Helper()
	out, errOut, code := run(ctx, t, s, "", "pwd; echo hi > f.txt && realpath f.txt; test -e "+hostWS+" && echo host-path-visible; echo $PWD")
	if want := root + "\n" + root + "/f.txt\n" + root + "\n"; out != want || code != 0 {
		t.Errorf("inside: %q (exit %d, stderr %q), want %q", out, code, errOut, want)
	}
	info, err := s.Agent().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.WorkspaceRoot != root {
		t.Errorf("the daemon's workspace root is %q, want %q", info.WorkspaceRoot, root)
	}
	if fi, err := s.Stat(ctx, root+"/f.txt", compute.StatOptions{}); err != nil || fi.Size != 3 {
		t.Errorf("Stat(%s/f.txt): %+v, %v", root, fi, err)
	}
	page, err := s.ListDir(ctx, root, compute.ListDirOptions{})
	if err != nil || len(page.Entries) == 0 {
		t.Fatalf("ListDir(%s): %+v, %v", root, page, err)
	}
	for _, e := range page.Entries {
		if strings.Contains(e.Path, hostWS) {
			t.Errorf("ListDir names the host path: %+v", e)
		}
	}
	// Failures name the sandbox's path, never the host's; the host path
	// is no way into the workspace.
	var sink strings.Builder
	_, readErr := s.ReadFile(ctx, root+"/missing.txt", compute.ReadFileOptions{}, &sink)
	_, patchErr := s.ApplyPatch(ctx, "*** Begin Patch\n*** Update File: "+root+"/absent.txt\n@@\n-a\n+b\n*** End Patch\n", compute.ApplyPatchOptions{})
	_, cwdErr := s.Exec(ctx, compute.ProcessSpec{Command: "true", Cwd: root + "/no-such-dir"}, compute.ExecOptions{}, nil)
	_, shellErr, shellCode := run(ctx, t, s, "", "cat \"$PWD/missing.txt\"")
	for what, tc := range map[string]struct {
		err  error
		name string
	}{
		"reading a missing file":      {readErr, root + "/missing.txt"},
		"patching a missing file":     {patchErr, root + "/absent.txt"},
		"a missing working directory": {cwdErr, root + "/no-such-dir"},
	} {
		switch {
		case tc.err == nil:
			t.Errorf("%s: no error", what)
		case strings.Contains(tc.err.Error(), filepath.Dir(hostWS)) || !strings.Contains(tc.err.Error(), tc.name):
			t.Errorf("%s: %v, want it to name %s and no host path", what, tc.err, tc.name)
		}
	}
	if !errors.Is(readErr, compute.ErrNotFound) {
		t.Errorf("reading %s/missing.txt: %v, want not found", root, readErr)
	}
	if shellCode == 0 || !strings.Contains(shellErr, root+"/missing.txt") || strings.Contains(shellErr, filepath.Dir(hostWS)) {
		t.Errorf("the shell's error: exit %d, %q, want it to name %s/missing.txt", shellCode, shellErr, root)
	}
	if _, err := s.Stat(ctx, hostWS+"/f.txt", compute.StatOptions{}); err == nil {
		t.Errorf("Stat of the host path %s/f.txt succeeded inside the sandbox", hostWS)
	}
}

// TestGVisorPauseKeepsWorkspacePath: a paused gVisor sandbox restored by a
// new harness sees its workspace where it did: a process started before
// the pause still runs there, and new ones start there. On the sandbox
// root file system with a root of the manifest's, and on the host's
// files with the default root.
func TestGVisorPauseKeepsWorkspacePath(t *testing.T) {
	e := newPauseEnv(t)
	for _, tc := range []struct {
		name, root string
		rootFS     bool
	}{{"RootFS", "/srv/app", true}, {"HostFiles", "", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			env := *e
			if !tc.rootFS {
				env.cfg.RootFS = ""
			}
			m := &manifest.Manifest{RunAs: "root", Root: tc.root}
			want := m.WorkspaceRoot()
			s := createStarted(ctx, t, env.client(t), m)
			// Prints its working directory for every line it reads.
			proc, err := s.StartProcess(ctx, compute.ProcessSpec{Command: `while read -r x; do echo "$x $(pwd -P)"; done`, Stdin: true}, compute.StartOptions{})
			if err != nil {
				t.Fatal(err)
			}
			id := proc.Process.ProcessID
			if _, err := s.Pause(ctx); err != nil {
				t.Fatalf("pause: %v", err)
			}
			st, dir := sandboxState(t, s)
			s, err = env.client(t).Resume(ctx, st)
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			if !s.Restored() {
				t.Fatal("the sandbox was not restored from its checkpoint")
			}
			if _, err := s.WriteStdin(ctx, id, 0, []byte("after\n")); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the process started before the pause answers", func() (bool, string) {
				out, err := s.ReadOutput(ctx, id, compute.ReadOutputOptions{})
				if err != nil {
					return false, err.Error()
				}
				var b strings.Builder
				for _, ch := range out.Chunks {
					b.Write(ch.Data)
				}
				return b.String() == "after "+want+"\n", b.String()
			})
			checkSeesRoot(ctx, t, s, want, filepath.Join(dir, "workspace"))
		})
	}
}
