package process

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestNoLeakedGoroutinesOrFDs(t *testing.T) {
	// Warm up process-wide singletons (the os/signal watcher goroutine).
	if r, err := NewReaper(ReaperOptions{}, nil); err == nil {
		r.Close()
	}
	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	m, err := NewManager(Config{DrainGrace: 100 * time.Millisecond}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	run(t, m, StartOptions{Command: "echo out; echo err >&2"})
	run(t, m, StartOptions{Command: "stty size", TTY: true})
	run(t, m, StartOptions{Command: "sleep 1000 & echo bg"}) // lingering holder
	in := mustStart(t, m, StartOptions{Argv: []string{"cat"}, Stdin: true})
	m.WriteStdin(ctx, in.ID, 0, []byte("x"))
	mustStart(t, m, StartOptions{Argv: []string{"sleep", "1000"}, TTY: true})
	mustStart(t, m, StartOptions{Argv: []string{"sleep", "1000"}, Timeout: time.Hour})
	m.Start(ctx, StartOptions{Argv: []string{"no-such-binary-xyz"}})
	m.Start(ctx, StartOptions{Argv: []string{"true"}, Dir: "/no/such/dir"})
	go m.Read(ctx, in.ID, 1, time.Hour, 0) // a reader blocked at Shutdown

	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "goroutines and fds to be released", func() bool {
		return runtime.NumGoroutine() <= goroutines && openFDs(t) <= fds
	})
}

func TestConcurrentUse(t *testing.T) {
	m := newTestManager(t, Config{MaxProcesses: 200, OutputBufferBytes: 8 << 10})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			info, err := m.Start(ctx, StartOptions{Argv: []string{"cat"}, Stdin: true, TTY: i%2 == 0})
			if err != nil {
				t.Error(err)
				return
			}
			var inner sync.WaitGroup
			inner.Go(func() {
				var off int64
				for range 50 {
					off, err = m.WriteStdin(ctx, info.ID, off, []byte("some line of text\n"))
					if err != nil {
						t.Error(err)
						return
					}
				}
				if info.TTY {
					m.WriteStdin(ctx, info.ID, off, []byte("\x04"))
				} else {
					m.CloseStdin(info.ID)
				}
			})
			inner.Go(func() {
				for range 20 {
					m.List()
					m.Get(info.ID)
					m.Signal(info.ID, "CONT")
					if info.TTY {
						m.Resize(info.ID, 10, 10)
					}
				}
			})
			inner.Go(func() { collect(t, m, info.ID) })
			inner.Go(func() { collect(t, m, info.ID) })
			inner.Wait()
			if _, err := m.Wait(ctx, info.ID); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}
