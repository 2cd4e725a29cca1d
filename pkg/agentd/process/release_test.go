package process

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestOutputLogDrop(t *testing.T) {
	l := newOutputLog(64)
	l.append(Stdout, bytes.Repeat([]byte("o"), 50))
	l.append(Stderr, bytes.Repeat([]byte("e"), 50)) // wraps: 36 bytes dropped already
	l.seal()
	l.drop()
	if l.buf != nil || l.start != 100 || l.end != 100 || len(l.segs) != 0 {
		t.Fatalf("after drop: %d bytes stored, [%d,%d), %d segments", len(l.buf), l.start, l.end, len(l.segs))
	}
	for _, cursor := range []int64{0, 40, 99, 100} {
		chunks, next, dropped := l.read(cursor, 1<<20)
		if len(chunks) != 0 || next != 100 || dropped != 100-cursor {
			t.Errorf("read(%d) = %d chunks, next %d, dropped %d", cursor, len(chunks), next, dropped)
		}
		chunks, next, dropped = l.view(cursor, 1<<20, nil)
		if len(chunks) != 0 || next != 100 || dropped != 100-cursor {
			t.Errorf("view(%d) = %d chunks, next %d, dropped %d", cursor, len(chunks), next, dropped)
		}
	}
	if l.append(Stdout, []byte("x")) || l.commit(Stdout, 1) || l.end != 100 {
		t.Fatal("a dropped (sealed) log recorded more output")
	}
}

// attachAll follows id from cursor with opts and returns the output bytes
// delivered, the bytes reported dropped and the exit.
func attachAll(t *testing.T, m *Manager, id string, cursor int64, opts AttachOptions, first func()) (got, dropped int64, exit *ExitStatus) {
	t.Helper()
	calls := 0
	err := m.AttachWith(testCtx(t), id, cursor, opts, func(r ReadResult) error {
		if calls++; calls == 1 && first != nil {
			first()
		}
		dropped += r.Dropped
		for _, c := range r.Chunks {
			got += int64(len(c.Data))
		}
		exit = r.Exit
		return nil
	})
	if err != nil {
		t.Errorf("Attach %s from %d: %v", id, cursor, err)
	}
	return got, dropped, exit
}

// retained reports how many bytes of p's output are kept, and the ring's
// storage.
func retained(t *testing.T, m *Manager, id string) (kept int64, storage int) {
	t.Helper()
	p, err := m.lookup("test", id)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.end - p.out.start, len(p.out.buf)
}

func TestReleaseAtExitFreesDeliveredOutput(t *testing.T) {
	// As Exec: HoldOutput, then a follower from 0 that releases the output
	// once it delivered the exit.
	const size = 100_000
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("head -c %d /dev/zero", size), HoldOutput: true})
	got, dropped, exit := attachAll(t, m, info.ID, 0, AttachOptions{ReleaseAtExit: true}, nil)
	if got != size || dropped != 0 || exit == nil || exit.Code != 0 {
		t.Fatalf("releasing follower: got %d, dropped %d, exit %+v", got, dropped, exit)
	}
	if kept, storage := retained(t, m, info.ID); kept != 0 || storage != 0 {
		t.Fatalf("after the exit was delivered: %d bytes kept in %d bytes of storage", kept, storage)
	}
	// Later readers get no bytes, the freed ones as dropped, and the exit.
	for _, cursor := range []int64{0, size / 2, size} {
		r, err := m.Read(testCtx(t), info.ID, cursor, 0, 0)
		if err != nil || len(r.Chunks) != 0 || r.Dropped != size-cursor || r.NextCursor != size || r.Exit == nil || r.Exit.Code != 0 {
			t.Fatalf("Read from %d after release = %+v, %v", cursor, r, err)
		}
		got, dropped, exit := attachAll(t, m, info.ID, cursor, AttachOptions{}, nil)
		if got != 0 || dropped != size-cursor || exit == nil {
			t.Fatalf("Attach from %d after release: got %d, dropped %d, exit %+v", cursor, got, dropped, exit)
		}
	}
	// The process itself is still known with its exit.
	if in, err := m.Get(info.ID); err != nil || in.Running || in.Exit == nil {
		t.Fatalf("Get after release = %+v, %v", in, err)
	}
	if e, err := m.Wait(testCtx(t), info.ID); err != nil || e.Code != 0 {
		t.Fatalf("Wait after release = %+v, %v", e, err)
	}
}

func TestReleaseAtExitKeepsOutputForAnotherFollower(t *testing.T) {
	const size = 100_000
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("read x; head -c %d /dev/zero", size), Stdin: true})
	p, err := m.lookup("test", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The other follower attaches and then, at its first delivery, waits
	// until the releasing one has delivered the exit.
	released := make(chan struct{})
	var wg sync.WaitGroup
	var otherGot, otherDropped int64
	var otherExit *ExitStatus
	wg.Go(func() {
		otherGot, otherDropped, otherExit = attachAll(t, m, info.ID, 0, AttachOptions{}, func() { <-released })
	})
	eventually(t, 5*time.Second, "the other follower", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.followers) == 1
	})
	wg.Go(func() {
		defer close(released)
		got, dropped, exit := attachAll(t, m, info.ID, 0, AttachOptions{ReleaseAtExit: true}, nil)
		if got != size || dropped != 0 || exit == nil {
			t.Errorf("releasing follower: got %d, dropped %d, exit %+v", got, dropped, exit)
		}
		if kept, _ := retained(t, m, info.ID); kept != size {
			t.Errorf("with another follower attached, %d bytes kept, want %d", kept, size)
		}
	})
	eventually(t, 5*time.Second, "both followers", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.followers) == 2
	})
	if _, err := m.WriteStdin(testCtx(t), info.ID, 0, []byte("\n")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if otherGot != size || otherDropped != 0 || otherExit == nil {
		t.Fatalf("other follower: got %d, dropped %d, exit %+v", otherGot, otherDropped, otherExit)
	}
	if r, err := m.Read(testCtx(t), info.ID, 0, 0, size); err != nil || r.Dropped != 0 || r.NextCursor != size || r.Exit == nil {
		t.Fatalf("Read from 0 afterwards = dropped %d, next %d, exit %v, %v", r.Dropped, r.NextCursor, r.Exit, err)
	}
}

func TestReleaseAtExitKeepsOutputForPendingReservation(t *testing.T) {
	// A follower not from 0 does not take over HoldOutput's reservation,
	// which still waits for its reader: the output is kept for it.
	const size = 100_000
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("head -c %d /dev/zero", size), HoldOutput: true})
	if _, err := m.Wait(testCtx(t), info.ID); err != nil {
		t.Fatal(err)
	}
	got, _, exit := attachAll(t, m, info.ID, 10, AttachOptions{ReleaseAtExit: true}, nil)
	if got != size-10 || exit == nil {
		t.Fatalf("releasing follower from 10: got %d, exit %+v", got, exit)
	}
	if kept, _ := retained(t, m, info.ID); kept != size {
		t.Fatalf("with the reservation pending, %d bytes kept, want %d", kept, size)
	}
	got, dropped, _ := attachAll(t, m, info.ID, 0, AttachOptions{}, nil)
	if got != size || dropped != 0 {
		t.Fatalf("the reserved reader: got %d, dropped %d", got, dropped)
	}
}

func TestStartedProcessKeepsOutput(t *testing.T) {
	// Start + Attach (no ReleaseAtExit), as the harness's shell tool and
	// Attach clients use: the output stays readable after the exit was
	// delivered, for the exit retention.
	const size = 100_000
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: fmt.Sprintf("head -c %d /dev/zero", size), HoldOutput: true})
	for range 2 {
		got, dropped, exit := attachAll(t, m, info.ID, 0, AttachOptions{}, nil)
		if got != size || dropped != 0 || exit == nil {
			t.Fatalf("Attach: got %d, dropped %d, exit %+v", got, dropped, exit)
		}
	}
	r, err := m.Read(testCtx(t), info.ID, 0, 0, size)
	if err != nil || r.Dropped != 0 || r.NextCursor != size || r.Exit == nil {
		t.Fatalf("Read from 0 = dropped %d, next %d, exit %v, %v", r.Dropped, r.NextCursor, r.Exit, err)
	}
}

// TestDiscardBufferNotKeptAfterEOF checks that the buffer a pump reads
// into once the exit was reported (output after it is discarded) is let go
// at end of file, not kept with the exited process for its retention.
func TestDiscardBufferNotKeptAfterEOF(t *testing.T) {
	m := newTestManager(t, Config{})
	// The leader exits at once; a background job keeps the output open and
	// writes after the exit was reported.
	info := mustStart(t, m, StartOptions{Command: "(sleep 0.3; echo late; sleep 0.2) & exit 0"})
	if _, err := m.Wait(testCtx(t), info.ID); err != nil {
		t.Fatal(err)
	}
	p, err := m.lookup("test", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	sawDiscard := false
	eventually(t, 5*time.Second, "the background job's output read and its end of file seen", func() bool {
		p.landMu.Lock()
		sawDiscard = sawDiscard || p.discard != nil
		p.landMu.Unlock()
		select {
		case <-p.drained:
			return true
		default:
			return false
		}
	})
	p.landMu.Lock()
	defer p.landMu.Unlock()
	if p.discard != nil {
		t.Fatalf("the exited process keeps a %d-byte discard buffer after end of file", len(p.discard))
	}
	if !sawDiscard {
		t.Log("the discard buffer was not seen in use (the late write may have landed between polls)")
	}
}
