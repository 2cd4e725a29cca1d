package server

import (
	"runtime"
	"testing"
)

// TestBulkProcs checks that GOMAXPROCS is raised while bulk calls run,
// overlapping calls included, and put back when the last one ends; that a
// count not above the current one changes nothing; and that nil is off.
func TestBulkProcs(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })

	b := newBulkProcs(3)
	r1 := b.acquire()
	if got := runtime.GOMAXPROCS(0); got != 3 {
		t.Fatalf("during one bulk call: GOMAXPROCS %d, want 3", got)
	}
	r2 := b.acquire()
	r1()
	r1() // a second release of the same call counts once
	if got := runtime.GOMAXPROCS(0); got != 3 {
		t.Fatalf("with the second call still running: GOMAXPROCS %d, want 3", got)
	}
	r2()
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("after both: GOMAXPROCS %d, want 1 again", got)
	}

	runtime.GOMAXPROCS(4)
	r := newBulkProcs(3).acquire()
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("bulk 3 over 4: GOMAXPROCS %d, want 4 left alone", got)
	}
	r()
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("after: GOMAXPROCS %d, want 4", got)
	}

	if newBulkProcs(0) != nil {
		t.Fatal("newBulkProcs(0) is not off (nil)")
	}
	var off *bulkProcs
	off.acquire()()
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("off: GOMAXPROCS %d, want 4", got)
	}
}
