package agentd

import (
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Checkpoints: a harness can save the whole sandbox, its memory and
// processes (gVisor's `runsc checkpoint`), and restore it later. gVisor
// cannot save a socket of the host's (a unix socket made through runsc
// --host-uds, or a connection accepted on one): the daemon's listeners,
// the harness's connections and the egress relay's connections to the
// harness's proxy are all such sockets. So, asked to prepare
// (PrepareCheckpoint), the daemon closes every one of them and holds none
// until it is told to come back (ResumeFromCheckpoint: SIGUSR1 after the
// restore, or the lease running out when no checkpoint came), when it
// listens again at the same addresses. Processes, their output and
// cursors, the workspace and the token are untouched.

// Bounds of PrepareCheckpoint's lease: how long the daemon stays closed
// when no checkpoint comes.
const (
	DefaultCheckpointLease = 60 * time.Second
	MaxCheckpointLease     = 10 * time.Minute
)

// CheckpointHooks close and reopen what the daemon's server holds of the
// host: its listeners and its connections.
type CheckpointHooks struct {
	// Close closes every connection and listener (unix sockets removed
	// last); once it returns, the server holds no socket of the host's.
	Close func() error
	// Reopen listens again at the same addresses. Its error is the
	// server's to act on (a daemon that cannot listen serves nobody).
	Reopen func() error
}

// Checkpoint states.
const (
	ckptServing  = iota // normal
	ckptReserved        // PrepareCheckpoint answered; not closed yet
	ckptClosed          // closed for a checkpoint
)

// checkpointGate is the daemon's checkpoint state.
type checkpointGate struct {
	mu    sync.Mutex
	state int
	timer *time.Timer
	hooks CheckpointHooks
}

// SetCheckpointHooks gives the daemon its server's listeners to close for
// a checkpoint. Without hooks only the egress relay is closed.
func (d *Daemon) SetCheckpointHooks(h CheckpointHooks) {
	d.ckpt.mu.Lock()
	defer d.ckpt.mu.Unlock()
	d.ckpt.hooks = h
}

// PrepareCheckpoint reserves a checkpoint: it checks lease (0 means
// DefaultCheckpointLease) and that no checkpoint is being prepared, and
// returns close, which closes what the daemon holds of the host and must
// be called once the caller has been answered. From then on the daemon
// stays closed until ResumeFromCheckpoint, which runs by itself once the
// lease has passed.
func (d *Daemon) PrepareCheckpoint(lease time.Duration) (close func(), err error) {
	switch {
	case lease < 0 || lease > MaxCheckpointLease:
		return nil, fmt.Errorf("%w: checkpoint lease %s: want 0 (the default, %s) to %s", errkind.ErrInvalidArgument, lease, DefaultCheckpointLease, MaxCheckpointLease)
	case lease == 0:
		lease = DefaultCheckpointLease
	}
	g := &d.ckpt
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != ckptServing {
		return nil, fmt.Errorf("%w: a checkpoint is being prepared already (the daemon comes back on SIGUSR1)", errkind.ErrFailedPrecondition)
	}
	g.state = ckptReserved
	return func() { d.closeForCheckpoint(lease) }, nil
}

// closeForCheckpoint closes the relay's connections to the host, then the
// server's connections and listeners, and arms the lease.
func (d *Daemon) closeForCheckpoint(lease time.Duration) {
	g := &d.ckpt
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != ckptReserved {
		return // resumed before it closed anything
	}
	start := time.Now()
	if d.relay != nil {
		d.relay.pause()
	}
	var err error
	if g.hooks.Close != nil {
		err = g.hooks.Close()
	}
	g.state = ckptClosed
	g.timer = time.AfterFunc(lease, func() {
		if resumed, err := d.ResumeFromCheckpoint(); resumed {
			d.log.Warn("no checkpoint came within the lease: listening again", zap.Duration("lease", lease), zap.Error(err))
		}
	})
	if err != nil {
		d.log.Error("closing for a checkpoint", zap.Error(err))
		return
	}
	d.log.Info("closed for a checkpoint: holding no socket of the host's until SIGUSR1", zap.Duration("took", time.Since(start)), zap.Duration("lease", lease))
}

// ResumeFromCheckpoint brings the daemon back after a checkpoint (or
// after a prepared one that never came): its server listens again and the
// egress relay connects again. It reports whether the daemon was prepared
// (a call at any other time does nothing). Its error is Reopen's.
func (d *Daemon) ResumeFromCheckpoint() (resumed bool, err error) {
	g := &d.ckpt
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case ckptServing:
		return false, nil
	case ckptReserved:
		g.state = ckptServing
		return true, nil
	}
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	if g.hooks.Reopen != nil {
		err = g.hooks.Reopen()
	}
	if d.relay != nil {
		d.relay.resume()
	}
	g.state = ckptServing
	if err != nil {
		return true, fmt.Errorf("listen again after a checkpoint: %w", err)
	}
	d.log.Info("back from a checkpoint: listening again")
	return true, nil
}

// stopCheckpointLease stops a pending lease (the daemon shuts down).
func (d *Daemon) stopCheckpointLease() {
	g := &d.ckpt
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
}
