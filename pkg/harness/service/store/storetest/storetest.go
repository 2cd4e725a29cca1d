// Package storetest is the conformance suite every store.Store passes.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// Run runs the suite against fresh stores made by open (each subtest gets
// its own, closed at its end).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := context.Background()
	base := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	mk := func(id, tenant string, n int) *store.Run {
		c := base.Add(time.Duration(n) * time.Second)
		return &store.Run{ID: id, Tenant: tenant, Status: "RUN_STATUS_RUNNING", Created: c, Updated: c, Spec: []byte(`{"input":"x"}`)}
	}
	t.Run("CreateGetUpdate", func(t *testing.T) {
		s := open(t)
		r := mk("run-1", "acme", 0)
		if err := s.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateRun(ctx, r); !errors.Is(err, store.ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		got, err := s.GetRun(ctx, "acme", "run-1")
		if err != nil || got.ID != "run-1" || string(got.Spec) != `{"input":"x"}` || !got.Created.Equal(r.Created) {
			t.Fatalf("get: %+v %v", got, err)
		}
		// Another tenant's id is the same as an unknown one.
		if _, err := s.GetRun(ctx, "other", "run-1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("other tenant: %v, want ErrNotFound", err)
		}
		if _, err := s.GetRun(ctx, "acme", "run-404"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown: %v, want ErrNotFound", err)
		}
		got.Status, got.RunState, got.Checkpoint, got.FinalOutput = "RUN_STATUS_SUCCEEDED", []byte(`{"version":1}`), []string{"c1"}, "done"
		if err := s.UpdateRun(ctx, got); err != nil {
			t.Fatal(err)
		}
		again, err := s.GetRun(ctx, "acme", "run-1")
		if err != nil || again.Status != "RUN_STATUS_SUCCEEDED" || string(again.RunState) != `{"version":1}` || again.FinalOutput != "done" || len(again.Checkpoint) != 1 {
			t.Fatalf("after update: %+v %v", again, err)
		}
		if err := s.UpdateRun(ctx, mk("run-404", "acme", 0)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("update unknown: %v", err)
		}
		other := *again
		other.Tenant = "other"
		if err := s.UpdateRun(ctx, &other); err == nil {
			t.Fatal("an update moved a run to another tenant")
		}
	})
	t.Run("ListPagesNewestFirst", func(t *testing.T) {
		s := open(t)
		for i := range 7 {
			r := mk(fmt.Sprintf("run-%d", i), "acme", i)
			if i%2 == 1 {
				r.Status = "RUN_STATUS_FAILED"
			}
			if err := s.CreateRun(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateRun(ctx, mk("run-x", "other", 9)); err != nil {
			t.Fatal(err)
		}
		var ids []string
		after := ""
		for pages := 0; ; pages++ {
			page, next, err := s.ListRuns(ctx, "acme", store.ListOptions{Limit: 3, After: after})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range page {
				ids = append(ids, r.ID)
			}
			if next == "" {
				break
			}
			if pages > 5 {
				t.Fatal("paging does not end")
			}
			after = next
		}
		if fmt.Sprint(ids) != "[run-6 run-5 run-4 run-3 run-2 run-1 run-0]" {
			t.Fatalf("pages: %v", ids)
		}
		failed, _, err := s.ListRuns(ctx, "acme", store.ListOptions{Status: "RUN_STATUS_FAILED"})
		if err != nil || len(failed) != 3 {
			t.Fatalf("failed only: %d %v", len(failed), err)
		}
		none, next, err := s.ListRuns(ctx, "nobody", store.ListOptions{})
		if err != nil || len(none) != 0 || next != "" {
			t.Fatalf("unknown tenant: %v %q %v", none, next, err)
		}
		active, err := s.ActiveRuns(ctx, "RUN_STATUS_FAILED")
		if err != nil || len(active) != 3 {
			t.Fatalf("active: %d %v", len(active), err)
		}
	})
	t.Run("SandboxRuns", func(t *testing.T) {
		s := open(t)
		ids := func(runs []*store.Run, err error) string {
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, r := range runs {
				out = append(out, r.ID)
			}
			return fmt.Sprint(out)
		}
		for i := range 4 {
			r := mk(fmt.Sprintf("run-s%d", i), "acme", i)
			if i%2 == 1 {
				r.SandboxID, r.Provider = fmt.Sprintf("sbx-s%d", i), "local"
			}
			if err := s.CreateRun(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		other := mk("run-o", "other", 9)
		other.SandboxID = "sbx-o"
		if err := s.CreateRun(ctx, other); err != nil {
			t.Fatal(err)
		}
		if got := ids(s.SandboxRuns(ctx, "acme")); got != "[run-s3 run-s1]" {
			t.Fatalf("sandbox runs %s, want [run-s3 run-s1] (newest first, the tenant's only)", got)
		}
		// A sandbox made later joins the index; a deleted one leaves it.
		r0, _ := s.GetRun(ctx, "acme", "run-s0")
		r0.SandboxID = "sbx-s0"
		r3, _ := s.GetRun(ctx, "acme", "run-s3")
		r3.SandboxGone = true
		for _, r := range []*store.Run{r0, r3} {
			if err := s.UpdateRun(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if got := ids(s.SandboxRuns(ctx, "acme")); got != "[run-s1 run-s0]" {
			t.Fatalf("sandbox runs after updates %s, want [run-s1 run-s0]", got)
		}
		if got := ids(s.SandboxRuns(ctx, "nobody")); got != "[]" {
			t.Fatalf("a tenant without runs: %s", got)
		}
		// Every tenant's, in any order.
		held, err := s.HeldSandboxes(ctx)
		got := ids(held, err)
		slices.SortFunc(held, func(a, b *store.Run) int { return strings.Compare(a.ID, b.ID) })
		if sorted := ids(held, nil); sorted != "[run-o run-s0 run-s1]" {
			t.Fatalf("held sandboxes %s, want run-o, run-s0 and run-s1", got)
		}
	})
	t.Run("APISandboxes", func(t *testing.T) {
		s := open(t)
		mkSb := func(id, tenant string, n int) *store.Sandbox {
			c := base.Add(time.Duration(n) * time.Second)
			return &store.Sandbox{ID: id, Tenant: tenant, Created: c, Updated: c, Spec: []byte(`{"manifest":""}`),
				Labels: map[string]string{"team": "a", "n": fmt.Sprint(n)}, Expires: c.Add(time.Hour), IdleTimeout: 5 * time.Minute}
		}
		ids := func(sbs []*store.Sandbox, err error) string {
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, sb := range sbs {
				out = append(out, sb.ID)
			}
			return fmt.Sprint(out)
		}
		for i := range 3 {
			if err := s.CreateSandbox(ctx, mkSb(fmt.Sprintf("sbx-a%d", i), "acme", i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateSandbox(ctx, mkSb("sbx-o", "other", 9)); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSandbox(ctx, mkSb("sbx-a0", "acme", 0)); !errors.Is(err, store.ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		got, err := s.GetSandbox(ctx, "acme", "sbx-a1")
		if err != nil || got.ID != "sbx-a1" || got.Labels["n"] != "1" || got.IdleTimeout != 5*time.Minute ||
			!got.Expires.Equal(base.Add(time.Second+time.Hour)) || !got.Created.Equal(base.Add(time.Second)) || string(got.Spec) != `{"manifest":""}` {
			t.Fatalf("get: %+v %v", got, err)
		}
		// Another tenant's id is the same as an unknown one.
		if _, err := s.GetSandbox(ctx, "other", "sbx-a1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("other tenant: %v, want ErrNotFound", err)
		}
		if _, err := s.GetSandbox(ctx, "acme", "sbx-404"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown: %v, want ErrNotFound", err)
		}
		live := func() string {
			sbs, err := s.LiveSandboxes(ctx)
			slices.SortFunc(sbs, func(a, b *store.Sandbox) int { return strings.Compare(a.ID, b.ID) })
			return ids(sbs, err)
		}
		if got := live(); got != "[sbx-a0 sbx-a1 sbx-a2 sbx-o]" {
			t.Fatalf("live sandboxes %s, want every tenant's", got)
		}
		// An update keeps the record; a gone sandbox leaves the lists but
		// can still be read.
		got.SessionState, got.Provider = []byte(`{"v":1}`), "local"
		if err := s.UpdateSandbox(ctx, got); err != nil {
			t.Fatal(err)
		}
		gone, _ := s.GetSandbox(ctx, "acme", "sbx-a0")
		gone.Gone = true
		if err := s.UpdateSandbox(ctx, gone); err != nil {
			t.Fatal(err)
		}
		if again, err := s.GetSandbox(ctx, "acme", "sbx-a1"); err != nil || string(again.SessionState) != `{"v":1}` || again.Provider != "local" {
			t.Fatalf("after update: %+v %v", again, err)
		}
		if again, err := s.GetSandbox(ctx, "acme", "sbx-a0"); err != nil || !again.Gone {
			t.Fatalf("gone: %+v %v", again, err)
		}
		if got := live(); got != "[sbx-a1 sbx-a2 sbx-o]" {
			t.Fatalf("live sandboxes after a deletion %s, want [sbx-a1 sbx-a2 sbx-o]", got)
		}
		if err := s.UpdateSandbox(ctx, mkSb("sbx-404", "acme", 0)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("update unknown: %v", err)
		}
		moved := *got
		moved.Tenant = "other"
		if err := s.UpdateSandbox(ctx, &moved); err == nil {
			t.Fatal("an update moved a sandbox to another tenant")
		}
		if again, err := s.GetSandbox(ctx, "acme", "sbx-a1"); err != nil || again.Tenant != "acme" {
			t.Fatalf("after a refused move: %+v %v", again, err)
		}
		// Runs are not sandboxes.
		if err := s.CreateRun(ctx, mk("run-x", "acme", 0)); err != nil {
			t.Fatal(err)
		}
		if got := live(); got != "[sbx-a1 sbx-a2 sbx-o]" {
			t.Fatalf("live sandboxes with a run stored %s", got)
		}
		if _, err := s.GetRun(ctx, "acme", "sbx-a1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a sandbox read as a run: %v", err)
		}
	})
	t.Run("Events", func(t *testing.T) {
		s := open(t)
		if err := s.CreateRun(ctx, mk("run-e", "acme", 0)); err != nil {
			t.Fatal(err)
		}
		if last, err := s.LastSequence(ctx, "run-e"); err != nil || last != 0 {
			t.Fatalf("empty log: %d %v", last, err)
		}
		if err := s.AppendEvents(ctx, "run-e", []store.Event{{Seq: 1, Data: []byte("a")}, {Seq: 2, Data: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendEvents(ctx, "run-e", []store.Event{{Seq: 4, Data: []byte("x")}}); !errors.Is(err, store.ErrSequence) {
			t.Fatalf("gap: %v, want ErrSequence", err)
		}
		if err := s.AppendEvents(ctx, "run-e", []store.Event{{Seq: 2, Data: []byte("x")}}); !errors.Is(err, store.ErrSequence) {
			t.Fatalf("repeat: %v, want ErrSequence", err)
		}
		if err := s.AppendEvents(ctx, "run-e", []store.Event{{Seq: 3, Data: []byte("c")}}); err != nil {
			t.Fatal(err)
		}
		evs, err := s.Events(ctx, "run-e", 1, 0)
		if err != nil || len(evs) != 2 || evs[0].Seq != 2 || string(evs[1].Data) != "c" {
			t.Fatalf("events after 1: %v %v", evs, err)
		}
		evs, err = s.Events(ctx, "run-e", 0, 2)
		if err != nil || len(evs) != 2 || evs[1].Seq != 2 {
			t.Fatalf("limited: %v %v", evs, err)
		}
		if last, err := s.LastSequence(ctx, "run-e"); err != nil || last != 3 {
			t.Fatalf("last: %d %v", last, err)
		}
		if evs, err := s.Events(ctx, "run-none", 0, 0); err != nil || len(evs) != 0 {
			t.Fatalf("no log: %v %v", evs, err)
		}
	})
	t.Run("ConcurrentRuns", func(t *testing.T) {
		s := open(t)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("run-c%d", i)
				if err := s.CreateRun(ctx, mk(id, "acme", i)); err != nil {
					errs <- err
					return
				}
				for seq := uint64(1); seq <= 20; seq++ {
					if err := s.AppendEvents(ctx, id, []store.Event{{Seq: seq, Data: []byte{byte(seq)}}}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for i := range 8 {
			if last, err := s.LastSequence(ctx, fmt.Sprintf("run-c%d", i)); err != nil || last != 20 {
				t.Fatalf("run %d: last %d %v", i, last, err)
			}
		}
	})
}
