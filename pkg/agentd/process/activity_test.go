package process

import (
	"slices"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
)

// The Manager touches the activity clock at a start, at every output read
// (here written after stdin the Manager does not count), and at the exit;
// RunningPIDs lists the process until its exit is reported.
func TestManagerTouchesActivity(t *testing.T) {
	clock := activity.New(time.Unix(1, 0))
	m := newTestManager(t, Config{Activity: clock})
	ctx := testCtx(t)
	before := time.Now()
	in := mustStart(t, m, StartOptions{Argv: []string{"sh", "-c", "read x; echo got-$x; read y"}, Stdin: true})
	started := clock.Last()
	if started.Before(before) {
		t.Fatalf("start: the clock reads %v, before the start (%v)", started, before)
	}
	if got := m.RunningPIDs(nil); !slices.Equal(got, []int{in.PID}) {
		t.Fatalf("RunningPIDs: %v, want [%d]", got, in.PID)
	}
	time.Sleep(10 * time.Millisecond) // a later clock reading than the start's
	if _, err := m.WriteStdin(ctx, in.ID, 0, []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if res, err := m.Read(ctx, in.ID, 0, 10*time.Second, 0); err != nil || len(res.Chunks) == 0 {
		t.Fatalf("read the output: %+v, %v", res, err)
	}
	printed := clock.Last()
	if !printed.After(started) {
		t.Fatalf("output did not move the clock from the start (%v)", started)
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := m.WriteStdin(ctx, in.ID, 2, []byte("y\n")); err != nil {
		t.Fatal(err)
	}
	exit, err := m.Wait(ctx, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := clock.Last(); !got.Equal(exit.ExitedAt) || !got.After(printed) {
		t.Fatalf("exit at %v: the clock reads %v (output at %v)", exit.ExitedAt, got, printed)
	}
	if got := m.RunningPIDs(nil); len(got) != 0 {
		t.Fatalf("RunningPIDs after the exit: %v", got)
	}
}
