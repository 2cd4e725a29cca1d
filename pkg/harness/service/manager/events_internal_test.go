package manager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
)

// TestSlowSubscriberReadsTheStore: a subscriber that does not keep up is
// cut from the live fan-out without blocking the publisher, and its stream
// goes on from the store from its last sequence: nothing lost, nothing
// repeated, memory bounded by the buffer.
func TestSlowSubscriberReadsTheStore(t *testing.T) {
	st, err := bolt.Open(filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := bareManager(ctx, st, 2)
	rec := &store.Run{ID: "run-slow", Tenant: "acme", Status: statusRunning, Created: s.now(), Updated: s.now(), Spec: []byte(`{}`)}
	if err := st.CreateRun(ctx, rec); err != nil {
		t.Fatal(err)
	}
	lr := s.newLiveRun(rec, &RunSpec{}, 0)
	s.runs[rec.ID] = lr
	text := func(i int) Event {
		return Event{Kind: EventModelText, Text: string(rune('a' + i%26))}
	}
	lr.publish(text(0))

	const total = 200
	started := make(chan struct{})
	gate := make(chan struct{})
	var got []uint64
	done := make(chan error, 1)
	go func() {
		done <- s.streamEvents(ctx, "acme", rec.ID, 0, EventsOptions{}, func(ev Event) error {
			if len(got) == 0 {
				close(started)
				<-gate // a slow client: stuck while the run goes on
			}
			got = append(got, ev.Sequence)
			return nil
		})
	}()
	<-started
	// The publisher never blocks on the stuck subscriber.
	for i := 1; i < total; i++ {
		lr.publish(text(i))
	}
	lr.flush()
	lr.ev.mu.Lock()
	subs := len(lr.ev.subs)
	lr.ev.mu.Unlock()
	if subs != 0 {
		t.Errorf("%d subscribers still attached after lagging", subs)
	}
	close(gate)
	// End the run: the stream completes from the store.
	s.endRun(lr, statusCanceled, nil, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(got) != total+1 {
		t.Fatalf("%d events, want %d", len(got), total+1)
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("event %d has sequence %d", i, seq)
		}
	}
}

// gatedStore is a store whose event appends can be held (gate) and made to
// fail (a crash before the write reached the disk, as far as the run's
// clients are concerned). It records the size of every append.
type gatedStore struct {
	store.Store
	mu      sync.Mutex
	gate    chan struct{} // non-nil: appends wait for it to close
	entered chan struct{} // signaled when an append starts waiting
	fail    bool
	sizes   []int
}

func (g *gatedStore) AppendEvents(ctx context.Context, runID string, evs []store.Event) error {
	g.mu.Lock()
	gate, entered, fail := g.gate, g.entered, g.fail
	g.sizes = append(g.sizes, len(evs))
	g.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		<-gate
	}
	g.mu.Lock()
	fail = fail || g.fail
	g.mu.Unlock()
	if fail {
		return errors.New("disk gone")
	}
	return g.Store.AppendEvents(ctx, runID, evs)
}

func textEvent(s string) Event {
	return Event{Kind: EventModelText, Text: s}
}

// bareManager is a manager with no compute and no model, enough for its
// event logs.
func bareManager(ctx context.Context, st store.Store, buf int) *Manager {
	return &Manager{cfg: Config{Store: st, EventBuffer: buf, Now: time.Now}, log: zap.NewNop(), base: ctx,
		runs: map[string]*liveRun{}, sessions: map[string]*held{}, retained: map[string]*store.Run{}, timers: map[string]*time.Timer{},
		counts: map[string]int{}, usage: newUsage(Quotas{}, time.Now), stopped: make(chan struct{})}
}

// TestEventsReachClientsOnlyOnceStored: publish never waits for the store
// (events published while a write is in flight go together in the next
// one), and no subscriber sees an event before the store has it. So when
// the writes of some events fail (as a crash would lose them), no client
// saw them; after a restart the next event takes the next stored sequence,
// and a client resuming from the last sequence it saw gets exactly the
// events after it: no gap, no renumbering.
func TestEventsReachClientsOnlyOnceStored(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &gatedStore{Store: db}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newService := func() *Manager { return bareManager(ctx, st, 64) }
	s := newService()
	rec := &store.Run{ID: "run-crash", Tenant: "acme", Status: statusRunning, Created: s.now(), Updated: s.now(), Spec: []byte(`{}`)}
	if err := db.CreateRun(ctx, rec); err != nil {
		t.Fatal(err)
	}
	lr := s.newLiveRun(rec, &RunSpec{}, 0)
	s.runs[rec.ID] = lr
	sub := lr.subscribe(64)
	recv := func() []string {
		var out []string
		for {
			select {
			case ev := <-sub.ch:
				out = append(out, fmt.Sprintf("%d:%s", ev.Sequence, ev.Text))
			default:
				return out
			}
		}
	}
	lr.publish(textEvent("a"))
	lr.publish(textEvent("b"))
	lr.flush()
	if got := recv(); !slices.Equal(got, []string{"1:a", "2:b"}) {
		t.Fatalf("live events %q, want 1:a 2:b", got)
	}

	// The disk stalls: publish goes on; nothing reaches the subscriber.
	st.mu.Lock()
	st.gate, st.entered = make(chan struct{}), make(chan struct{}, 8)
	st.sizes = nil
	st.mu.Unlock()
	lr.publish(textEvent("c"))
	<-st.entered // the writer holds "c" in the store call
	lr.publish(textEvent("d"))
	lr.publish(textEvent("e"))
	if got := recv(); len(got) != 0 {
		t.Fatalf("a subscriber saw %q before the store had it", got)
	}
	// ... and the writes fail (the process dies before they are durable).
	st.mu.Lock()
	st.fail = true
	close(st.gate)
	st.mu.Unlock()
	lr.flush()
	st.mu.Lock()
	sizes := slices.Clone(st.sizes)
	st.gate, st.fail = nil, false
	st.mu.Unlock()
	if !slices.Equal(sizes, []int{1, 2}) {
		t.Errorf("appends of %v events, want [1 2]: what is published during a write goes in the next one", sizes)
	}
	if got := recv(); len(got) != 0 {
		t.Fatalf("a subscriber saw events the store never had: %q", got)
	}

	// A restarted service numbers on from the store.
	s2 := newService()
	last, err := db.LastSequence(ctx, rec.ID)
	if err != nil || last != 2 {
		t.Fatalf("last stored sequence %d (%v), want 2", last, err)
	}
	lr2 := s2.newLiveRun(rec, &RunSpec{}, last)
	s2.runs[rec.ID] = lr2
	lr2.publish(textEvent("f"))
	lr2.flush()
	var resumed []string
	done := make(chan error, 1)
	go func() {
		done <- s2.streamEvents(ctx, "acme", rec.ID, 2, EventsOptions{}, func(ev Event) error {
			resumed = append(resumed, fmt.Sprintf("%d:%s", ev.Sequence, ev.Text))
			return nil
		})
	}()
	lr2.publish(textEvent("g"))
	s2.endRun(lr2, statusCanceled, nil, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(resumed) != 3 || resumed[0] != "3:f" || resumed[1] != "4:g" || !strings.HasPrefix(resumed[2], "5:") {
		t.Errorf("a client resuming after 2 got %q, want 3:f 4:g and the end at 5", resumed)
	}
}

// BenchmarkPublishBurst is the event path alone over bbolt: 100 runs each
// emit turns of 12 events at once (11 text deltas, then a tool result)
// into a 64-slot channel, as the runner's stream does; one goroutine per
// run publishes them and a subscriber per run receives them. It reports
// the tool results' delay from emission to the subscriber (p50, p99).
//
//	go test -run '^$' -bench PublishBurst ./pkg/harness/service/manager/
func BenchmarkPublishBurst(b *testing.B) {
	const runs, turns, perTurn = 100, 5, 12
	db, err := bolt.Open(filepath.Join(b.TempDir(), "runs.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	s := bareManager(ctx, db, 256)
	var (
		mu  sync.Mutex
		lat []time.Duration
	)
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for r := range runs {
			rec := &store.Run{ID: fmt.Sprintf("run-%d-%d", i, r), Tenant: "t", Status: statusRunning, Created: s.now(), Updated: s.now(), Spec: []byte(`{}`)}
			if err := db.CreateRun(ctx, rec); err != nil {
				b.Fatal(err)
			}
			lr := s.newLiveRun(rec, &RunSpec{}, 0)
			sub := lr.subscribe(turns * perTurn)
			type emitted struct {
				ev Event
				at time.Time
			}
			ch := make(chan emitted, 64)
			var smu sync.Mutex
			sent := map[string]time.Time{} // tool results by call id
			wg.Add(3)
			go func() { // the runner
				defer wg.Done()
				defer close(ch)
				for turn := range turns {
					for k := range perTurn {
						ev := textEvent("x")
						if k == perTurn-1 {
							ev = Event{Kind: EventToolResult, CallID: fmt.Sprint("c", turn)}
						}
						ch <- emitted{ev, time.Now()}
					}
					time.Sleep(20 * time.Millisecond) // the tool, the next model call
				}
			}()
			go func() { // the service's drive loop
				defer wg.Done()
				for e := range ch {
					if e.ev.Kind == EventToolResult {
						smu.Lock()
						sent[e.ev.CallID] = e.at
						smu.Unlock()
					}
					lr.publish(e.ev)
				}
			}()
			go func() { // a stream
				defer wg.Done()
				for n := 0; n < turns*perTurn; n++ {
					ev := <-sub.ch
					if ev.Kind == EventToolResult {
						smu.Lock()
						d := time.Since(sent[ev.CallID])
						smu.Unlock()
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
