package filesystem_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// Both tools act as the run's user: the daemon's permission checks apply
// and files a patch creates belong to that user.
func TestRunAs(t *testing.T) {
	testenv.Require(t, testenv.Root)
	s := newSandbox(t, filesystem.Options{})
	s.write("root-owned.txt", "mine\n")
	s.write("secret.png", string(imageSignatures[0].data))
	if err := os.Chmod(filepath.Join(s.d.Workspace, "secret.png"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.write("shared/.keep", "")
	if err := os.Chown(filepath.Join(s.d.Workspace, "shared"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	as := func(name, input string) (string, bool) {
		t.Helper()
		call := s.context("")
		call.RunAs = "nobody"
		res, err := s.tools[name].Call(context.Background(), call, input)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res.Output, res.IsError
	}

	out, isErr := as("apply_patch", "*** Begin Patch\n*** Update File: root-owned.txt\n@@\n-mine\n+yours\n*** End Patch\n")
	const denied = "apply_patch verification failed: permission denied: the sandbox user may not change 'root-owned.txt'." + rejected
	if !isErr || out != denied {
		t.Errorf("patch of a root-owned file as nobody:\n%s\nwant:\n%s", out, denied)
	}
	if s.read("root-owned.txt") != "mine\n" {
		t.Error("root-owned.txt changed")
	}

	out, isErr = as("apply_patch", "*** Begin Patch\n*** Add File: shared/new.txt\n+hi\n*** End Patch\n")
	if isErr || out != "Created shared/new.txt" {
		t.Fatalf("add as nobody: %s", out)
	}
	fi, err := os.Stat(filepath.Join(s.d.Workspace, "shared", "new.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 {
		t.Errorf("new file owned by uid %d, want nobody", st.Uid)
	}

	out, isErr = as("view_image", `{"path":"secret.png"}`)
	if !isErr || out != "unable to read image at `secret.png`: permission denied" {
		t.Errorf("unreadable image as nobody: %s", out)
	}
}

// Failures the model cannot act on end the call with an error for the
// runner instead of a result: no sandbox, a run_as user the sandbox does
// not know, a daemon that cannot be reached.
func TestHarnessFailures(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	s.write("pic.png", string(imageSignatures[0].data))
	const patch = "*** Begin Patch\n*** Add File: x.txt\n+x\n*** End Patch\n"
	inputs := map[string]string{"apply_patch": patch, "view_image": `{"path":"pic.png"}`}

	unreachable, err := agentclient.Dial(agentclient.Options{Address: "unix://" + filepath.Join(t.TempDir(), "none.sock"), Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer unreachable.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for name, input := range inputs {
		noSandbox := s.context("")
		noSandbox.Agent = nil
		unknownUser := s.context("")
		unknownUser.RunAs = "no-such-user-here"
		down := s.context("")
		down.Agent = unreachable
		for what, call := range map[string]tool.Context{"no sandbox": noSandbox, "unknown user": unknownUser, "daemon down": down} {
			res, err := s.tools[name].Call(ctx, call, input)
			if err == nil {
				t.Errorf("%s, %s: no error, result %+v", name, what, res)
			}
		}
	}
	if s.read("x.txt") != "<missing>" {
		t.Error("x.txt was created")
	}
}
