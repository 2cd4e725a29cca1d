package agentclient_test

// Calls that end a server stream before its trailers arrive (Exec at the
// exit, Follow at the exit or when the callback fails, ReadFile when the
// destination fails, Archive at its stats) must release the stream; grpc-go
// otherwise keeps a goroutine per call until the caller's context ends.

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("destination full") }

func TestStreamsEndedEarlyAreReleased(t *testing.T) {
	ctx := context.Background() // long-lived, as in a server embedding the client
	d := agentdtest.Start(t, nil)
	c := d.Client
	if _, err := c.WriteFile(ctx, "f.txt", agentclient.WriteFileOptions{}, bytes.NewReader(bytes.Repeat([]byte("x"), 1<<20))); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Exec": func() error {
			_, err := c.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"/bin/true"}}, agentclient.ExecOptions{}, nil)
			return err
		},
		"Follow": func() error {
			st, err := c.Start(ctx, agentclient.ProcessSpec{Argv: []string{"/bin/true"}}, agentclient.StartOptions{})
			if err != nil {
				return err
			}
			_, err = c.Follow(ctx, st.Process.ProcessID, agentclient.FollowOptions{}, func(*agentclient.Output) error { return nil })
			return err
		},
		"Follow stopped by its callback": func() error {
			st, err := c.Start(ctx, agentclient.ProcessSpec{Command: "echo hi; sleep 30"}, agentclient.StartOptions{})
			if err != nil {
				return err
			}
			defer c.Signal(ctx, st.Process.ProcessID, "KILL")
			stop := errors.New("enough")
			_, err = c.Follow(ctx, st.Process.ProcessID, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
				if len(m.Chunks) > 0 {
					return stop
				}
				return nil
			})
			if !errors.Is(err, stop) {
				return err
			}
			return nil
		},
		"ReadFile into a failing writer": func() error {
			if _, err := c.ReadFile(ctx, "f.txt", agentclient.ReadFileOptions{}, failingWriter{}); err == nil {
				return errors.New("ReadFile into a failing writer succeeded")
			}
			return nil
		},
		"Archive": func() error {
			_, err := c.Archive(ctx, agentclient.ArchiveOptions{}, new(bytes.Buffer))
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); err != nil { // warm up: connection, pools
				t.Fatal(err)
			}
			before := settledGoroutines(-1)
			const n = 20
			for range n {
				if err := call(); err != nil {
					t.Fatal(err)
				}
			}
			if after := settledGoroutines(before); after > before+n/2 {
				t.Fatalf("%d calls left %d goroutines behind (%d before, %d after)", n, after-before, before, after)
			}
		})
	}
}

// settledGoroutines waits up to 2 s for the goroutine count to come down to
// target (or, with target < 0, to stop changing) and returns it.
func settledGoroutines(target int) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if target >= 0 && m <= target || target < 0 && m == n {
			return m
		}
		n = m
	}
	return n
}
