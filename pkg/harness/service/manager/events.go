package manager

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// eventOf converts a runner event to the manager's (false for those it
// carries otherwise: the final output is in run_finished).
func eventOf(ev harness.Event) (Event, bool) {
	out := Event{Agent: ev.Agent}
	switch ev.Kind {
	case harness.EventTurnStarted:
		out.Kind, out.Turn = EventTurnStarted, ev.Turn
	case harness.EventTextDelta:
		out.Kind, out.Text = EventModelText, ev.Text
	case harness.EventModelReset:
		out.Kind = EventModelReset
	case harness.EventToolCall:
		out.Kind, out.CallID, out.Tool, out.Input = EventToolCall, ev.Call.ID, ev.Call.Name, ev.Call.Input
	case harness.EventToolOutput:
		out.Kind, out.CallID, out.Output = EventToolOutput, ev.Call.ID, ev.Output
	case harness.EventToolResult:
		out.Kind, out.CallID, out.Tool = EventToolResult, ev.Call.ID, ev.Call.Name
		if ev.Result != nil {
			out.Text, out.IsError = ev.Result.Output, ev.Result.IsError
		}
	default:
		return Event{}, false
	}
	return out, true
}

// maxQueued bounds the events of one run waiting for the store: a run
// whose store falls this far behind waits in publish (backpressure rather
// than memory).
const maxQueued = 1024

// events is a run's event log as this process writes it: a queue of
// events waiting for the store, one writer draining it in batches, and the
// live subscribers. Its mutex is taken after liveRun.mu, never before, and
// is never held across a store call.
//
// Durability before visibility. An event reaches subscribers only after
// the store has it, numbered: the writer takes every queued event, numbers
// them after the last stored one, appends them in one store call (one
// transaction and one fsync, shared with other runs' batches by the
// store's group commit) and then fans them out. So a client never holds a
// sequence the store lacks: after a crash and restart it resumes from the
// last sequence it saw and finds exactly the events after it, with no gap
// and no renumbering. (Publishing before the write would save one commit
// of latency, but a client could then hold sequence N that a crash lost;
// the restarted manager would number its next event N again and the
// client would skip it.) The run itself does not wait for the store:
// publish only queues, so a burst of model text deltas costs one commit
// instead of one commit each, and the tool result behind them waits for at
// most the batch in flight and its own.
type events struct {
	mu   sync.Mutex
	cond *sync.Cond // signals queue space and an idle writer
	// seq is the last stored (and published) sequence.
	seq     uint64
	queue   []*Event
	writing bool
	subs    map[*subscriber]struct{} // nil once the run ended
}

// publish queues one event for the store and its subscribers. It waits
// only when maxQueued events are already waiting for the store. The
// event's time is now, when the manager got it from the run, so a
// client's delay measured from it includes the wait for the store. The
// writer is a tracked goroutine; after Shutdown (no goroutine may start)
// the caller writes the batch itself.
func (lr *liveRun) publish(ev Event) {
	e := &lr.ev
	ev.RunID = lr.id
	ev.Time = lr.m.now()
	e.mu.Lock()
	for len(e.queue) >= maxQueued {
		e.cond.Wait()
	}
	e.queue = append(e.queue, &ev)
	start := !e.writing
	e.writing = true
	e.mu.Unlock()
	if start && !lr.m.tasks.goTracked(lr.write) {
		lr.write()
	}
}

// publishLocked is publish for callers holding lr.mu (the order of locks
// allows it; the name says where it is called from).
func (lr *liveRun) publishLocked(ev Event) { lr.publish(ev) }

// write drains the queue: each batch is numbered, stored in one call and
// then fanned out. A batch the store refuses is dropped and logged (the
// log stays gapless: the next batch takes its sequences).
func (lr *liveRun) write() {
	e := &lr.ev
	ctx := context.WithoutCancel(lr.m.base)
	for {
		e.mu.Lock()
		if len(e.queue) == 0 {
			e.writing = false
			e.cond.Broadcast()
			e.mu.Unlock()
			return
		}
		batch := e.queue
		e.queue = nil
		next := e.seq
		e.cond.Broadcast()
		e.mu.Unlock()

		stored := make([]store.Event, 0, len(batch))
		var err error
		for _, ev := range batch {
			ev.Sequence = next + 1
			data, merr := encodeEvent(ev)
			if merr != nil {
				err = merr
				break
			}
			stored = append(stored, store.Event{Seq: ev.Sequence, Data: data})
			next++
		}
		if err == nil {
			err = lr.m.cfg.Store.AppendEvents(ctx, lr.id, stored)
		}
		if err != nil {
			// The run goes on; its stream misses these events, as the
			// log explains.
			lr.m.log.Error("storing run events", zap.String("run", lr.id), zap.Int("events", len(batch)), zap.Error(err))
			continue
		}
		e.mu.Lock()
		e.seq = next
		for _, ev := range batch {
			for sub := range e.subs {
				select {
				case sub.ch <- *ev:
				default:
					// Too far behind: the subscriber goes back to the store.
					sub.close(true)
					delete(e.subs, sub)
				}
			}
		}
		e.mu.Unlock()
	}
}

// flush waits until every event published so far is stored and fanned
// out (or dropped by a failed write).
func (lr *liveRun) flush() {
	e := &lr.ev
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.writing || len(e.queue) > 0 {
		e.cond.Wait()
	}
}

// lastSeq is the sequence of the last stored event.
func (lr *liveRun) lastSeq() uint64 {
	lr.ev.mu.Lock()
	defer lr.ev.mu.Unlock()
	return lr.ev.seq
}

// endEvents flushes the run's events and ends its subscriptions (their
// streams read what is left from the store).
func (lr *liveRun) endEvents() {
	lr.flush()
	e := &lr.ev
	e.mu.Lock()
	defer e.mu.Unlock()
	for sub := range e.subs {
		sub.close(false)
	}
	e.subs = nil
}

// subscriber receives a run's live events through a bounded channel.
type subscriber struct {
	ch     chan Event
	once   sync.Once
	lagged bool
}

func (sub *subscriber) close(lagged bool) {
	sub.once.Do(func() {
		sub.lagged = lagged
		close(sub.ch)
	})
}

// subscribe registers a subscriber; nil when the run has ended.
func (lr *liveRun) subscribe(buf int) *subscriber {
	lr.ev.mu.Lock()
	defer lr.ev.mu.Unlock()
	if lr.ev.subs == nil {
		return nil
	}
	sub := &subscriber{ch: make(chan Event, buf)}
	lr.ev.subs[sub] = struct{}{}
	return sub
}

func (lr *liveRun) unsubscribe(sub *subscriber) {
	lr.ev.mu.Lock()
	defer lr.ev.mu.Unlock()
	if lr.ev.subs != nil {
		delete(lr.ev.subs, sub)
	}
}

// replayPage bounds one read of the event log.
const replayPage = 512

// errRestarting ends the streams of a manager that shuts down.
var errRestarting = unavailable("the service is shutting down; reconnect with the last sequence seen")

// streamEvents sends a run's events after `after` to send: from the store,
// then live, until the run ends or ctx is done. A subscriber that falls
// behind the live events reads the store again from its last sequence, so
// neither the run nor the manager's memory waits for a slow client. The
// run must belong to tenant.
func (m *Manager) streamEvents(ctx context.Context, tenant, runID string, after uint64, o EventsOptions, send func(Event) error) error {
	if _, err := m.cfg.Store.GetRun(ctx, tenant, runID); err != nil {
		return err
	}
	for {
		m.mu.Lock()
		lr := m.runs[runID]
		m.mu.Unlock()
		var sub *subscriber
		if lr != nil {
			sub = lr.subscribe(m.cfg.EventBuffer)
		}
		// Everything stored so far.
		for {
			evs, err := m.cfg.Store.Events(ctx, runID, after, replayPage)
			if err != nil {
				if sub != nil {
					lr.unsubscribe(sub)
				}
				return fmt.Errorf("read events: %w", err)
			}
			for _, e := range evs {
				ev, err := decodeEvent(e.Data)
				if err != nil {
					if sub != nil {
						lr.unsubscribe(sub)
					}
					return fmt.Errorf("stored event %d: %w", e.Seq, err)
				}
				if err := send(ev); err != nil {
					if sub != nil {
						lr.unsubscribe(sub)
					}
					return err
				}
				after = e.Seq
			}
			if len(evs) < replayPage {
				break
			}
		}
		if sub == nil {
			return nil // the run has ended: the log is complete
		}
		lagged, err := m.follow(ctx, sub, &after, o, send)
		if err != nil {
			lr.unsubscribe(sub)
			return err
		}
		if !lagged {
			// Ended: send what was stored after the last live event.
			sub = nil
			continue
		}
	}
}

// follow sends live events until the subscription closes; it reports
// whether it closed because the subscriber lagged.
func (m *Manager) follow(ctx context.Context, sub *subscriber, after *uint64, o EventsOptions, send func(Event) error) (bool, error) {
	var keepAlive <-chan time.Time
	if o.KeepAlive != nil && o.KeepAliveEvery > 0 {
		t := time.NewTicker(o.KeepAliveEvery)
		defer t.Stop()
		keepAlive = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-m.stopped:
			return false, errRestarting
		case <-keepAlive:
			if err := o.KeepAlive(); err != nil {
				return false, err
			}
		case ev, ok := <-sub.ch:
			if !ok {
				return sub.lagged, nil
			}
			if ev.Sequence <= *after {
				continue
			}
			if err := send(ev); err != nil {
				return false, err
			}
			*after = ev.Sequence
		}
	}
}
