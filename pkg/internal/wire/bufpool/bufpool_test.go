package bufpool

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"weak"
)

func TestGetSizes(t *testing.T) {
	var p Pool
	for _, n := range []int{0, 1, 4096, 4097, 1 << 20, 1<<24 + 1} {
		b := p.Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d): length %d", n, len(*b))
		}
		if n <= 1<<24 && cap(*b)&(cap(*b)-1) != 0 {
			t.Fatalf("Get(%d): capacity %d is not a tier's", n, cap(*b))
		}
		p.Put(b)
	}
}

// TestDropLetsBuffersGo checks that the pool shrinks: after Drop, one
// garbage collection frees every buffer the pool held (sync.Pool alone
// keeps them in its victim cache through one collection), and the pool
// still works.
func TestDropLetsBuffersGo(t *testing.T) {
	var p Pool
	var held []weak.Pointer[[]byte]
	var bufs []*[]byte
	for i := 0; i < 8; i++ {
		for _, n := range []int{4 << 10, 512 << 10, 4 << 20} {
			b := p.Get(n)
			held, bufs = append(held, weak.Make(b)), append(bufs, b)
		}
	}
	for _, b := range bufs {
		p.Put(b)
	}
	p.Drop()
	runtime.GC()
	alive := 0
	for _, w := range held {
		if w.Value() != nil {
			alive++
		}
	}
	// Only another P's private slot escapes Drop: one buffer per tier.
	if limit := 3 * (runtime.GOMAXPROCS(0) - 1); alive > limit {
		t.Fatalf("%d of %d pooled buffers still reachable after Drop and one collection; want at most %d", alive, len(held), limit)
	}
	b := p.Get(1 << 20)
	if len(*b) != 1<<20 {
		t.Fatalf("Get after Drop: length %d", len(*b))
	}
	p.Put(b)
}

// TestWithoutDropBuffersSurviveOneCollection is the control of the test
// above: without Drop, a collection leaves pooled buffers reachable, so
// the test above measures Drop.
func TestWithoutDropBuffersSurviveOneCollection(t *testing.T) {
	var p Pool
	var held []weak.Pointer[[]byte]
	var bufs []*[]byte
	for i := 0; i < 64; i++ {
		b := p.Get(64 << 10)
		held, bufs = append(held, weak.Make(b)), append(bufs, b)
	}
	for _, b := range bufs {
		p.Put(b)
	}
	runtime.GC()
	alive := 0
	for _, w := range held {
		if w.Value() != nil {
			alive++
		}
	}
	// sync.Pool keeps what it holds through one collection (its victim
	// cache); the race detector drops some Puts at random, and buffers put
	// on one P may be lost to another, so expect some, not all.
	if alive == 0 {
		t.Fatal("no pooled buffer survived one collection without Drop")
	}
}

// Drop is safe concurrently with Get and Put: every buffer Get hands out
// has the length asked for, and none is ever held by two users at once
// (each user fills its buffer with its own byte and finds it unchanged
// before putting it back), while another goroutine drops the tiers.
func TestDropConcurrentWithUse(t *testing.T) {
	var p Pool
	const users, rounds = 4, 500
	errs := make(chan string, users)
	var wg sync.WaitGroup
	for u := range users {
		wg.Add(1)
		go func(mark byte) {
			defer wg.Done()
			for i := range rounds {
				n := 4<<10 + i%3*(4<<10)
				b := p.Get(n)
				if len(*b) != n {
					errs <- fmt.Sprintf("Get(%d) returned %d bytes", n, len(*b))
					return
				}
				for j := range *b {
					(*b)[j] = mark
				}
				runtime.Gosched()
				for j, c := range *b {
					if c != mark {
						errs <- fmt.Sprintf("user %d: byte %d changed to %d while it held the buffer", mark, j, c)
						return
					}
				}
				p.Put(b)
			}
		}(byte(u + 1))
	}
	drops := make(chan struct{})
	go func() {
		defer close(drops)
		for range 200 {
			p.Drop()
			runtime.Gosched()
		}
	}()
	wg.Wait()
	<-drops
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	// The pool still works after the drops.
	if b := p.Get(8 << 10); len(*b) != 8<<10 {
		t.Errorf("after Drop: Get returned %d bytes", len(*b))
	}
}
