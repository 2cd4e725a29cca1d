package server

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// testReclaimIdle is the reclaimer's idle time in these tests; quiet
// stretches that must not reclaim are several times longer. Nothing is
// timed: a slow machine can only delay a reclaim, which the polls wait
// for up to reclaimDeadline.
const (
	testReclaimIdle = 50 * time.Millisecond
	quietStretch    = 10 * testReclaimIdle
	reclaimDeadline = 30 * time.Second
)

// countingReclaim counts reclaims and fails the test if one runs while a
// call holds reclaiming off.
type countingReclaim struct {
	t     *testing.T
	r     *reclaimer
	count atomic.Int64
}

func (c *countingReclaim) reclaim() {
	if n := c.r.busy.Load(); n != 0 {
		c.t.Errorf("reclaimed with %d calls in flight", n)
	}
	c.count.Add(1)
}

// waitReclaims polls until n reclaims ran.
func (c *countingReclaim) waitReclaims(n int64) {
	c.t.Helper()
	deadline := time.Now().Add(reclaimDeadline)
	for c.count.Load() < n {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d reclaims after %s; want %d", c.count.Load(), reclaimDeadline, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectReclaims checks that exactly n reclaims ran, after a quiet stretch.
func (c *countingReclaim) expectReclaims(n int64, during string) {
	c.t.Helper()
	time.Sleep(quietStretch)
	if got := c.count.Load(); got != n {
		c.t.Fatalf("%s: %d reclaims; want %d", during, got, n)
	}
}

// startTestReclaimer runs a reclaimer with a counting reclaim until the
// test ends, and checks that its goroutine ends with its context.
func startTestReclaimer(t *testing.T, r *reclaimer) *countingReclaim {
	t.Helper()
	c := &countingReclaim{t: t, r: r}
	r.reclaim, r.idle = c.reclaim, testReclaimIdle
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(reclaimDeadline):
			t.Error("the reclaimer did not end with its context")
		}
	})
	return c
}

func TestReclaimerOncePerBurstNeverDuringOne(t *testing.T) {
	r := newReclaimer(testReclaimIdle, nil, zap.NewNop())
	c := startTestReclaimer(t, r)
	c.expectReclaims(0, "idle from the start")

	// A call in flight holds reclaiming off, however long it lasts.
	end := r.begin(true)
	c.expectReclaims(0, "a call in flight")
	end()
	c.waitReclaims(1)
	c.expectReclaims(1, "idle after a burst")

	// A stream following a process does not hold it off while quiet, but
	// its messages are activity.
	endFollow := r.begin(false)
	stop := time.Now().Add(quietStretch)
	for time.Now().Before(stop) {
		r.active()
		time.Sleep(testReclaimIdle / 10)
	}
	if got := c.count.Load(); got != 1 {
		t.Fatalf("reclaimed while a stream moved messages: %d reclaims; want 1", got)
	}
	c.waitReclaims(2) // the stream, still open, went quiet
	endFollow()
	c.waitReclaims(3) // its end was activity too
	c.expectReclaims(3, "idle after the stream ended")

	// Many calls back to back are one burst.
	for i := 0; i < 50; i++ {
		r.begin(true)()
	}
	c.waitReclaims(4)
	c.expectReclaims(4, "idle after a burst of calls")
}

func TestReclaimerThroughServer(t *testing.T) {
	cfg := agentd.DefaultConfig()
	cfg.WorkspaceRoot = filepath.Join(t.TempDir(), "ws")
	cfg.ReapAll = false
	log := zap.NewNop()
	d, err := agentd.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
	})
	srv, err := New(d, []byte(testToken), false, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	c := startTestReclaimer(t, srv.reclaim)
	lis := bufServer(t, srv)
	client := bufClient(t, lis, testToken)
	ctx := context.Background()

	// Health checks are no activity: probes do not make it reclaim.
	for i := 0; i < 5; i++ {
		if err := client.Health(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.expectReclaims(0, "after health checks")

	// A transfer stalled longer than idle is still in flight.
	pr, pw := io.Pipe()
	written := make(chan error, 1)
	go func() {
		_, err := client.WriteFile(ctx, &agentdv1.WriteFileHeader{Path: "f.bin"}, pr)
		written <- err
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	c.expectReclaims(0, "during a stalled WriteFile")
	pw.Close()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	c.waitReclaims(1)

	// Execs back to back are one burst, reclaimed once it is over.
	for i := 0; i < 10; i++ {
		res, err := client.Exec(ctx, &agentdv1.ExecRequest{Spec: &agentdv1.ProcessSpec{Argv: []string{"true"}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Exit.GetExitCode() != 0 {
			t.Fatalf("true exited %d", res.Exit.GetExitCode())
		}
	}
	c.waitReclaims(2)
	c.expectReclaims(2, "idle after execs")
}

// TestFreeMemoryEmptiesThePool checks that reclaiming frees every buffer
// the daemon's pool held.
func TestFreeMemoryEmptiesThePool(t *testing.T) {
	var held []weak.Pointer[[]byte]
	var bufs []*[]byte
	for i := 0; i < 16; i++ {
		b := pool.Get(512 << 10)
		held, bufs = append(held, weak.Make(b)), append(bufs, b)
	}
	for _, b := range bufs {
		pool.Put(b)
	}
	freeMemory()
	for i, w := range held {
		if w.Value() != nil {
			t.Fatalf("pooled buffer %d still reachable after freeMemory", i)
		}
	}
	freeMemory() // with nothing pooled
}

// TestStartReclaimerStops checks that Run's reclaimer ends when stopped
// (and with its context), and that idle 0 starts none.
func TestStartReclaimerStops(t *testing.T) {
	srv := &Server{reclaim: newReclaimer(DefaultReclaimIdle, func() { t.Error("reclaimed") }, zap.NewNop())}
	srv.startReclaimer(context.Background(), 0)()
	stop := srv.startReclaimer(context.Background(), time.Hour)
	srv.reclaim.begin(true)() // a burst, whose reclaim is an hour away
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(reclaimDeadline):
		t.Fatal("stop did not end the reclaimer")
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop = srv.startReclaimer(ctx, time.Hour)
	cancel()
	stop() // returns once the goroutine ended with ctx
	stop() // and again
}
