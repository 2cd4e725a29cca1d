package server

import (
	"runtime"
	"sync"
)

// bulkProcs raises GOMAXPROCS while an archive or a restore runs and puts
// it back when the last one ends. The daemon runs on few Ps for its
// latency-bound calls (cmd/sandbox-agentd's --gomaxprocs); an archive's
// walk and its zstd encoder work as a pipeline, and a restore's decoder
// ahead of its writes, which needs a second P to overlap. A nil
// *bulkProcs, or one whose procs is not above the count at the time,
// changes nothing.
type bulkProcs struct {
	procs int // GOMAXPROCS while bulk work runs

	mu     sync.Mutex
	active int // bulk calls running
	before int // GOMAXPROCS to put back; 0 when nothing was raised
}

// newBulkProcs returns a bulkProcs raising GOMAXPROCS to procs, or nil
// when procs is 0 (the feature is off).
func newBulkProcs(procs int) *bulkProcs {
	if procs <= 0 {
		return nil
	}
	return &bulkProcs{procs: procs}
}

// acquire marks a bulk call as running (raising GOMAXPROCS if it is the
// first) and returns the function that marks it done.
func (b *bulkProcs) acquire() (release func()) {
	if b == nil {
		return func() {}
	}
	b.mu.Lock()
	b.active++
	if b.active == 1 {
		if cur := runtime.GOMAXPROCS(0); cur < b.procs {
			b.before = runtime.GOMAXPROCS(b.procs)
		}
	}
	b.mu.Unlock()
	var once sync.Once
	return func() { once.Do(b.release) }
}

func (b *bulkProcs) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active--
	if b.active == 0 && b.before > 0 {
		runtime.GOMAXPROCS(b.before)
		b.before = 0
	}
}
