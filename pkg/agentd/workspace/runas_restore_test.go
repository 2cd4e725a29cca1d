package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// lockedThread runs fn on a goroutine locked to a thread that is not the
// main thread, so that runAs switches that very thread, and reports the
// thread's credentials before and after.
func lockedThread(t *testing.T, fn func()) (before, after threadCreds) {
	t.Helper()
	work := func() {
		// Deliberately never unlocked: the test may have left this thread
		// in any state, so it ends with the goroutine.
		var err error
		if before, err = getThreadCreds(); err != nil {
			t.Error(err)
			return
		}
		tid := unix.Gettid()
		fn()
		if unix.Gettid() != tid {
			t.Error("the goroutine moved to another thread")
		}
		if after, err = getThreadCreds(); err != nil {
			t.Error(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if !isMainThread() {
			work()
			return
		}
		// Keep the main thread locked (and untouched) so that the
		// goroutine doing the work runs elsewhere.
		inner := make(chan struct{})
		go func() {
			defer close(inner)
			runtime.LockOSThread()
			work()
		}()
		<-inner
		runtime.UnlockOSThread()
	}()
	<-done
	return before, after
}

func sameCreds(a, b threadCreds) bool {
	return a.fsuid == b.fsuid && a.fsgid == b.fsgid && slices.Equal(a.groups, b.groups) && a.caps == b.caps
}

// TestRunAsRestoresTheThread checks runAs switches the calling thread in
// place and leaves it exactly as it found it: after a user operation, a
// failed one, and a panic inside fn.
func TestRunAsRestoresTheThread(t *testing.T) { forEachCredSwitch(t, testRunAsRestoresTheThread) }

func testRunAsRestoresTheThread(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	alice := e.user(t, "alice")
	must(t, os.Chmod(e.root, 0o777))
	e.put(t, "root-only.txt", "x", 0o600)

	var during threadCreds
	before, after := lockedThread(t, func() {
		if err := e.w.runAs(ctx, alice, func() error {
			var err error
			during, err = getThreadCreds()
			return err
		}); err != nil {
			t.Error(err)
		}
		if err := writeString(ctx, e.w, alice, "a.txt", "alice"); err != nil {
			t.Error(err)
		}
		if _, err := readAll(ctx, e.w, alice, "root-only.txt"); err == nil {
			t.Error("alice read a root-only file")
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Error("panic did not propagate")
				}
			}()
			_ = e.w.runAs(ctx, alice, func() error { panic("boom") })
		}()
	})
	if during.fsuid != alice.UID || during.fsgid != alice.GID || !slices.Equal(during.groups, alice.Groups) {
		t.Fatalf("during runAs the thread had %+v, want alice (%d/%d %v)", during, alice.UID, alice.GID, alice.Groups)
	}
	if during.caps[0].Effective&(1<<unix.CAP_DAC_OVERRIDE) != 0 {
		t.Fatal("CAP_DAC_OVERRIDE stayed effective as alice")
	}
	if how == switchEffectiveIDs && (during.euid != alice.UID || during.egid != alice.GID || during.caps[0].Effective|during.caps[1].Effective != 0) {
		t.Fatalf("switching effective ids, the thread had %+v, want alice's effective ids and no effective capability", during)
	}
	if how == switchFSIDs && (during.euid != before.euid || during.egid != before.egid) {
		t.Fatalf("switching fs ids changed the effective ids: %+v", during)
	}
	if !sameCreds(before, after) {
		t.Fatalf("thread not restored: before %+v, after %+v", before, after)
	}
	if uid, _ := ownerOf(t, e.path("a.txt")); uid != alice.UID {
		t.Fatalf("a.txt owned by %d", uid)
	}
}

// TestRunAsNested checks a runAs inside another returns to the outer
// user, not to root.
func TestRunAsNested(t *testing.T) { forEachCredSwitch(t, testRunAsNested) }

func testRunAsNested(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	alice, nobody := e.user(t, "alice"), e.user(t, "nobody")
	must(t, os.Chmod(e.root, 0o777))
	before, after := lockedThread(t, func() {
		err := e.w.runAs(ctx, alice, func() error {
			if err := e.w.runAs(ctx, nobody, func() error {
				c, err := getThreadCreds()
				if err == nil && c.fsuid != nobody.UID {
					t.Errorf("inner fsuid %d", c.fsuid)
				}
				return err
			}); err != nil {
				return err
			}
			c, err := getThreadCreds()
			if err == nil && (c.fsuid != alice.UID || c.fsgid != alice.GID) {
				t.Errorf("after the inner runAs the thread is %d/%d, want alice", c.fsuid, c.fsgid)
			}
			return err
		})
		if err != nil {
			t.Error(err)
		}
	})
	if !sameCreds(before, after) {
		t.Fatalf("thread not restored: before %+v, after %+v", before, after)
	}
}

// TestRunAsKeepsDroppedCapabilities checks that returning to fsuid 0 does
// not raise a capability the thread had dropped from its effective set
// (the kernel raises every permitted file capability on that transition).
func TestRunAsKeepsDroppedCapabilities(t *testing.T) {
	forEachCredSwitch(t, testRunAsKeepsDroppedCapabilities)
}

func testRunAsKeepsDroppedCapabilities(t *testing.T, how credSwitch) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	e.w.credSwitch = how
	nobody := e.user(t, "nobody")
	if c, err := getThreadCreds(); err != nil || c.caps[0].Permitted&(1<<unix.CAP_DAC_OVERRIDE) == 0 {
		testenv.Skip(t, fmt.Sprintf("CAP_DAC_OVERRIDE is not permitted here (%v)", err))
	}
	var dropped threadCreds
	_, after := lockedThread(t, func() {
		c, err := getThreadCreds()
		if err != nil {
			t.Error(err)
			return
		}
		c.caps[0].Effective &^= 1 << unix.CAP_DAC_OVERRIDE
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		if err := unix.Capset(&hdr, &c.caps[0]); err != nil {
			t.Error(err)
			return
		}
		if dropped, err = getThreadCreds(); err != nil {
			t.Error(err)
			return
		}
		if _, err := e.w.Stat(ctx, nobody, "."); err != nil {
			t.Error(err)
		}
	})
	if after.caps[0].Effective&(1<<unix.CAP_DAC_OVERRIDE) != 0 {
		t.Fatal("runAs raised CAP_DAC_OVERRIDE the thread had dropped")
	}
	if !sameCreds(dropped, after) {
		t.Fatalf("thread not restored: before %+v, after %+v", dropped, after)
	}
}

// TestRunAsReusesThreads checks user operations run on the runtime's
// threads (they used to run each on a fresh thread, thrown away after).
func TestRunAsReusesThreads(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	e := newEnv(t)
	nobody := e.user(t, "nobody")
	tids := map[int]bool{}
	for range 500 {
		if err := e.w.runAs(ctx, nobody, func() error {
			tids[unix.Gettid()] = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(tids) > 50 {
		t.Fatalf("500 user operations ran on %d threads", len(tids))
	}
}

// forEachCredSwitch runs test with each way runAs can switch a thread:
// fsuid and fsgid, and effective ids (what gVisor, which lacks setfsuid,
// gets; the host's kernel supports both, so both are tested here).
func forEachCredSwitch(t *testing.T, test func(t *testing.T, how credSwitch)) {
	t.Run("FSIDs", func(t *testing.T) {
		if probeCredSwitch() != switchFSIDs {
			testenv.Skip(t, "this kernel lacks setfsuid (gVisor?)")
		}
		test(t, switchFSIDs)
	})
	t.Run("EffectiveIDs", func(t *testing.T) { test(t, switchEffectiveIDs) })
}

// TestRunAsPoisonsAThreadItCannotRestore checks that a thread whose
// identity runAs cannot put back is never unlocked: it ends with its
// goroutine rather than run other goroutines as the user.
func TestRunAsPoisonsAThreadItCannotRestore(t *testing.T) {
	forEachCredSwitch(t, testRunAsPoisonsAThreadItCannotRestore)
}

func testRunAsPoisonsAThreadItCannotRestore(t *testing.T, how credSwitch) {
	requireRoot(t)
	e := newEnv(t)
	alice := e.user(t, "alice")
	type result struct {
		tid int
		err error
	}
	run := func(fn func() error) result {
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // as runAs does; switchedRun unlocks once restored
			if !isMainThread() {
				done <- result{unix.Gettid(), switchedRun(how, alice, fn)}
				return
			}
			// The main thread is never switched: hold it (so that the
			// inner goroutine runs elsewhere) and release it after.
			defer runtime.UnlockOSThread()
			inner := make(chan struct{})
			go func() {
				defer close(inner)
				runtime.LockOSThread()
				done <- result{unix.Gettid(), switchedRun(how, alice, fn)}
			}()
			<-inner
		}()
		return <-done
	}
	gone := func(tid int) bool {
		for range 500 {
			if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); os.IsNotExist(err) {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	// Losing CAP_SETGID from the permitted set as alice: setting root's
	// groups back then fails.
	r := run(func() error {
		var c [2]unix.CapUserData
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		if err := unix.Capget(&hdr, &c[0]); err != nil {
			return err
		}
		c[0].Permitted &^= 1 << unix.CAP_SETGID
		c[0].Effective &^= 1 << unix.CAP_SETGID
		return unix.Capset(&hdr, &c[0])
	})
	if !errors.Is(r.err, errkind.ErrInternal) || !strings.Contains(r.err.Error(), "restore") {
		t.Fatalf("restoring a thread that lost CAP_SETGID: %v, want an internal error about the restore", r.err)
	}
	if !gone(r.tid) {
		t.Fatalf("thread %d, which could not be restored, outlived its goroutine", r.tid)
	}
}
