package server

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// DefaultReclaimIdle is how long the daemon waits, once a burst of calls
// is over, before it gives memory back (Config.ReclaimIdle).
const DefaultReclaimIdle = 2 * time.Second

// DefaultReclaimGrowth is how far the memory the runtime holds may grow
// since the last reclaim before the daemon reclaims under steady load
// (Config.ReclaimGrowth).
const DefaultReclaimGrowth = 2 << 20

// reclaimMinGain is how much the memory the runtime holds must have grown
// since the last reclaim (or start-up) for the end of a burst to reclaim:
// after a few small calls there is nothing to give back, and a reclaim
// then costs more than it returns. Measured: a fresh daemon reclaiming
// after its first small calls went from 12.2 to 13.1 MiB RSS (the first
// collections' own metadata), and stayed there.
const reclaimMinGain = 1 << 20

// reclaimEvery is the least time between two reclaims under load: a
// reclaim is a full collection plus returning every free page, a few
// milliseconds of CPU at the daemon's heap sizes and page faults to touch
// the pages again, which once per 10 s costs a busy daemon nothing
// measurable.
const reclaimEvery = 10 * time.Second

// reclaimLull is the quiet a reclaim under load waits for: no call that
// holds reclaiming off in flight, and no call or stream message for this
// long. A daemon doing one quick Exec a second is quiet most of the time;
// one streaming a large output moves messages continuously, so it is
// never reclaimed under (the idle reclaim follows once it is over).
const reclaimLull = 100 * time.Millisecond

// reclaimer gives the memory of a burst of work back to the system once
// the burst is over. The Go runtime keeps what a large transfer used (heap
// kept for reuse, pooled buffers, a heap goal sized for the burst, all
// returned only slowly by the background scavenger), and a fleet of
// sandboxes pays that in every daemon that ever served one.
//
// A burst is over when, for idle, no call has been in flight and no stream
// has moved a message. Streams that follow a process (Attach, Exec) are
// the exception to "in flight": they may stay open for the life of a quiet
// process, so only their messages count as activity. Health checks and
// reflection are no activity at all: a probe must not make the daemon
// reclaim periodically. Reclaiming happens once per burst, never while a
// call is in flight, and nothing runs while the daemon idles; a burst that
// grew the runtime's memory by less than minGain since the last reclaim is
// left alone (its growth still counts toward the next one).
//
// A daemon under steady load (an Exec a second, a file written every few
// seconds) is never idle that long, and its memory creeps up: garbage
// between collections, pooled buffers, a heap goal sized for the largest
// moment, returned only slowly. So while a burst goes on, the reclaimer
// also reclaims when the memory the runtime holds (heapRetained) has grown
// by more than growth since the last reclaim, at most once per every, and
// only in a lull: no call that holds reclaiming off (a transfer) in flight
// and no activity for lull. Growth is checked each time the burst is seen
// to go on (every idle), so a daemon under load wakes no more often than
// before. growth 0 turns this off.
type reclaimer struct {
	idle    time.Duration
	reclaim func() // what reclaiming does (tests replace it)
	log     *zap.Logger

	growth   uint64        // reclaim under load past this growth; 0: never
	minGain  uint64        // least growth for a burst's end to reclaim; 0: always
	every    time.Duration // least time between reclaims under load
	lull     time.Duration // quiet a reclaim under load waits for
	retained func() uint64 // what growth is measured on (tests replace it)

	busy   atomic.Int64  // calls in flight that hold reclaiming off
	events atomic.Uint64 // bumped by every call's start and end and every stream message
	wake   chan struct{} // signaled (without blocking) by activity
}

// newReclaimer returns a reclaimer that calls reclaim once each burst has
// been over for idle; its interceptors record activity, and run waits.
func newReclaimer(idle time.Duration, reclaim func(), log *zap.Logger) *reclaimer {
	return &reclaimer{idle: idle, reclaim: reclaim, log: log, growth: DefaultReclaimGrowth, minGain: reclaimMinGain, every: reclaimEvery,
		lull: reclaimLull, retained: heapRetained, wake: make(chan struct{}, 1)}
}

// freeMemory is what reclaiming does in the daemon: the buffer pool lets
// go of its buffers, then a collection frees the burst's garbage and the
// buffers, and FreeOSMemory's collection frees what other sync.Pools
// (gRPC's, zap's) kept through the first one and returns every free page
// to the system at once, instead of the background scavenger's trickle
// above a heap goal still sized for the burst. Measured after a burst of
// 3 GiB of transfers and 1,000 execs: RSS idle + 32 MiB without it,
// idle + 4.7 MiB with one collection, idle + 3.8 MiB with both.
func freeMemory() {
	pool.Drop()
	runtime.GC()
	debug.FreeOSMemory()
}

// begin records that a call started; end, returned, that it ended.
// holds says whether the call holds reclaiming off while in flight.
func (r *reclaimer) begin(holds bool) (end func()) {
	if holds {
		r.busy.Add(1)
	}
	r.events.Add(1)
	return func() {
		if holds {
			r.busy.Add(-1)
		}
		r.active()
	}
}

// active records activity (a call's end, a stream's message) and wakes the
// reclaimer, which then waits for the burst to be over.
func (r *reclaimer) active() {
	r.events.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run reclaims after each burst, and under load when memory grew, until
// ctx is done.
func (r *reclaimer) run(ctx context.Context) {
	timer := time.NewTimer(r.idle)
	timer.Stop()
	defer timer.Stop()
	var last uint64          // events as of the last reclaim
	lastAt := time.Now()     // when the last reclaim ran (start-up counts as one)
	baseline := r.retained() // retained memory after the last reclaim
	doReclaim := func(why string) {
		before := r.retained()
		start := time.Now()
		r.reclaim()
		baseline, lastAt = r.retained(), time.Now()
		r.log.Debug("reclaimed memory", zap.String("after", why), zap.Uint64("retained_before", before),
			zap.Uint64("retained_after", baseline), zap.Duration("took", lastAt.Sub(start)))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		// Wait for idle without activity and with nothing in flight.
		// Activity after the wake-up was taken bumps events before it
		// signals, so it is seen here or wakes the loop again.
		for {
			seen := r.events.Load()
			if !r.sleep(ctx, timer, r.idle) {
				return
			}
			if r.busy.Load() == 0 && r.events.Load() == seen {
				break
			}
			// The burst goes on: reclaim under load if memory grew.
			if r.growth == 0 || time.Since(lastAt) < r.every || r.retained() < baseline+r.growth {
				continue
			}
			if ok, err := r.inLull(ctx, timer); err != nil {
				return
			} else if ok {
				last = r.events.Load()
				doReclaim("growth under load")
			}
		}
		select { // this burst's own wake-up, if it came after the one above
		case <-r.wake:
		default:
		}
		seen := r.events.Load()
		if seen == last {
			continue // no call since the last reclaim
		}
		last = seen
		if now := r.retained(); r.minGain > 0 && now < baseline+r.minGain {
			// Growth stays measured from baseline: small bursts add up.
			r.log.Debug("memory not reclaimed: it hardly grew", zap.Uint64("retained", now), zap.Uint64("retained_after_last", baseline))
			continue
		}
		doReclaim("a burst")
	}
}

// sleep waits d on timer; false when ctx ended first.
func (r *reclaimer) sleep(ctx context.Context, timer *time.Timer, d time.Duration) bool {
	timer.Reset(d)
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// inLull reports whether, over the next lull, no call held reclaiming off
// and nothing was active: the moment to reclaim under load without
// pausing a transfer. Within the lull's bounds, a call may start as the
// reclaim runs; that costs it the reclaim's few milliseconds, once per
// every at most.
func (r *reclaimer) inLull(ctx context.Context, timer *time.Timer) (bool, error) {
	seen := r.events.Load()
	if r.busy.Load() != 0 {
		return false, nil
	}
	if !r.sleep(ctx, timer, r.lull) {
		return false, ctx.Err()
	}
	return r.busy.Load() == 0 && r.events.Load() == seen, nil
}

// heapRetained is the memory the Go runtime holds from the system, not
// counting what it has already returned.
func heapRetained() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

// quietMethod reports whether a method is no activity: health checks and
// reflection.
func quietMethod(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.") || strings.HasPrefix(method, "/grpc.reflection.")
}

// followMethod reports whether a stream follows a process, counting as
// activity only when it moves a message.
func followMethod(method string) bool {
	return strings.HasSuffix(method, "/Attach") || strings.HasSuffix(method, "/Exec")
}

// interceptors record the calls' activity.
func (r *reclaimer) interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if quietMethod(info.FullMethod) {
			return handler(ctx, req)
		}
		defer r.begin(true)()
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if quietMethod(info.FullMethod) {
			return handler(srv, ss)
		}
		defer r.begin(!followMethod(info.FullMethod))()
		return handler(srv, &activeStream{ServerStream: ss, r: r})
	}
	return unary, stream
}

// activeStream counts a stream's messages as activity.
type activeStream struct {
	grpc.ServerStream
	r *reclaimer
}

func (s *activeStream) SendMsg(m any) error {
	s.r.active()
	return s.ServerStream.SendMsg(m)
}

func (s *activeStream) RecvMsg(m any) error {
	s.r.active()
	return s.ServerStream.RecvMsg(m)
}
