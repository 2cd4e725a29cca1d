// Package bufpool is the non-clearing buffer pool the daemon's gRPC server
// and the typed client share for their bulk paths (output streaming, file
// transfer), installed as gRPC's buffer pool and used by their codecs.
package bufpool

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Pool is a tiered pool of byte buffers (powers of two from 4 KiB to
// 16 MiB) that, unlike gRPC's default pool, does not clear a buffer when it
// is handed out again: every user overwrites the bytes it reads. Clearing
// cost as much as a copy on the bulk paths (output streaming, file
// transfer). The daemon and the client each keep one.
//
// A Pool holds buffers until the garbage collector clears them (as
// sync.Pool does: after two collections) or until Drop, which the daemon
// calls once a burst of work is over, so that it does not keep the buffers
// of a large transfer while it idles. The zero Pool is ready to use.
type Pool struct {
	tiers [poolMaxShift - poolMinShift + 1]atomic.Pointer[sync.Pool]
}

const (
	poolMinShift = 12
	poolMaxShift = 24
)

// tier returns the index of the smallest tier holding n bytes, or -1 when
// n is larger than the largest tier.
func tier(n int) int {
	if n <= 1<<poolMinShift {
		return 0
	}
	s := bits.Len(uint(n - 1))
	if s > poolMaxShift {
		return -1
	}
	return s - poolMinShift
}

// tierPool returns tier t's pool, creating it on first use.
func (p *Pool) tierPool(t int) *sync.Pool {
	for {
		if sp := p.tiers[t].Load(); sp != nil {
			return sp
		}
		sp := &sync.Pool{}
		if p.tiers[t].CompareAndSwap(nil, sp) {
			return sp
		}
	}
}

// Drop lets go of the buffers the pool holds, so that the next garbage
// collection frees them (a sync.Pool alone keeps its contents through one
// more collection, in its victim cache): the daemon calls it once a burst
// of work is over. Each tier starts anew, and what the old one holds is
// taken out of it, except the one buffer per tier that another P may keep
// to itself (sync.Pool's private slot), which the collection after next
// frees. Buffers handed out before Drop may still be Put; they go to the
// new tiers. Drop is safe to call concurrently with Get and Put.
func (p *Pool) Drop() {
	for t := range p.tiers {
		old := p.tiers[t].Swap(nil)
		if old == nil {
			continue
		}
		for old.Get() != nil {
		}
	}
}

// Get returns a buffer of length n (its bytes are not cleared).
func (p *Pool) Get(n int) *[]byte {
	t := tier(n)
	if t < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tierPool(t).Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(t+poolMinShift))
	return &b
}

// Put returns a buffer obtained from Get (any prefix of it). Buffers whose
// capacity is not a tier's are dropped.
func (p *Pool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<poolMinShift || c&(c-1) != 0 {
		return
	}
	if t := tier(c); t >= 0 {
		p.tierPool(t).Put(b)
	}
}

// PutBytes returns a buffer whose slice is all that is left of it (a data
// chunk decoded straight into a pooled buffer).
func (p *Pool) PutBytes(b []byte) {
	if b != nil {
		p.Put(&b)
	}
}
