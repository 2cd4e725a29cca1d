package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// fakeUsers writes a passwd/group pair under a temp root: "agent" maps to
// the real nobody uid so that the kernel accepts it.
func fakeUsers(t *testing.T) *userdb.DB {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\n" +
		"agent:x:65534:65534:Agent:/home/agent:/bin/sh\n"
	group := "root:x:0:\nnogroup:x:65534:\nbuilders:x:4242:someone,agent\nother:x:4343:someone\n"
	for name, body := range map[string]string{"passwd": passwd, "group": group} {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return userdb.New(root)
}

const idScript = `echo "$(id -u) $(id -g) $(id -G)"; echo "HOME=$HOME USER=$USER LOGNAME=$LOGNAME SHELL=$SHELL"`

func TestRunAsUser(t *testing.T) {
	testenv.Require(t, testenv.Root)
	m := newTestManager(t, Config{Users: fakeUsers(t)})
	info := mustStart(t, m, StartOptions{Command: idScript, User: "agent", Dir: "/"})
	if info.User != "agent" {
		t.Errorf("Info.User = %q", info.User)
	}
	o := collect(t, m, info.ID)
	lines := strings.Split(o.stdout.String(), "\n")
	if len(lines) < 2 || lines[0] != "65534 65534 65534 4242" {
		t.Fatalf("ids = %q (stderr %q)", o.stdout.String(), o.stderr.String())
	}
	if lines[1] != "HOME=/home/agent USER=agent LOGNAME=agent SHELL=/bin/sh" {
		t.Errorf("identity env = %q", lines[1])
	}

	// By numeric uid, and as the default user; the request Env wins.
	m2 := newTestManager(t, Config{Users: fakeUsers(t), DefaultUser: "65534"})
	o = run(t, m2, StartOptions{Command: idScript, Dir: "/", Env: map[string]string{"HOME": "/tmp"}})
	if !strings.HasPrefix(o.stdout.String(), "65534 65534 65534 4242\nHOME=/tmp USER=agent") {
		t.Errorf("default user output = %q", o.stdout.String())
	}
	// An explicit user overrides the default.
	o = run(t, m2, StartOptions{Command: "id -u", User: "root", Dir: "/"})
	if o.stdout.String() != "0\n" {
		t.Errorf("root output = %q", o.stdout.String())
	}
	// The user's home does not exist here, so the default directory is /.
	o = run(t, m2, StartOptions{Argv: []string{"pwd"}})
	if o.stdout.String() != "/\n" {
		t.Errorf("default dir = %q", o.stdout.String())
	}
}

func TestRunAsUserCannotEnterDirectory(t *testing.T) {
	testenv.Require(t, testenv.Root)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m := newTestManager(t, Config{Users: fakeUsers(t)})
	_, err := m.Start(testCtx(t), StartOptions{Argv: []string{"true"}, User: "agent", Dir: dir})
	wantErr(t, err, errkind.ErrPermissionDenied, "agent", dir)
}

func TestRunAsErrors(t *testing.T) {
	m := newTestManager(t, Config{Users: fakeUsers(t)})
	_, err := m.Start(testCtx(t), StartOptions{Argv: []string{"true"}, User: "ghost"})
	wantErr(t, err, errkind.ErrNotFound, "ghost", "run_as")

	// A daemon that is not root may only run processes as itself.
	m.euid = 1000
	_, err = m.Start(testCtx(t), StartOptions{Argv: []string{"true"}, User: "agent"})
	wantErr(t, err, errkind.ErrPermissionDenied, "agent", "not root")

	m3 := newTestManager(t, Config{Users: fakeUsers(t), DefaultUser: "ghost"})
	_, err = m3.Start(testCtx(t), StartOptions{Argv: []string{"true"}})
	wantErr(t, err, errkind.ErrNotFound, "ghost")
}

// TestRunAsResolvedByCaller checks StartOptions.RunAs is used instead of a
// second lookup when it is the account asked for, and ignored otherwise.
func TestRunAsResolvedByCaller(t *testing.T) {
	testenv.Require(t, testenv.Root)
	m := newTestManager(t, Config{Users: fakeUsers(t)})
	// "ghost" is in no account file: only the resolved account can start it.
	ghost := &userdb.User{Name: "ghost", UID: 65534, GID: 65534, Home: "/nonexistent", Shell: "/bin/sh"}
	o := run(t, m, StartOptions{Command: `echo "$(id -u) $USER"`, User: "ghost", RunAs: ghost, Dir: "/"})
	if o.stdout.String() != "65534 ghost\n" {
		t.Fatalf("output %q (stderr %q)", o.stdout.String(), o.stderr.String())
	}
	// A resolved account under another name is not taken for the one asked.
	_, err := m.Start(testCtx(t), StartOptions{Argv: []string{"true"}, User: "nobody-else", RunAs: ghost})
	wantErr(t, err, errkind.ErrNotFound, "nobody-else")
}
