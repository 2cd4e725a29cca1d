package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestOutputLogLanding(t *testing.T) {
	// Reads landing straight in the ring keep exactly what append would,
	// never alias a retained byte, and bound the storage to max+land.
	for _, max := range []int{1, 7, 100, 4096, 100_000, 1 << 20} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(max), 2))
			l := newOutputLog(max)
			md := &model{}
			for i := range 400 {
				s := Stream(1 + rng.IntN(2))
				want := 1 + rng.IntN(2*l.land)
				dst := l.landing(want)
				if len(dst) == 0 || len(dst) > want {
					t.Fatalf("step %d: landing(%d) gave %d bytes", i, want, len(dst))
				}
				before := append([]byte(nil), md.data[l.start:]...)
				n := rng.IntN(len(dst) + 1)
				for j := range dst[:n] {
					dst[j] = byte(rng.Uint32())
				}
				// The retained bytes are intact whatever landed.
				chunks, _, _ := l.read(l.start, max)
				var got []byte
				for _, c := range chunks {
					got = append(got, c.Data...)
				}
				if !bytes.Equal(got, before) {
					t.Fatalf("step %d: a landing slice aliases retained bytes", i)
				}
				l.commit(s, n)
				md.append(s, dst[:n])
				if l.end != int64(len(md.data)) || l.end-l.start > int64(max) || len(l.buf) > max+l.land {
					t.Fatalf("step %d: start %d end %d cap %d", i, l.start, l.end, len(l.buf))
				}
				if l.end-l.start < int64(min(max, len(md.data))) && len(l.segs)-l.segHead < l.maxSegs {
					t.Fatalf("step %d: retains %d bytes of %d (max %d)", i, l.end-l.start, len(md.data), max)
				}
				if i%5 == 0 { // mixed with appends (the first read of a pump)
					p := make([]byte, rng.IntN(max/4+2))
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
					l.append(s, p)
					md.append(s, p)
				}
				if i%37 == 0 {
					checkRead(t, l, md, 0, 1+max/50+rng.IntN(max+10))
				}
			}
			checkRead(t, l, md, 0, 1+max/3)
			l.seal()
			checkRead(t, l, md, 0, max)
			if l.commit(Stdout, 1) {
				t.Error("commit after seal was recorded")
			}
		})
	}
}

// follow attaches from offset 0 and checks every chunk against the output
// of `yes 0123456789abcde` (16-byte lines). slow is called before each
// delivery.
func follow(ctx context.Context, m *Manager, id string, slow func(call int)) (got, dropped int64, exit ExitStatus, err error) {
	const line = "0123456789abcde\n"
	call := 0
	err = m.Attach(ctx, id, 0, func(r ReadResult) error {
		if slow != nil {
			slow(call)
		}
		call++
		dropped += r.Dropped
		for _, c := range r.Chunks {
			if c.Offset != got+dropped {
				return fmt.Errorf("chunk at %d, want %d", c.Offset, got+dropped)
			}
			for i := 0; i < len(c.Data); {
				k := int((c.Offset + int64(i)) % int64(len(line)))
				n := min(len(line)-k, len(c.Data)-i)
				if string(c.Data[i:i+n]) != line[k:k+n] {
					return fmt.Errorf("output corrupted at %d", c.Offset+int64(i))
				}
				i += n
			}
			got += int64(len(c.Data))
		}
		if r.Exit != nil {
			exit = *r.Exit
		}
		return nil
	})
	return got, dropped, exit, err
}

func TestAttachFlowControlLosesNothing(t *testing.T) {
	size := int64(256 << 20)
	if testing.Short() || raceEnabled {
		size = 32 << 20
	}
	// A ring far smaller than the output: without flow control nearly all
	// of it would be dropped.
	m := newTestManager(t, Config{OutputBufferBytes: 64 << 10})
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("yes 0123456789abcde | head -c %d", size), HoldOutput: true})
	var wg sync.WaitGroup
	// Two followers; the slower one sets the pace.
	ctx := testCtx(t)
	wg.Go(func() {
		got, dropped, exit, err := follow(ctx, m, info.ID, nil)
		if err != nil || got != size || dropped != 0 || exit.Code != 0 {
			t.Errorf("fast follower: got %d, dropped %d, exit %+v, %v", got, dropped, exit, err)
		}
	})
	got, dropped, exit, err := follow(ctx, m, info.ID, func(call int) {
		if call%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	})
	if err != nil || got != size || dropped != 0 || exit.Code != 0 {
		t.Errorf("slow follower: got %d, dropped %d, exit %+v, %v", got, dropped, exit, err)
	}
	wg.Wait()
}

func TestAttachFlowControlSegments(t *testing.T) {
	// Alternating tiny writes to stdout and stderr fill the segment index
	// long before the bytes fill the ring; a slow follower still loses
	// nothing.
	m := newTestManager(t, Config{OutputBufferBytes: 4 << 10}) // 64 segments
	info := mustStart(t, m, StartOptions{Command: "i=0; while [ $i -lt 3000 ]; do echo o; echo e >&2; i=$((i+1)); done", HoldOutput: true})
	var stdout, stderr, dropped int
	calls := 0
	err := m.Attach(testCtx(t), info.ID, 0, func(r ReadResult) error {
		if calls++; calls%4 == 1 {
			time.Sleep(2 * time.Millisecond)
		}
		dropped += int(r.Dropped)
		for _, c := range r.Chunks {
			if c.Stream == Stdout {
				stdout += bytes.Count(c.Data, []byte("o\n"))
			} else {
				stderr += bytes.Count(c.Data, []byte("e\n"))
			}
		}
		return nil
	})
	if err != nil || dropped != 0 || stdout != 3000 || stderr != 3000 {
		t.Fatalf("dropped %d, stdout %d lines, stderr %d lines, %v", dropped, stdout, stderr, err)
	}
}

func TestStalledFollowerStopsHoldingBack(t *testing.T) {
	const size = 4 << 20
	m := newTestManager(t, Config{OutputBufferBytes: 64 << 10, FollowerStallTimeout: 200 * time.Millisecond})
	ctx := testCtx(t)
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("yes 0123456789abcde | head -c %d", size)})
	release := make(chan struct{})
	type result struct {
		got, dropped int64
		exit         ExitStatus
		err          error
	}
	done := make(chan result, 1)
	go func() {
		got, dropped, exit, err := follow(ctx, m, info.ID, func(call int) {
			if call == 0 {
				<-release // a client that stopped reading
			}
		})
		done <- result{got, dropped, exit, err}
	}()
	// The process finishes although the follower is stuck.
	start := time.Now()
	e, err := m.Wait(ctx, info.ID)
	if err != nil || e.Code != 0 {
		t.Fatalf("Wait = %+v, %v", e, err)
	}
	if elapsed := time.Since(start); elapsed < 200*time.Millisecond {
		t.Errorf("the process finished after %v, before the stall timeout: it was not held back", elapsed)
	}
	close(release)
	r := <-done
	if r.err != nil || r.dropped == 0 || r.got+r.dropped != size || r.exit.Code != 0 {
		t.Fatalf("stalled follower: got %d, dropped %d, exit %+v, %v", r.got, r.dropped, r.exit, r.err)
	}
	// A reader from the start now sees the loss too.
	rr, err := m.Read(ctx, info.ID, 0, 0, 1)
	if err != nil || rr.Dropped == 0 {
		t.Fatalf("Read from 0 = %+v, %v", rr, err)
	}
}

func TestStalledFollowerHoldsBackAgainOnceItReads(t *testing.T) {
	m := newTestManager(t, Config{OutputBufferBytes: 64 << 10, FollowerStallTimeout: 100 * time.Millisecond})
	// 100 bursts of 64 KiB, 10 ms apart.
	const total = 100 * 65536
	info := mustStart(t, m, StartOptions{Command: "i=0; while [ $i -lt 100 ]; do yes 0123456789abcde | head -c 65536; sleep 0.01; i=$((i+1)); done"})
	// Stuck long enough to stall once, then fast again: only output
	// produced while it was stalled is lost.
	got, dropped, exit, err := follow(testCtx(t), m, info.ID, func(call int) {
		if call == 3 {
			time.Sleep(400 * time.Millisecond)
		}
	})
	if err != nil || got+dropped != total || dropped == 0 || dropped > total/2 || exit.Code != 0 {
		t.Fatalf("got %d, dropped %d, exit %+v, %v", got, dropped, exit, err)
	}
}

func TestKillWhilePumpIsHeld(t *testing.T) {
	m := newTestManager(t, Config{OutputBufferBytes: 64 << 10, FollowerStallTimeout: time.Hour})
	ctx := testCtx(t)
	info := mustStart(t, m, StartOptions{Argv: []string{"yes", "0123456789abcde"}, HoldOutput: true})
	release := make(chan struct{})
	var dropped int64
	attached := make(chan error, 1)
	var calls atomic.Int32
	go func() {
		var exit ExitStatus
		var err error
		_, dropped, exit, err = follow(ctx, m, info.ID, func(call int) {
			calls.Add(1)
			if call == 1 {
				<-release
			}
		})
		if err == nil && exit.Signal != "SIGKILL" {
			err = fmt.Errorf("exit %+v", exit)
		}
		attached <- err
	}()
	eventually(t, 5*time.Second, "the follower to block", func() bool { return calls.Load() == 2 })
	// The pump waits for the follower and yes blocks on its full pipe;
	// it can still be killed, and the exit is reported once the follower
	// took the rest of the output.
	if err := m.Signal(info.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "yes to die", func() bool { return !alive(info.PID) })
	close(release)
	e, err := m.Wait(ctx, info.ID)
	if err != nil || e.Signal != "SIGKILL" {
		t.Fatalf("Wait = %+v, %v", e, err)
	}
	if err := <-attached; err != nil {
		t.Fatal(err)
	}
	if dropped != 0 {
		t.Errorf("the follower lost %d bytes", dropped)
	}
}

func TestShutdownWhilePumpIsHeld(t *testing.T) {
	if r, err := NewReaper(ReaperOptions{}, nil); err == nil { // the os/signal watcher
		r.Close()
	}
	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	m, err := NewManager(Config{OutputBufferBytes: 64 << 10, FollowerStallTimeout: time.Hour}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	info := mustStart(t, m, StartOptions{Argv: []string{"yes", "0123456789abcde"}})
	release := make(chan struct{})
	var calls atomic.Int32
	attached := make(chan error, 1)
	go func() {
		attached <- m.Attach(context.Background(), info.ID, 0, func(r ReadResult) error {
			if calls.Add(1) == 2 {
				<-release
			}
			return nil
		})
	}()
	eventually(t, 5*time.Second, "the follower to block", func() bool { return calls.Load() == 2 })
	// A stuck follower (with no stall timeout to speak of) does not keep
	// Shutdown from killing the process and reporting its exit.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	close(release)
	if err := <-attached; err != nil {
		t.Fatalf("Attach after Shutdown: %v", err)
	}
	eventually(t, 5*time.Second, "goroutines and fds to be released", func() bool {
		return runtime.NumGoroutine() <= goroutines && openFDs(t) <= fds
	})
}

func TestNoFollowerNeverBlocks(t *testing.T) {
	// Read (polling) and a follower that detached do not hold a process
	// back: it runs to the end with a tiny ring.
	m := newTestManager(t, Config{OutputBufferBytes: 4 << 10, FollowerStallTimeout: time.Hour})
	ctx := testCtx(t)
	info := mustStart(t, m, StartOptions{Command: "yes 0123456789abcde | head -c 8388608"})
	errStop := errors.New("stop")
	if err := m.Attach(ctx, info.ID, 0, func(ReadResult) error { return errStop }); err != errStop {
		t.Fatalf("Attach = %v", err)
	}
	if _, err := m.Read(ctx, info.ID, 0, 0, 10); err != nil {
		t.Fatal(err)
	}
	if e, err := m.Wait(ctx, info.ID); err != nil || e.Code != 0 {
		t.Fatalf("Wait = %+v, %v", e, err)
	}
	r, err := m.Read(ctx, info.ID, 0, 0, 0)
	if err != nil || r.Dropped != 8<<20-4<<10 {
		t.Fatalf("Read after exit = dropped %d, %v", r.Dropped, err)
	}
}

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.Bytes()
}

func TestLentOutputSurvivesStall(t *testing.T) {
	// Attach hands out bytes straight from the ring. A follower that
	// stalls while it still holds them must keep seeing them unchanged
	// although the process runs on and the ring wraps many times.
	const n = 300000
	want := seqOutput(n)
	m := newTestManager(t, Config{OutputBufferBytes: 64 << 10, FollowerStallTimeout: 100 * time.Millisecond})
	ctx := testCtx(t)
	info := mustStart(t, m, StartOptions{Argv: []string{"seq", "1", fmt.Sprint(n)}})
	var held []Chunk
	var got bytes.Buffer
	var dropped int64
	err := m.Attach(ctx, info.ID, 0, func(r ReadResult) error {
		if held == nil {
			held = append([]Chunk(nil), r.Chunks...)
			// Stuck until the process is done: it must have stalled.
			if _, err := m.Wait(ctx, info.ID); err != nil {
				return err
			}
			for _, c := range held {
				if !bytes.Equal(c.Data, want[c.Offset:c.Offset+int64(len(c.Data))]) {
					return fmt.Errorf("lent bytes at %d changed while the follower was stalled", c.Offset)
				}
			}
		}
		dropped += r.Dropped
		for _, c := range r.Chunks {
			if got.Len()+int(dropped) != int(c.Offset) || !bytes.Equal(c.Data, want[c.Offset:c.Offset+int64(len(c.Data))]) {
				return fmt.Errorf("chunk at %d is wrong", c.Offset)
			}
			got.Write(c.Data)
		}
		return nil
	})
	if err != nil || dropped == 0 || int64(got.Len())+dropped != int64(len(want)) {
		t.Fatalf("got %d, dropped %d of %d: %v", got.Len(), dropped, len(want), err)
	}
}

func TestLentOutputSurvivesShutdown(t *testing.T) {
	// Shutdown stops all holding back at once; bytes still lent to a
	// follower stay intact while the pumps drain what is left.
	want := seqOutput(400000)
	m, err := NewManager(Config{OutputBufferBytes: 4 << 10, FollowerStallTimeout: time.Hour}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	info := mustStart(t, m, StartOptions{Argv: []string{"seq", "1", "400000"}})
	shut := make(chan error, 1)
	calls := 0
	err = m.Attach(testCtx(t), info.ID, 0, func(r ReadResult) error {
		if calls++; calls == 5 { // the ring has its full size by now
			held := append([]Chunk(nil), r.Chunks...)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				shut <- m.Shutdown(ctx)
			}()
			if err := <-shut; err != nil {
				return err
			}
			for _, c := range held {
				if !bytes.Equal(c.Data, want[c.Offset:c.Offset+int64(len(c.Data))]) {
					return fmt.Errorf("lent bytes at %d changed during Shutdown", c.Offset)
				}
			}
		}
		for _, c := range r.Chunks {
			if !bytes.Equal(c.Data, want[c.Offset:c.Offset+int64(len(c.Data))]) {
				return fmt.Errorf("chunk at %d is wrong", c.Offset)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHoldOutputKeepsEverythingUntilAttach(t *testing.T) {
	// With HoldOutput, output written before the follower attaches is held
	// for it, however late (within the stall timeout) it comes.
	const size = 4 << 20
	m := newTestManager(t, Config{OutputBufferBytes: 64 << 10, FollowerStallTimeout: time.Minute})
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("yes 0123456789abcde | head -c %d", size), HoldOutput: true})
	time.Sleep(200 * time.Millisecond) // without the hold, the ring would wrap many times by now
	got, dropped, exit, err := follow(testCtx(t), m, info.ID, nil)
	if err != nil || dropped != 0 || got != size || exit.Code != 0 {
		t.Fatalf("got %d, dropped %d, exit %+v, %v", got, dropped, exit, err)
	}
	// Without it, the same late follower loses output: the test can tell.
	info = mustStart(t, m, StartOptions{Command: fmt.Sprintf("yes 0123456789abcde | head -c %d", size)})
	if _, err := m.Wait(testCtx(t), info.ID); err != nil {
		t.Fatal(err)
	}
	_, dropped, _, err = follow(testCtx(t), m, info.ID, nil)
	if err != nil || dropped == 0 {
		t.Fatalf("without HoldOutput: dropped %d, %v", dropped, err)
	}
}
