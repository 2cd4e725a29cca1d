// Package activity keeps the daemon's last activity: the time of the
// latest sign that its sandbox is in use (a call, process output, a port
// forward carrying bytes, CPU time used). Recording it is one atomic load
// and, at most, one compare-and-swap, cheap enough for the output and
// forwarding paths.
package activity

import (
	"sync/atomic"
	"time"
)

// Clock holds the last activity as Unix nanoseconds. It only moves
// forward. The zero Clock reads as the zero time until touched; a nil
// *Clock ignores Touch and reads as the zero time, so that code run
// without one (a process Manager in a unit test) needs no check.
type Clock struct {
	last atomic.Int64
}

// New returns a Clock whose last activity is since (the daemon's start).
func New(since time.Time) *Clock {
	c := &Clock{}
	c.last.Store(since.UnixNano())
	return c
}

// Touch records activity now.
func (c *Clock) Touch() {
	if c == nil {
		return
	}
	c.touchNanos(time.Now().UnixNano())
}

// TouchAt records activity at t, if t is later than the last activity.
func (c *Clock) TouchAt(t time.Time) {
	if c == nil {
		return
	}
	c.touchNanos(t.UnixNano())
}

// touchNanos moves the clock forward to ns. Usually a single load: the
// clock was touched at or after ns already by a concurrent toucher, or is
// moved by one CAS.
func (c *Clock) touchNanos(ns int64) {
	for {
		old := c.last.Load()
		if ns <= old || c.last.CompareAndSwap(old, ns) {
			return
		}
	}
}

// Last returns the last activity (the zero time for a nil or untouched
// Clock).
func (c *Clock) Last() time.Time {
	if c == nil {
		return time.Time{}
	}
	ns := c.last.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
