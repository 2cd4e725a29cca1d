package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.Require(t, testenv.Root)
}

func ownerOf(t testing.TB, p string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// TestRunAsOwnership checks files, directories and commits made as a user
// belong to that user, and the daemon's own files stay root's.
func TestRunAsOwnership(t *testing.T) { forEachCredSwitch(t, testRunAsOwnership) }

func testRunAsOwnership(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	nobody := e.user(t, "nobody")
	must(t, os.Chmod(e.root, 0o777))

	res, err := e.w.WriteFile(ctx, nobody, WriteOptions{Path: "mine.txt", ExpectedSize: 2}, strings.NewReader("hi"))
	must(t, err)
	if uid, gid := ownerOf(t, e.path("mine.txt")); uid != 65534 || gid != 65534 {
		t.Fatalf("file owned by %d:%d", uid, gid)
	}
	if res.Info.UID != 65534 || res.Info.Owner != "nobody" || res.Info.Mode != 0o644 {
		t.Fatalf("result info %+v", res.Info)
	}
	must(t, e.w.MakeDir(ctx, nobody, "mydir/sub", 0o750, true))
	for _, d := range []string{"mydir", "mydir/sub"} {
		if uid, _ := ownerOf(t, e.path(d)); uid != 65534 {
			t.Fatalf("%s owned by %d", d, uid)
		}
	}
	if fi, _ := os.Stat(e.path("mydir/sub")); fi.Mode().Perm() != 0o750 {
		t.Fatalf("mode %v", fi.Mode())
	}
	must(t, e.w.Commit(ctx, nobody, []FileChange{{Kind: ChangeWrite, Path: "mydir/patched.txt", Content: []byte("x")}}))
	if uid, _ := ownerOf(t, e.path("mydir/patched.txt")); uid != 65534 {
		t.Fatalf("committed file owned by %d", uid)
	}
	// The daemon's identity, meanwhile, is untouched.
	must(t, writeString(ctx, e.w, nil, "root.txt", "r"))
	if uid, gid := ownerOf(t, e.path("root.txt")); uid != 0 || gid != 0 {
		t.Fatalf("daemon file owned by %d:%d", uid, gid)
	}
	// Root overwriting a user's file keeps the user as owner.
	must(t, writeString(ctx, e.w, nil, "mine.txt", "root wrote this"))
	if uid, gid := ownerOf(t, e.path("mine.txt")); uid != 65534 || gid != 65534 {
		t.Fatalf("overwritten file owned by %d:%d", uid, gid)
	}
}

// TestRunAsPermissions checks the user's permissions are enforced: a
// read-only root file stays unwritable (even though the directory is
// writable and writes use rename), and a 0700 root directory is closed.
func TestRunAsPermissions(t *testing.T) { forEachCredSwitch(t, testRunAsPermissions) }

func testRunAsPermissions(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	nobody := e.user(t, "nobody")
	must(t, os.Chmod(e.root, 0o777))
	e.put(t, "ro.txt", "original", 0o444)
	e.put(t, "private/secret.txt", "secret", 0o644)
	must(t, os.Chmod(e.path("private"), 0o700))
	before := fileSnapshot(t, e.root)

	_, err := e.w.WriteFile(ctx, nobody, WriteOptions{Path: "ro.txt", ExpectedSize: -1}, strings.NewReader("pwned"))
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	err = e.w.Commit(ctx, nobody, []FileChange{{Kind: ChangeWrite, Path: "ro.txt", Content: []byte("pwned")}})
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	_, err = readAll(ctx, e.w, nobody, "private/secret.txt")
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	_, err = e.w.ListDir(ctx, nobody, "private", ListOptions{})
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	_, err = e.w.Stat(ctx, nobody, "private/secret.txt")
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	err = writeString(ctx, e.w, nobody, "private/new.txt", "x")
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	err = e.w.Remove(ctx, nobody, "private/secret.txt", false)
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	err = e.w.Remove(ctx, nobody, "private", true)
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	_, err = e.w.ResolveDir(ctx, nobody, "private")
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	err = e.w.MakeDir(ctx, nobody, "private/d", 0, false)
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	err = e.w.Rename(ctx, nobody, "private/secret.txt", "stolen.txt", false)
	checkErr(t, e, err, errkind.ErrPermissionDenied)

	if d := diffSnapshots(before, fileSnapshot(t, e.root)); d != "" {
		t.Fatalf("workspace changed:\n%s", d)
	}
	// Root still can.
	b, err := readAll(ctx, e.w, nil, "private/secret.txt")
	must(t, err)
	bytesEqual(t, b, []byte("secret"))
}

// TestRunAsGroups checks supplementary groups from userdb apply.
func TestRunAsGroups(t *testing.T) { forEachCredSwitch(t, testRunAsGroups) }

func testRunAsGroups(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	alice, nobody := e.user(t, "alice"), e.user(t, "nobody")
	must(t, os.Mkdir(e.path("team"), 0o770))
	must(t, os.Chown(e.path("team"), 0, 2000))
	must(t, os.Chmod(e.path("team"), 0o770))
	must(t, writeString(ctx, e.w, alice, "team/a.txt", "from alice"))
	if uid, gid := ownerOf(t, e.path("team/a.txt")); uid != 1001 || gid != 1001 {
		t.Fatalf("owned by %d:%d", uid, gid)
	}
	checkErr(t, e, writeString(ctx, e.w, nobody, "team/b.txt", "x"), errkind.ErrPermissionDenied)
}

// TestRunAsThreadsStayClean runs many user operations concurrently with
// daemon ones and checks no thread of the process keeps a user's
// credentials and the daemon's writes stay root's.
func TestRunAsThreadsStayClean(t *testing.T) { forEachCredSwitch(t, testRunAsThreadsStayClean) }

func testRunAsThreadsStayClean(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	nobody := e.user(t, "nobody")
	must(t, os.Chmod(e.root, 0o777))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 50 {
				p := fmt.Sprintf("u%d-%d", g, i)
				if err := writeString(ctx, e.w, nobody, p, "x"); err != nil {
					t.Error(err)
					return
				}
				if uid, _ := ownerOf(t, e.path(p)); uid != 65534 {
					t.Errorf("%s owned by %d", p, uid)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for i := range 50 {
				p := fmt.Sprintf("r%d-%d", g, i)
				if err := writeString(ctx, e.w, nil, p, "x"); err != nil {
					t.Error(err)
					return
				}
				if uid, _ := ownerOf(t, e.path(p)); uid != 0 {
					t.Errorf("%s owned by %d", p, uid)
				}
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	t.Logf("operations took %v", time.Since(start))
	// A locked goroutine's thread exits just after the goroutine does:
	// poll briefly until no thread holds non-root credentials.
	var dirty []string
	for range 100 {
		if dirty = dirtyThreads(t); len(dirty) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(dirty) > 0 {
		t.Fatalf("threads kept user credentials: %v", dirty)
	}
	t.Logf("no thread keeps user credentials after %v", time.Since(start))
}

// dirtyThreads lists the threads of this process whose uids, gids or
// groups are not all root.
func dirtyThreads(t testing.TB) []string {
	tasks, err := os.ReadDir("/proc/self/task")
	must(t, err)
	var dirty []string
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:") || strings.HasPrefix(line, "Groups:") {
				for _, v := range strings.Fields(line)[1:] {
					if v != "0" {
						dirty = append(dirty, task.Name()+": "+line)
					}
				}
			}
		}
	}
	return dirty
}

// TestRunAsNeedsRoot checks a non-root daemon refuses to act as another
// user, and acts directly as its own.
func TestRunAsNeedsRoot(t *testing.T) {
	e := newEnv(t)
	e.w.euid, e.w.egid = 1001, 1001
	ctx := context.Background()
	_, err := e.w.Stat(ctx, &userdb.User{Name: "nobody", UID: 65534, GID: 65534}, ".")
	checkErr(t, e, err, errkind.ErrPermissionDenied)
	_, err = e.w.Stat(ctx, &userdb.User{Name: "alice", UID: 1001, GID: 1001}, ".")
	must(t, err)
}
