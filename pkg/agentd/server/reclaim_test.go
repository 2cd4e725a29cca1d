package server

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// testReclaimIdle is the reclaimer's idle time in these tests; quiet
// stretches that must not reclaim are several times longer. Nothing is
// timed: a slow machine can only delay a reclaim, which the polls wait
// for up to reclaimDeadline.
const (
	testReclaimIdle = 50 * time.Millisecond
	quietStretch    = 10 * testReclaimIdle
)

// The tests of reclaiming under load use a longer idle time, so that a
// stall of the test process is not taken for the end of the load (the
// reclaim after a burst would then spoil their counts): the steady load is
// a quick call every loadPeriod, the lull awaited is loadLull, and the
// quiet stretches are three idle times.
const (
	testLoadIdle    = 400 * time.Millisecond
	loadPeriod      = 20 * time.Millisecond
	loadLull        = 10 * time.Millisecond
	reclaimDeadline = 30 * time.Second
)

// countingReclaim counts reclaims and fails the test if one runs while a
// call holds reclaiming off.
type countingReclaim struct {
	t     *testing.T
	r     *reclaimer
	quiet time.Duration // expectReclaims' quiet stretch
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
	time.Sleep(c.quiet)
	if got := c.count.Load(); got != n {
		c.t.Fatalf("%s: %d reclaims; want %d", during, got, n)
	}
}

// startTestReclaimer runs a reclaimer with a counting reclaim until the
// test ends, and checks that its goroutine ends with its context. It
// reclaims only after bursts: reclaiming under load, which depends on the
// test process's own memory, is off (see startLoadReclaimer).
func startTestReclaimer(t *testing.T, r *reclaimer) *countingReclaim {
	t.Helper()
	r.growth, r.minGain = 0, 0 // every burst counts, whatever the test process's memory does
	return runTestReclaimer(t, r, testReclaimIdle, quietStretch)
}

// fakeRetained is retained memory as the tests set it, growing by step at
// every reading.
type fakeRetained struct {
	n     atomic.Uint64
	step  uint64
	reads atomic.Int64
}

func (f *fakeRetained) retained() uint64 {
	f.reads.Add(1)
	return f.n.Add(f.step)
}

// startLoadReclaimer runs a reclaimer that also reclaims under load, once
// f grew by growth, at most every every, after a lull of loadLull.
func startLoadReclaimer(t *testing.T, r *reclaimer, f *fakeRetained, growth uint64, every time.Duration) *countingReclaim {
	t.Helper()
	r.growth, r.every, r.lull, r.retained = growth, every, loadLull, f.retained
	c := runTestReclaimer(t, r, testLoadIdle, 3*testLoadIdle)
	// The reclaimer took its baseline: what the test changes from here on
	// is growth.
	deadline := time.Now().Add(reclaimDeadline)
	for f.reads.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the reclaimer did not read its baseline")
		}
		time.Sleep(time.Millisecond)
	}
	return c
}

func runTestReclaimer(t *testing.T, r *reclaimer, idle, quiet time.Duration) *countingReclaim {
	t.Helper()
	c := &countingReclaim{t: t, r: r, quiet: quiet}
	r.reclaim, r.idle = c.reclaim, idle
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

// TestReclaimerSkipsABurstThatHardlyGrew checks that the end of a burst
// reclaims only once the runtime's memory grew by minGain since the last
// reclaim, and that small bursts add up to that.
func TestReclaimerSkipsABurstThatHardlyGrew(t *testing.T) {
	r := newReclaimer(testReclaimIdle, nil, zap.NewNop())
	f := &fakeRetained{}
	f.n.Store(10 << 20)
	r.retained, r.growth = f.retained, 0
	c := runTestReclaimer(t, r, testReclaimIdle, quietStretch)

	r.begin(true)()
	c.expectReclaims(0, "a burst that did not grow")
	f.n.Add(600 << 10)
	r.begin(true)()
	c.expectReclaims(0, "a burst that grew 600 KiB")
	f.n.Add(600 << 10) // 1.2 MiB since start-up in all
	r.begin(true)()
	c.waitReclaims(1)
	c.expectReclaims(1, "after bursts that grew 1.2 MiB in all")
	// The baseline is what the reclaim left.
	r.begin(true)()
	c.expectReclaims(1, "a burst that did not grow after a reclaim")
}

// steadyLoad is a daemon that is never idle for testLoadIdle: a quick call
// every loadPeriod (a stream following a process, so that a reclaim
// running as the next one starts is no error), until stop.
func steadyLoad(t *testing.T, r *reclaimer) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(loadPeriod)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			end := r.begin(false)
			r.active()
			end()
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-stopped }) }
	t.Cleanup(stop)
	return stop
}

// TestReclaimerUnderSteadyLoad checks that a daemon that is never idle
// still reclaims once its memory grew past the bound, again only after it
// grew again since, and not at all while it did not grow.
func TestReclaimerUnderSteadyLoad(t *testing.T) {
	r := newReclaimer(testLoadIdle, nil, zap.NewNop())
	f := &fakeRetained{}
	f.n.Store(10 << 20)
	c := startLoadReclaimer(t, r, f, 1<<20, testLoadIdle)
	stop := steadyLoad(t, r)

	f.n.Add(1<<20 - 1)
	c.expectReclaims(0, "steady load, growth below the bound")
	f.n.Add(1)
	c.waitReclaims(1)
	// The fake does not shrink on reclaiming: the memory is live, the new
	// baseline, and no reason to reclaim again.
	c.expectReclaims(1, "steady load, no growth since the last reclaim")
	f.n.Add(1 << 20)
	c.waitReclaims(2)

	// Once the load stops, the burst is over: the reclaim after it. (A
	// call after the last reclaim under load makes it a burst still
	// unreclaimed: stopping right after that reclaim, before the next
	// tick, would rightly leave nothing to reclaim.) It grew since the
	// last reclaim, or the end of the burst would not reclaim (minGain).
	f.n.Add(reclaimMinGain)
	end := r.begin(false)
	r.active()
	end()
	stop()
	c.waitReclaims(3)
}

// TestReclaimerUnderLoadIsRateLimited checks that however fast memory
// grows, reclaims under load are at least every apart.
func TestReclaimerUnderLoadIsRateLimited(t *testing.T) {
	const every = 2 * testLoadIdle
	r := newReclaimer(testLoadIdle, nil, zap.NewNop())
	start := time.Now()
	c := startLoadReclaimer(t, r, &fakeRetained{step: 1 << 20}, 1, every)
	steadyLoad(t, r)
	c.waitReclaims(3)
	got, elapsed := c.count.Load(), time.Since(start)
	if most := int64(elapsed / every); got > most {
		t.Fatalf("%d reclaims under load in %s; want at most one per %s", got, elapsed, every)
	}
}

// TestReclaimerUnderLoadNeverDuringATransfer checks that a call that holds
// reclaiming off (a transfer) holds off reclaiming under load too, however
// much memory grew, and that the reclaim comes once it is over.
func TestReclaimerUnderLoadNeverDuringATransfer(t *testing.T) {
	r := newReclaimer(testLoadIdle, nil, zap.NewNop())
	f := &fakeRetained{}
	c := startLoadReclaimer(t, r, f, 1<<20, testLoadIdle)
	end := r.begin(true)
	steadyLoad(t, r)
	f.n.Store(64 << 20)
	c.expectReclaims(0, "under load with a transfer in flight") // countingReclaim also fails a reclaim with it in flight
	end()
	c.waitReclaims(1) // under load, the transfer over
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
	// The longer idle time of the load tests: ten Execs back to back
	// must be one burst even when a loaded machine stalls this process
	// between two of them for longer than testReclaimIdle (CI saw three
	// reclaims).
	srv.reclaim.growth, srv.reclaim.minGain = 0, 0
	c := runTestReclaimer(t, srv.reclaim, testLoadIdle, 3*testLoadIdle)
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
		_, err := client.WriteFile(ctx, "f.bin", agentclient.WriteFileOptions{}, pr)
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
		res, err := client.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"true"}}, agentclient.ExecOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Exit.ExitCode != 0 {
			t.Fatalf("true exited %d", res.Exit.ExitCode)
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
	srv.startReclaimer(context.Background(), 0, DefaultReclaimGrowth)()
	stop := srv.startReclaimer(context.Background(), time.Hour, 123)
	srv.reclaim.begin(true)() // a burst, whose reclaim is an hour away
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(reclaimDeadline):
		t.Fatal("stop did not end the reclaimer")
	}
	if srv.reclaim.growth != 123 {
		t.Fatalf("growth %d after startReclaimer(..., 123)", srv.reclaim.growth)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop = srv.startReclaimer(ctx, time.Hour, 0)
	cancel()
	stop() // returns once the goroutine ended with ctx
	stop() // and again
}
