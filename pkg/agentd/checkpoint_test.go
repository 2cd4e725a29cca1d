package agentd

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestEgressRelayPause: paused for a checkpoint, the relay holds no
// connection to the proxy's socket (those open are closed, and a
// connection made meanwhile waits without dialing); resumed, the waiting
// connection goes through.
func TestEgressRelayPause(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	var accepted, open atomic.Int32
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			open.Add(1)
			go func() {
				defer open.Add(-1)
				defer c.Close()
				_, _ = io.Copy(c, c) // echo until EOF
			}()
		}
	}()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().String()
	free.Close()
	rl, err := startRelay(EgressRelay{Listen: port, Socket: sock}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer rl.close()
	echo := func(c net.Conn, msg string) error {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != msg {
			return errors.New("echo: " + string(got))
		}
		return nil
	}
	before, err := net.Dial("tcp", port)
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	if err := echo(before, "one"); err != nil {
		t.Fatal(err)
	}
	rl.pause()
	waitFor(t, "the proxy connection to close", func() bool { return open.Load() == 0 })
	_ = before.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := before.Read(make([]byte, 1)); err == nil {
		t.Fatal("a relayed connection outlived the pause")
	}
	during, err := net.Dial("tcp", port)
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close()
	if _, err := during.Write([]byte("two")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := accepted.Load(); n != 1 {
		t.Fatalf("the paused relay dialed the proxy (%d connections)", n)
	}
	rl.resume()
	got := make([]byte, 3)
	_ = during.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(during, got); err != nil || string(got) != "two" {
		t.Fatalf("the connection made during the pause: %q, %v", got, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPrepareCheckpoint: the daemon's checkpoint states. The lease is
// checked, preparing twice is refused, close runs the server's hook once
// the caller was answered, a resume reopens (and one at any other time
// does nothing), and the lease brings the daemon back by itself.
func TestPrepareCheckpoint(t *testing.T) {
	cfg := DefaultConfig()
	cfg.WorkspaceRoot = t.TempDir()
	cfg.EtcRoot = t.TempDir()
	cfg.ReapAll = false
	d, err := New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(t.Context())
	var closes, reopens atomic.Int32
	d.SetCheckpointHooks(CheckpointHooks{
		Close:  func() error { closes.Add(1); return nil },
		Reopen: func() error { reopens.Add(1); return nil },
	})
	for _, bad := range []time.Duration{-time.Second, MaxCheckpointLease + time.Second} {
		if _, err := d.PrepareCheckpoint(bad); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("lease %s: %v", bad, err)
		}
	}
	if resumed, err := d.ResumeFromCheckpoint(); resumed || err != nil {
		t.Fatalf("a resume while serving: %v, %v", resumed, err)
	}
	closeAll, err := d.PrepareCheckpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.PrepareCheckpoint(0); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("a second prepare: %v", err)
	}
	if closes.Load() != 0 {
		t.Fatal("closed before the caller was answered")
	}
	closeAll()
	if closes.Load() != 1 {
		t.Fatalf("closes %d", closes.Load())
	}
	if resumed, err := d.ResumeFromCheckpoint(); !resumed || err != nil || reopens.Load() != 1 {
		t.Fatalf("resume: %v, %v, reopens %d", resumed, err, reopens.Load())
	}
	// Resumed before it closed: nothing is closed at all.
	closeAll, err = d.PrepareCheckpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	if resumed, _ := d.ResumeFromCheckpoint(); !resumed {
		t.Fatal("a reserved checkpoint was not resumed")
	}
	closeAll()
	if closes.Load() != 1 || reopens.Load() != 1 {
		t.Fatalf("closes %d, reopens %d after a checkpoint called off", closes.Load(), reopens.Load())
	}
	// The lease.
	closeAll, err = d.PrepareCheckpoint(100 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	closeAll()
	waitFor(t, "the lease to reopen", func() bool { return reopens.Load() == 2 })
	if _, err := d.PrepareCheckpoint(0); err != nil {
		t.Fatalf("prepare after the lease: %v", err)
	}
}
