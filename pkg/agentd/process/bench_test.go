package process

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/zap"
)

func benchManager(b *testing.B) *Manager {
	m, err := NewManager(Config{MaxProcesses: 1024}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Shutdown(context.Background()) })
	return m
}

// BenchmarkStartWaitTrue starts /bin/true through the Manager and waits.
func BenchmarkStartWaitTrue(b *testing.B) {
	m := benchManager(b)
	ctx := context.Background()
	for b.Loop() {
		info, err := m.Start(ctx, StartOptions{Argv: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Wait(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirectExecTrue is the baseline: os/exec runs /bin/true.
func BenchmarkDirectExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

const streamBytes = 256 << 20

// BenchmarkStreamRead moves 256 MiB of output through the ring and a Read
// loop; bytes the reader missed are reported as dropped/op.
func BenchmarkStreamRead(b *testing.B) {
	m := benchManager(b)
	ctx := context.Background()
	b.SetBytes(streamBytes)
	var dropped int64
	for b.Loop() {
		info, err := m.Start(ctx, StartOptions{Argv: []string{"head", "-c", "268435456", "/dev/zero"}})
		if err != nil {
			b.Fatal(err)
		}
		var cursor int64
		for {
			r, err := m.Read(ctx, info.ID, cursor, time.Second, 1<<20)
			if err != nil {
				b.Fatal(err)
			}
			dropped += r.Dropped
			cursor = r.NextCursor
			if r.Exit != nil {
				break
			}
		}
		if cursor != streamBytes {
			b.Fatalf("cursor %d", cursor)
		}
	}
	b.ReportMetric(float64(dropped)/float64(b.N), "dropped/op")
}

// BenchmarkStreamAttach moves 256 MiB of output through the ring to an
// attached follower (flow control: nothing may be dropped).
func BenchmarkStreamAttach(b *testing.B) {
	m := benchManager(b)
	ctx := context.Background()
	b.SetBytes(streamBytes)
	for b.Loop() {
		info, err := m.Start(ctx, StartOptions{Argv: []string{"head", "-c", "268435456", "/dev/zero"}})
		if err != nil {
			b.Fatal(err)
		}
		var got, dropped int64
		if err := m.Attach(ctx, info.ID, 0, func(r ReadResult) error {
			dropped += r.Dropped
			for _, c := range r.Chunks {
				got += int64(len(c.Data))
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if got != streamBytes || dropped != 0 {
			b.Fatalf("got %d, dropped %d", got, dropped)
		}
	}
}

// BenchmarkStreamPipe is the baseline: the same output read from a plain
// pipe by os/exec.
func BenchmarkStreamPipe(b *testing.B) {
	b.SetBytes(streamBytes)
	buf := make([]byte, 1<<20)
	for b.Loop() {
		cmd := exec.Command("head", "-c", "268435456", "/dev/zero")
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, out, buf)
		if err != nil || n != streamBytes {
			b.Fatalf("copied %d: %v", n, err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}
