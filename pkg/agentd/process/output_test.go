package process

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// model is the reference: every byte ever appended, with its stream.
type model struct {
	data    []byte
	streams []Stream
}

func (md *model) append(s Stream, p []byte) {
	md.data = append(md.data, p...)
	for range p {
		md.streams = append(md.streams, s)
	}
}

// checkRead reads l from cursor in pieces of maxBytes and compares against
// the model's retained tail.
func checkRead(t *testing.T, l *outputLog, md *model, cursor int64, maxBytes int) {
	t.Helper()
	first := true
	for cursor < l.end {
		chunks, next, dropped := l.read(cursor, maxBytes)
		if first && cursor < l.start {
			if dropped != l.start-cursor {
				t.Fatalf("dropped = %d, want %d", dropped, l.start-cursor)
			}
			cursor = l.start
		} else if dropped != 0 {
			t.Fatalf("unexpected drop %d at %d", dropped, cursor)
		}
		first = false
		off := cursor
		for i, c := range chunks {
			if c.Offset != off {
				t.Fatalf("chunk offset %d, want %d", c.Offset, off)
			}
			if !bytes.Equal(c.Data, md.data[off:off+int64(len(c.Data))]) {
				t.Fatalf("data mismatch at %d", off)
			}
			for j := range c.Data {
				if md.streams[off+int64(j)] != c.Stream {
					t.Fatalf("byte %d has stream %v, want %v", off+int64(j), c.Stream, md.streams[off+int64(j)])
				}
			}
			if i > 0 && chunks[i-1].Stream == c.Stream {
				t.Fatalf("adjacent chunks of the same stream")
			}
			off += int64(len(c.Data))
		}
		if next != off || next-cursor > int64(maxBytes) || next == cursor {
			t.Fatalf("next = %d after reading [%d,%d) with max %d", next, cursor, off, maxBytes)
		}
		cursor = next
	}
}

func TestOutputLogRandomized(t *testing.T) {
	for _, max := range []int{1, 7, 100, 4096, 100_000} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(max), 1))
			l := newOutputLog(max)
			md := &model{}
			for i := range 200 {
				s := Stream(1 + rng.IntN(2))
				p := make([]byte, rng.IntN(3*max/2+2))
				for j := range p {
					p[j] = byte(rng.Uint32())
				}
				l.append(s, p)
				md.append(s, p)
				if l.end != int64(len(md.data)) || l.end-l.start > int64(max) || len(l.buf) > max {
					t.Fatalf("step %d: start %d end %d cap %d", i, l.start, l.end, len(l.buf))
				}
				if i%37 == 0 {
					checkRead(t, l, md, 0, 1+max/50+rng.IntN(max+10))
				}
			}
			checkRead(t, l, md, 0, 1+max/3)
			checkRead(t, l, md, l.start+int64(rng.IntN(int(l.end-l.start)+1)), max)
			l.seal()
			if len(l.buf) != int(l.end-l.start) {
				t.Errorf("sealed ring keeps %d bytes for %d", len(l.buf), l.end-l.start)
			}
			checkRead(t, l, md, 0, max)
			if l.append(Stdout, []byte("late")) {
				t.Error("append after seal was recorded")
			}
		})
	}
}

func TestOutputLogSegmentBound(t *testing.T) {
	// Alternating one-byte writes cannot grow the segment index beyond its
	// bound: the oldest segments are dropped with their bytes.
	l := newOutputLog(1 << 20)
	md := &model{}
	for i := range 100_000 {
		s := Stdout
		if i%2 == 1 {
			s = Stderr
		}
		l.append(s, []byte{byte(i)})
		md.append(s, []byte{byte(i)})
	}
	if live := len(l.segs) - l.segHead; live > l.maxSegs {
		t.Fatalf("%d live segments, bound %d", live, l.maxSegs)
	}
	if cap(l.segs) > 4*l.maxSegs {
		t.Fatalf("segment slice capacity %d for bound %d", cap(l.segs), l.maxSegs)
	}
	if l.start == 0 {
		t.Fatal("no bytes were dropped with their segments")
	}
	checkRead(t, l, md, 0, 1000)
}

func TestOutputLogGrowsLazily(t *testing.T) {
	l := newOutputLog(4 << 20)
	l.append(Stdout, []byte("hi"))
	if len(l.buf) > initialOutputCap {
		t.Fatalf("a 2-byte output allocated %d bytes", len(l.buf))
	}
	l.seal()
	if len(l.buf) != 2 {
		t.Fatalf("sealed buffer %d bytes", len(l.buf))
	}
}

func TestReadSemantics(t *testing.T) {
	m := newTestManager(t, Config{})
	ctx := testCtx(t)
	info := mustStart(t, m, StartOptions{Command: "printf 0123456789; read x; printf abc", Stdin: true})
	// Wait for the first output.
	r, err := m.Read(ctx, info.ID, 0, 10*time.Second, 4)
	if err != nil {
		t.Fatal(err)
	}
	if r.NextCursor > 4 || len(r.Chunks) == 0 || r.Exited || r.Exit != nil {
		t.Fatalf("first read = %+v", r)
	}
	eventually(t, 5*time.Second, "all ten bytes", func() bool {
		r, err = m.Read(ctx, info.ID, 10, 0, 0)
		return err == nil && r.NextCursor == 10
	})
	// Replay from the start after a "reconnect".
	r, err = m.Read(ctx, info.ID, 2, 0, 5)
	if err != nil || len(r.Chunks) != 1 || string(r.Chunks[0].Data) != "23456" || r.Chunks[0].Offset != 2 || r.NextCursor != 7 {
		t.Fatalf("replay read = %+v, %v", r, err)
	}
	// Nothing new: a yield elapses with an empty result.
	start := time.Now()
	r, err = m.Read(ctx, info.ID, 10, 150*time.Millisecond, 0)
	if err != nil || len(r.Chunks) != 0 || r.NextCursor != 10 || r.Exited {
		t.Fatalf("idle read = %+v, %v", r, err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Errorf("idle read returned before its yield")
	}
	// A canceled context ends a long wait.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = m.Read(cctx, info.ID, 10, time.Hour, 0)
	cancel()
	wantErr(t, err, errkind.ErrDeadlineExceeded)
	// A waiting reader is woken by new output.
	go func() {
		time.Sleep(50 * time.Millisecond)
		m.WriteStdin(ctx, info.ID, 0, []byte("\n"))
	}()
	r, err = m.Read(ctx, info.ID, 10, time.Hour, 0)
	if err != nil || len(r.Chunks) == 0 {
		t.Fatalf("woken read = %+v, %v", r, err)
	}
	_, err = m.Read(ctx, info.ID, 1000, 0, 0)
	wantErr(t, err, errkind.ErrConflict, "1000")
	_, err = m.Read(ctx, info.ID, -1, 0, 0)
	wantErr(t, err, errkind.ErrInvalidArgument)

	if _, err := m.Wait(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	// After exit: reading the tail gives Exit only at the end.
	r, err = m.Read(ctx, info.ID, 0, time.Hour, 5)
	if err != nil || !r.Exited || r.Exit != nil || r.NextCursor != 5 {
		t.Fatalf("partial read after exit = %+v, %v", r, err)
	}
	r, err = m.Read(ctx, info.ID, 5, time.Hour, 0)
	if err != nil || !r.Exited || r.Exit == nil || r.NextCursor != 13 || string(r.Chunks[0].Data) != "56789abc" {
		t.Fatalf("final read = %+v, %v", r, err)
	}
	r, err = m.Read(ctx, info.ID, 13, time.Hour, 0)
	if err != nil || r.Exit == nil || len(r.Chunks) != 0 {
		t.Fatalf("read at end after exit = %+v, %v", r, err)
	}
}

func TestDroppedAccounting(t *testing.T) {
	const bufSize = 64 << 10
	m := newTestManager(t, Config{OutputBufferBytes: bufSize})
	info := mustStart(t, m, StartOptions{Command: "head -c 1048576 /dev/zero; printf END"})
	if _, err := m.Wait(testCtx(t), info.ID); err != nil {
		t.Fatal(err)
	}
	total := int64(1<<20 + 3)
	o := collect(t, m, info.ID)
	if o.dropped != total-bufSize || int64(o.stdout.Len()) != bufSize || !strings.HasSuffix(o.stdout.String(), "END") {
		t.Fatalf("dropped %d, kept %d", o.dropped, o.stdout.Len())
	}
	// A reader in the middle of the retained window loses nothing.
	r, err := m.Read(testCtx(t), info.ID, total-100, 0, 0)
	if err != nil || r.Dropped != 0 || r.NextCursor != total || r.Exit == nil {
		t.Fatalf("tail read = %+v, %v", r, err)
	}
}

// heapSampler records the peak HeapInuse while it runs.
type heapSampler struct {
	stop chan struct{}
	done chan uint64
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan uint64)}
	go func() {
		var peak uint64
		var ms runtime.MemStats
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-h.stop:
				h.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) peak() uint64 { close(h.stop); return <-h.done }

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func TestMemoryBoundedUnderFlood(t *testing.T) {
	testenv.Short(t, "moves a gigabyte through a pipe")
	const bufSize = DefaultOutputBufferBytes
	m := newTestManager(t, Config{})
	base := heapInuse()
	h := sampleHeap()

	// `yes` for a while, with a slow reader following it ...
	yes := mustStart(t, m, StartOptions{Argv: []string{"yes", "bulkhead"}, Timeout: 1500 * time.Millisecond})
	// ... and 1 GiB through stdout with no reader at all.
	const gig = 1 << 30
	head := mustStart(t, m, StartOptions{Argv: []string{"head", "-c", fmt.Sprint(gig), "/dev/zero"}})
	var wg sync.WaitGroup
	var yesDropped, yesEnd int64
	wg.Go(func() {
		ctx := testCtx(t)
		var cursor int64
		for {
			r, err := m.Read(ctx, yes.ID, cursor, time.Second, 64<<10)
			if err != nil {
				t.Error(err)
				return
			}
			yesDropped += r.Dropped
			for _, c := range r.Chunks {
				if !bytes.HasPrefix(c.Data, []byte("bulkhead\n")[c.Offset%9:]) {
					t.Errorf("yes output corrupted at %d", c.Offset)
					return
				}
			}
			cursor = r.NextCursor
			if r.Exit != nil {
				yesEnd = cursor
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	e, err := m.Wait(testCtx(t), head.ID)
	if err != nil || e.Code != 0 {
		t.Fatalf("head exit = %+v, %v", e, err)
	}
	wg.Wait()
	peak := h.peak()

	r, err := m.Read(testCtx(t), head.ID, 0, 0, 1)
	if err != nil || r.Dropped != gig-bufSize || r.NextCursor != gig-bufSize+1 {
		t.Fatalf("1 GiB read from 0: dropped %d next %d, %v", r.Dropped, r.NextCursor, err)
	}
	if yesEnd <= bufSize || yesDropped == 0 {
		t.Errorf("yes produced %d bytes, reader lost %d: the test did not flood", yesEnd, yesDropped)
	}
	grew := int64(peak) - int64(base)
	t.Logf("heap: base %d MiB, peak %d MiB (+%d MiB); yes wrote %d MiB, reader lost %d MiB",
		base>>20, peak>>20, grew>>20, yesEnd>>20, yesDropped>>20)
	// Two rings of bufSize (+ the pump's read-ahead) are live; the garbage
	// collector may let the heap reach about twice the live size before it
	// runs. 10 buffers is far below the 1 GiB+ written, so growth with the
	// output would still fail here.
	if limit := int64(10 * bufSize); grew > limit {
		t.Errorf("heap grew by %d bytes, more than %d (a few buffers)", grew, limit)
	}
}
