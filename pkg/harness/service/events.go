package service

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// eventOf converts a runner event to the API's (nil for those the API
// carries otherwise: the final output is in RunFinished).
func eventOf(ev harness.Event) *harnessv1.RunEvent {
	out := &harnessv1.RunEvent{Agent: ev.Agent}
	switch ev.Kind {
	case harness.EventTurnStarted:
		out.Kind = &harnessv1.RunEvent_TurnStarted{TurnStarted: &harnessv1.TurnStarted{Turn: int32(ev.Turn)}}
	case harness.EventTextDelta:
		out.Kind = &harnessv1.RunEvent_ModelText{ModelText: &harnessv1.ModelText{Text: ev.Text}}
	case harness.EventModelReset:
		out.Kind = &harnessv1.RunEvent_ModelReset{ModelReset: &harnessv1.ModelReset{}}
	case harness.EventToolCall:
		out.Kind = &harnessv1.RunEvent_ToolCall{ToolCall: &harnessv1.ToolCall{CallId: ev.Call.ID, Tool: ev.Call.Name, Input: ev.Call.Input}}
	case harness.EventToolOutput:
		out.Kind = &harnessv1.RunEvent_ToolOutput{ToolOutput: &harnessv1.ToolOutput{CallId: ev.Call.ID, Output: ev.Output}}
	case harness.EventToolResult:
		r := &harnessv1.ToolResult{CallId: ev.Call.ID, Tool: ev.Call.Name}
		if ev.Result != nil {
			r.Output, r.IsError = ev.Result.Output, ev.Result.IsError
		}
		out.Kind = &harnessv1.RunEvent_ToolResult{ToolResult: r}
	default:
		return nil
	}
	return out
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
// the restarted service would number its next event N again and the
// client would skip it.) The run itself does not wait for the store:
// publish only queues, so a burst of model text deltas costs one commit
// instead of one commit each, and the tool result behind them waits for at
// most the batch in flight and its own.
type events struct {
	mu   sync.Mutex
	cond *sync.Cond // signals queue space and an idle writer
	// seq is the last stored (and published) sequence.
	seq     uint64
	queue   []*harnessv1.RunEvent
	writing bool
	subs    map[*subscriber]struct{} // nil once the run ended
}

// publish queues one event for the store and its subscribers. It waits
// only when maxQueued events are already waiting for the store. The
// event's time is now, when the service got it from the run, so a
// client's delay measured from it includes the wait for the store.
func (lr *liveRun) publish(ev *harnessv1.RunEvent) {
	e := &lr.ev
	ev.RunId = lr.id
	ev.Time = timestamppb.New(lr.s.now())
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.queue) >= maxQueued {
		e.cond.Wait()
	}
	e.queue = append(e.queue, ev)
	if !e.writing {
		e.writing = true
		go lr.write()
	}
}

// publishLocked is publish for callers holding lr.mu (the order of locks
// allows it; the name says where it is called from).
func (lr *liveRun) publishLocked(ev *harnessv1.RunEvent) { lr.publish(ev) }

// write drains the queue: each batch is numbered, stored in one call and
// then fanned out. A batch the store refuses is dropped and logged (the
// log stays gapless: the next batch takes its sequences).
func (lr *liveRun) write() {
	e := &lr.ev
	ctx := context.WithoutCancel(lr.s.base)
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
			data, merr := proto.Marshal(ev)
			if merr != nil {
				err = merr
				break
			}
			stored = append(stored, store.Event{Seq: ev.Sequence, Data: data})
			next++
		}
		if err == nil {
			err = lr.s.cfg.Store.AppendEvents(ctx, lr.id, stored)
		}
		if err != nil {
			// The run goes on; its stream misses these events, as the
			// log explains.
			lr.s.log.Error("storing run events", zap.String("run", lr.id), zap.Int("events", len(batch)), zap.Error(err))
			continue
		}
		e.mu.Lock()
		e.seq = next
		for _, ev := range batch {
			for sub := range e.subs {
				select {
				case sub.ch <- ev:
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
	ch     chan *harnessv1.RunEvent
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
	sub := &subscriber{ch: make(chan *harnessv1.RunEvent, buf)}
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

// streamEvents sends a run's events after `after` to send: from the store,
// then live, until the run ends or ctx is done. A subscriber that falls
// behind the live events reads the store again from its last sequence, so
// neither the run nor the service's memory waits for a slow client. The run
// must belong to tenant.
func (s *Service) streamEvents(ctx context.Context, tenant, runID string, after uint64, send func(*harnessv1.RunEvent) error) error {
	if _, err := s.cfg.Store.GetRun(ctx, tenant, runID); err != nil {
		return err
	}
	for {
		s.mu.Lock()
		lr := s.runs[runID]
		s.mu.Unlock()
		var sub *subscriber
		if lr != nil {
			sub = lr.subscribe(s.cfg.EventBuffer)
		}
		// Everything stored so far.
		for {
			evs, err := s.cfg.Store.Events(ctx, runID, after, replayPage)
			if err != nil {
				if sub != nil {
					lr.unsubscribe(sub)
				}
				return fmt.Errorf("read events: %w", err)
			}
			for _, e := range evs {
				ev := &harnessv1.RunEvent{}
				if err := proto.Unmarshal(e.Data, ev); err != nil {
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
		lagged, err := s.follow(ctx, sub, &after, send)
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
func (s *Service) follow(ctx context.Context, sub *subscriber, after *uint64, send func(*harnessv1.RunEvent) error) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-s.stopped:
			return false, errRestarting
		case ev, ok := <-sub.ch:
			if !ok {
				return sub.lagged, nil
			}
			if ev.GetSequence() <= *after {
				continue
			}
			if err := send(ev); err != nil {
				return false, err
			}
			*after = ev.GetSequence()
		}
	}
}

var errNoTenant = errors.New("no tenant bound to the request")

// errRestarting ends the streams of a service that shuts down.
var errRestarting = connect.NewError(connect.CodeUnavailable,
	errors.New("the service is shutting down; reconnect with the last sequence seen"))
