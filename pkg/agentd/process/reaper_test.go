package process

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
)

const reaperChildEnv = "BULKHEAD_PROCESS_REAPER_CHILD"

// TestReapAllSubreaper runs in a child test process, because a subreaper
// and a wait4(-1) reaper are process-wide and would steal the statuses of
// other tests' children.
func TestReapAllSubreaper(t *testing.T) {
	if os.Getenv(reaperChildEnv) == "1" {
		reapAllChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReapAllSubreaper$", "-test.v")
	cmd.Env = append(os.Environ(), reaperChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestReapAllSubreaper")) {
		t.Fatalf("child test failed: %v\n%s", err, out)
	}
}

func reapAllChild(t *testing.T) {
	r, err := NewReaper(ReaperOptions{Subreaper: true}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := newTestManager(t, Config{Reaper: r, DrainGrace: 100 * time.Millisecond})

	// Children watched through their pidfds need no SIGCHLD relay.
	for i := range 3 {
		if o := run(t, m, StartOptions{Command: "exit " + strconv.Itoa(i)}); o.exit.Code != i {
			t.Fatalf("child %d exit %+v", i, o.exit)
		}
	}
	if pidfdsWork() && r.relaying.Load() {
		t.Error("the reaper relays SIGCHLD before it met an orphan or an unwatched child")
	}

	// An orphaned grandchild is reparented to us and reaped when it ends,
	// and from then on SIGCHLD is relayed so that the next are reaped as
	// they exit.
	o := run(t, m, StartOptions{Command: "sleep 0.5 >/dev/null 2>&1 & echo $!"})
	orphan, err := strconv.Atoi(strings.TrimSpace(o.stdout.String()))
	if err != nil || o.exit.Code != 0 {
		t.Fatalf("output %q, exit %+v", o.stdout.String(), o.exit)
	}
	if ppid := parentOf(orphan); ppid != os.Getpid() {
		t.Fatalf("orphan %d has parent %d, want us (%d)", orphan, ppid, os.Getpid())
	}
	eventually(t, 10*time.Second, "the orphan to be reaped", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(orphan))
		return os.IsNotExist(err) // gone, not a zombie
	})
	// (It starts relaying just after it reaped the orphan.)
	eventually(t, 10*time.Second, "the reaper to relay SIGCHLD after it reaped an orphan", r.relaying.Load)

	// Many quick children racing wait4(-1): every status reaches its owner.
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			o := run(t, m, StartOptions{Command: "exit " + strconv.Itoa(i%7)})
			if o.exit.Code != i%7 {
				t.Errorf("child %d exit %+v", i, o.exit)
			}
		})
	}
	wg.Wait()
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// pidfdsWork reports whether this kernel has pidfds (without them every
// child is unwatched and the reaper relays SIGCHLD from the start).
func pidfdsWork() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// parentOf returns the parent pid of pid, or -1.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func TestPrivateReaperLeavesOtherChildrenAlone(t *testing.T) {
	// The default reaper waits only for its own pids, so os/exec keeps
	// working in the same process.
	m := newTestManager(t, Config{})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if err := exec.Command("true").Run(); err != nil {
				t.Errorf("os/exec: %v", err)
			}
		})
		wg.Go(func() {
			if o := run(t, m, StartOptions{Argv: []string{"false"}}); o.exit.Code != 1 {
				t.Errorf("exit %+v", o.exit)
			}
		})
	}
	wg.Wait()
}
