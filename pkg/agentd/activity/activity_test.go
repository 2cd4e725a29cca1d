package activity

import (
	"sync"
	"testing"
	"time"
)

// The clock starts at its start, only moves forward, and a nil clock is
// inert.
func TestClockOnlyMovesForward(t *testing.T) {
	start := time.Unix(1000, 0)
	c := New(start)
	if !c.Last().Equal(start) {
		t.Fatalf("new clock: %v, want %v", c.Last(), start)
	}
	c.TouchAt(start.Add(-time.Hour))
	if !c.Last().Equal(start) {
		t.Fatalf("an earlier touch moved the clock back to %v", c.Last())
	}
	later := start.Add(time.Minute)
	c.TouchAt(later)
	if !c.Last().Equal(later) {
		t.Fatalf("after a later touch: %v, want %v", c.Last(), later)
	}
	before := time.Now()
	c.Touch()
	if c.Last().Before(before) {
		t.Fatalf("Touch: %v, before the call (%v)", c.Last(), before)
	}
	var none *Clock
	none.Touch()
	none.TouchAt(later)
	if !none.Last().IsZero() {
		t.Fatal("a nil clock reads as a time")
	}
	if !(&Clock{}).Last().IsZero() {
		t.Fatal("an untouched zero clock reads as a time")
	}
}

// Concurrent touches leave the latest of them.
func TestClockConcurrentTouches(t *testing.T) {
	c := New(time.Unix(0, 1))
	base := time.Unix(2000, 0)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				c.TouchAt(base.Add(time.Duration(i*1000+j) * time.Microsecond))
			}
		})
	}
	wg.Wait()
	if want := base.Add(7999 * time.Microsecond); !c.Last().Equal(want) {
		t.Fatalf("after concurrent touches: %v, want %v", c.Last(), want)
	}
}
