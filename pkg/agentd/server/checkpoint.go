package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/peer"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// The server's part of a checkpoint (see agentd's checkpoint.go): its
// listeners are reopenables, which close their socket and every
// connection they accepted for a checkpoint while gRPC keeps serving them
// (Accept waits), and listen again at the same address after it.

// ResumeSignal brings a daemon closed for a checkpoint back (Run listens
// for it; at any other time it does nothing).
const ResumeSignal = syscall.SIGUSR1

// hangUpWait bounds how long the daemon waits, after answering
// PrepareCheckpoint, for the caller to hang up before it closes the
// connection itself (the answer must leave first).
const hangUpWait = 500 * time.Millisecond

// PrepareCheckpoint answers, then closes what the daemon holds of the
// host once the caller hung up (see agentd.Daemon.PrepareCheckpoint).
func (s *systemService) PrepareCheckpoint(ctx context.Context, req *agentdv1.PrepareCheckpointRequest) (*agentdv1.PrepareCheckpointResponse, error) {
	if s.metricsUnix {
		return nil, errmap.ToStatus(fmt.Errorf("%w: the daemon serves metrics on a unix socket, which a checkpoint cannot save", errkind.ErrFailedPrecondition))
	}
	closeAll, err := s.d.PrepareCheckpoint(req.GetResumeAfter().AsDuration())
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	caller := callerConn(ctx)
	go func() {
		waitHangUp(caller, hangUpWait)
		closeAll()
	}()
	return &agentdv1.PrepareCheckpointResponse{}, nil
}

// callerConn is the connection a call came on, when a connLimiter
// accepted it (nil otherwise).
func callerConn(ctx context.Context) *limitedConn {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(connAddr); ok {
			return a.c
		}
	}
	return nil
}

// waitHangUp waits until c is closed (the caller hung up once it had the
// answer), at most max.
func waitHangUp(c *limitedConn, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if c != nil && c.closed.Load() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reopenable is a listener that can close its socket and the connections
// it accepted for a checkpoint and listen again at the same address,
// while the server keeps calling Accept (which waits meanwhile).
type reopenable struct {
	network, addr string
	log           *zap.Logger

	mu    sync.Mutex
	cur   net.Listener // nil while closed for a checkpoint
	open  chan struct{}
	done  chan struct{} // closed by Close
	shut  bool
	conns map[net.Conn]struct{}
	prune int // prune closed connections from conns at this size
}

func newReopenable(network, addr string, l net.Listener, log *zap.Logger) *reopenable {
	r := &reopenable{network: network, addr: addr, log: log, cur: l, done: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, prune: 64}
	r.keepSocket(l)
	return r
}

// keepSocket makes closing l leave its unix socket file: suspend removes
// it last, once nothing of the listener is open.
func (r *reopenable) keepSocket(l net.Listener) {
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
}

// Accept returns the next connection; while the listener is closed for a
// checkpoint it waits.
func (r *reopenable) Accept() (net.Conn, error) {
	for {
		r.mu.Lock()
		cur, open, shut := r.cur, r.open, r.shut
		r.mu.Unlock()
		switch {
		case shut:
			return nil, net.ErrClosed
		case cur == nil:
			select {
			case <-open:
			case <-r.done:
			}
			continue
		}
		c, err := cur.Accept()
		r.mu.Lock()
		current := r.cur == cur && !r.shut
		if err == nil && current {
			r.track(c)
		}
		r.mu.Unlock()
		switch {
		case err != nil && current:
			return nil, err
		case err != nil:
			continue // closed for a checkpoint, or reopened since
		case !current:
			_ = c.Close()
			continue
		}
		return c, nil
	}
}

// track records an accepted connection (r.mu held), dropping the closed
// ones now and then.
func (r *reopenable) track(c net.Conn) {
	r.conns[c] = struct{}{}
	if len(r.conns) < r.prune {
		return
	}
	for k := range r.conns {
		if connClosed(k) {
			delete(r.conns, k)
		}
	}
	r.prune = max(64, 2*len(r.conns))
}

// connClosed reports whether c was closed.
func connClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return raw.Control(func(uintptr) {}) != nil
}

// suspend closes the listener's socket and every connection it accepted,
// removing a unix socket's file last.
func (r *reopenable) suspend() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil || r.shut {
		return nil
	}
	err := r.cur.Close() // waits until the descriptor is closed
	r.cur, r.open = nil, make(chan struct{})
	for c := range r.conns {
		_ = c.Close()
	}
	clear(r.conns)
	if r.network == "unix" {
		if rerr := os.Remove(r.addr); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close %s://%s: %w", r.network, r.addr, err)
	}
	return nil
}

// reopen listens again at the address.
func (r *reopenable) reopen() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil || r.shut {
		return nil
	}
	ls, err := listenAll([]string{r.network + "://" + r.addr})
	if err != nil {
		return err
	}
	r.keepSocket(ls[0])
	r.cur = ls[0]
	close(r.open)
	r.log.Info("listening again", zap.String("address", r.network+"://"+r.addr))
	return nil
}

// Close closes the listener for good (the server stops).
func (r *reopenable) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return nil
	}
	r.shut = true
	close(r.done)
	if r.cur == nil {
		return nil
	}
	err := r.cur.Close()
	if r.network == "unix" {
		_ = os.Remove(r.addr)
	}
	return err
}

// Addr is the address listened at.
func (r *reopenable) Addr() net.Addr {
	if r.network == "unix" {
		return &net.UnixAddr{Net: "unix", Name: r.addr}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		return r.cur.Addr()
	}
	a, _ := net.ResolveTCPAddr("tcp", r.addr)
	return a
}

// checkpointHooks close and reopen listeners for d's checkpoints; a
// listener that cannot listen again is sent to fatal.
func checkpointHooks(ls []*reopenable, fatal chan<- error) agentd.CheckpointHooks {
	return agentd.CheckpointHooks{
		Close: func() error {
			var errs []error
			for _, l := range ls {
				errs = append(errs, l.suspend())
			}
			return errors.Join(errs...)
		},
		Reopen: func() error {
			var errs []error
			for _, l := range ls {
				errs = append(errs, l.reopen())
			}
			err := errors.Join(errs...)
			if err != nil {
				select {
				case fatal <- err:
				default:
				}
			}
			return err
		},
	}
}

// resumeOnSignal brings d back from a checkpoint on every ResumeSignal
// until stop is called.
func resumeOnSignal(d *agentd.Daemon, log *zap.Logger) (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, ResumeSignal)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				if resumed, err := d.ResumeFromCheckpoint(); err != nil {
					log.Error("coming back from a checkpoint", zap.Error(err))
				} else if !resumed {
					log.Debug("SIGUSR1 while not prepared for a checkpoint: nothing to do")
				}
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(sig); close(done) }
}

// checkpointable makes the listeners Run serves (in the order of
// cfg.Listen) reopenables, and gives the daemon its checkpoint hooks; a
// listener that cannot listen again after a checkpoint is sent to fatal.
func (s *Server) checkpointable(cfg Config, ls []net.Listener, fatal chan<- error) []net.Listener {
	out := make([]net.Listener, len(ls))
	ros := make([]*reopenable, len(ls))
	for i, l := range ls {
		network, addr, _ := parseListen(cfg.Listen[i]) // checked by Validate
		ros[i] = newReopenable(network, addr, l, s.log)
		out[i] = ros[i]
	}
	if cfg.MetricsListen != "" {
		network, _, _ := parseMetricsListen(cfg.MetricsListen)
		s.system.metricsUnix = network == "unix"
	}
	s.Daemon.SetCheckpointHooks(checkpointHooks(ros, fatal))
	return out
}
