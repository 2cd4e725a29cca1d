package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Manager starts and tracks processes. It is safe for concurrent use.
type Manager struct {
	cfg       Config
	log       *zap.Logger
	reaper    *Reaper
	ownReaper bool
	euid      int
	devNull   int // read-only /dev/null for the children's stdin; -1 once closed

	// envMu guards env, the sandbox environment (SetEnvironment).
	envMu sync.RWMutex
	env   map[string]string

	mu          sync.Mutex
	procs       map[string]*proc
	byRequest   map[string]*proc
	pumping     map[*proc]struct{}       // output still open, possibly after the record was forgotten
	exitedQ     []exitedProc             // known exited processes, oldest exit first
	pending     map[string]*pendingStart // Starts in flight, by RequestID
	npending    int                      // Starts in flight, with or without RequestID
	running     int                      // started and not yet reported exited
	closing     bool
	inflight    sync.WaitGroup // Starts in flight; Shutdown waits for them
	workers     sync.WaitGroup // output pumps and exit watchers
	abandon     chan struct{}  // closed when Shutdown gives up waiting
	abandonOnce sync.Once
}

// exitedProc is an entry of Manager.exitedQ.
type exitedProc struct {
	p  *proc
	at time.Time
}

// pendingStart is a Start in flight, so that a concurrent retry with the
// same RequestID waits for it instead of starting a second process.
type pendingStart struct {
	opts StartOptions
	done chan struct{}
}

// NewManager returns a Manager for cfg. When cfg.Reaper is nil it starts a
// private Reaper, stopped by Shutdown.
func NewManager(cfg Config, log *zap.Logger) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	m := &Manager{
		cfg:       cfg,
		log:       log,
		reaper:    cfg.Reaper,
		euid:      os.Geteuid(),
		devNull:   -1,
		procs:     make(map[string]*proc),
		byRequest: make(map[string]*proc),
		pumping:   make(map[*proc]struct{}),
		pending:   make(map[string]*pendingStart),
		abandon:   make(chan struct{}),
	}
	if m.reaper == nil {
		r, err := NewReaper(ReaperOptions{}, log.Named("reaper"))
		if err != nil {
			return nil, err
		}
		m.reaper, m.ownReaper = r, true
	}
	// Best effort: without it every Start opens /dev/null itself.
	if fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		m.devNull = fd
	}
	return m, nil
}

// lookup returns the process with id or a not-found error for op.
func (m *Manager) lookup(op, id string) (*proc, error) {
	m.mu.Lock()
	p := m.procs[id]
	m.mu.Unlock()
	if p == nil {
		return nil, procErrf(op, id, errkind.ErrNotFound, "no such process (it never existed or its exit retention passed)")
	}
	return p, nil
}

// Get describes one process.
func (m *Manager) Get(id string) (Info, error) {
	p, err := m.lookup("get", id)
	if err != nil {
		return Info{}, err
	}
	return p.info(), nil
}

// Running returns the number of processes started and not yet reported
// exited (what MaxProcesses bounds).
func (m *Manager) Running() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.running
}

// List describes every known process, running or exited, oldest first.
func (m *Manager) List() []Info {
	m.mu.Lock()
	ps := slices.Collect(maps.Values(m.procs))
	m.mu.Unlock()
	out := make([]Info, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	slices.SortFunc(out, func(a, b Info) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Wait blocks until the process has exited and returns its status.
func (m *Manager) Wait(ctx context.Context, id string) (ExitStatus, error) {
	p, err := m.lookup("wait", id)
	if err != nil {
		return ExitStatus{}, err
	}
	select {
	case <-p.exited:
		return *p.exitStatus(), nil
	case <-ctx.Done():
		return ExitStatus{}, procErr("wait", id, ctxErr(ctx))
	}
}

// watch reports the exit of p once its leader was reaped and its output
// drained (or the drain grace passed), then schedules its retention.
func (m *Manager) watch(p *proc) {
	defer m.workers.Done()
	if p.pidfd != nil {
		// Collect the exit here, without waiting for the reaper to be
		// woken by SIGCHLD (it collects it when it gets there first).
		defer p.pidfd.Close() // after the exit report
		p.awaitExit()
		m.reaper.collect(p.pid)
	}
	select {
	case <-p.leaderReaped:
	case <-m.abandon:
		return
	}
	p.drainAtExit()
	p.awaitDrain(m.cfg.DrainGrace)
	// Free the slot before anyone can see the exit, so that a client that
	// saw it can start the next process at once.
	m.mu.Lock()
	m.running--
	m.mu.Unlock()
	e := p.finish(time.Now())
	m.cfg.Activity.TouchAt(e.ExitedAt) // CPU its tree used since the last sample is seen no more
	m.log.Info("process exited", zap.String("id", p.id), zap.Int("pid", p.pid),
		zap.Int("code", e.Code), zap.String("signal", e.Signal), zap.Bool("timed_out", e.TimedOut))

	m.mu.Lock()
	if !m.closing {
		p.mu.Lock()
		p.forget = time.AfterFunc(m.cfg.ExitRetention, func() { m.forget(p) })
		p.mu.Unlock()
		i := len(m.exitedQ) // usually the end: exits are recorded in order
		for i > 0 && m.exitedQ[i-1].at.After(e.ExitedAt) {
			i--
		}
		m.exitedQ = slices.Insert(m.exitedQ, i, exitedProc{p, e.ExitedAt})
		m.evictExitedLocked()
	}
	m.mu.Unlock()
	close(p.exited) // last: Wait returns with the bookkeeping done
}

// evictExitedLocked forgets the oldest exited processes beyond MaxExited.
func (m *Manager) evictExitedLocked() {
	for len(m.exitedQ) > m.cfg.MaxExited {
		m.forgetLocked(m.exitedQ[0].p)
	}
}

// forget drops an exited process; its id becomes unknown.
func (m *Manager) forget(p *proc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetLocked(p)
}

func (m *Manager) forgetLocked(p *proc) {
	if m.procs[p.id] == p {
		delete(m.procs, p.id)
	}
	if i := slices.IndexFunc(m.exitedQ, func(x exitedProc) bool { return x.p == p }); i >= 0 {
		m.exitedQ = slices.Delete(m.exitedQ, i, i+1)
	}
	if p.requestID != "" && m.byRequest[p.requestID] == p {
		delete(m.byRequest, p.requestID)
	}
	p.mu.Lock()
	if p.forget != nil {
		p.forget.Stop()
	}
	p.mu.Unlock()
}

// Shutdown refuses new Starts, kills every process group (and every group
// of a PTY session) and waits until all exits are reported and all output
// pumps stopped, or ctx is done. Output still held open by processes that
// escaped their group is closed. It stops the Manager's own Reaper.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	m.inflight.Wait() // Starts in flight finish quickly: they do not wait for the process
	// Killing the groups may orphan processes that escaped them, which the
	// owner of a ReapAll reaper kills next: have them reaped at once.
	m.reaper.reapOrphansPromptly()
	m.mu.Lock()
	if m.devNull >= 0 {
		unix.Close(m.devNull) // no Start uses it any more
		m.devNull = -1
	}
	m.mu.Unlock()

	m.mu.Lock()
	ps := slices.Collect(maps.Values(m.procs))
	for p := range m.pumping {
		if m.procs[p.id] != p {
			ps = append(ps, p) // forgotten, but a background job holds its output
		}
	}
	m.mu.Unlock()
	for _, p := range ps {
		p.release() // exits must not wait for attached readers
		p.mu.Lock()
		if p.forget != nil {
			p.forget.Stop()
		}
		if p.timeout != nil {
			p.timeout.Stop()
		}
		p.mu.Unlock()
		if p.groupMayBeAlive() {
			p.kill(false)
		}
	}
	var err error
	for _, p := range ps {
		select {
		case <-p.exited:
		case <-ctx.Done():
			err = ctxErr(ctx)
		}
		if err != nil {
			break
		}
	}
	if err != nil {
		m.abandonOnce.Do(func() { close(m.abandon) })
	}
	for _, p := range ps {
		p.closeOutputs()
	}
	waited := make(chan struct{})
	go func() { m.workers.Wait(); close(waited) }()
	if err == nil {
		select {
		case <-waited:
		case <-ctx.Done():
			err = ctxErr(ctx)
		}
	}
	if m.ownReaper {
		m.reaper.Close()
	}
	if err != nil {
		return procErr("shutdown", "", err)
	}
	return nil
}

// newID returns a random process id.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "proc_" + hex.EncodeToString(b[:])
}

// SetEnvironment replaces the sandbox environment: variables every process
// started from now on gets, above the base environment and the run_as
// user's identity variables and below the request's own Env. Processes
// already running keep the environment they started with. Nil or empty
// clears it. Nothing is changed when a name or value is invalid.
func (m *Manager) SetEnvironment(env map[string]string) error {
	for k, v := range env {
		if err := checkEnvVar(k, v); err != nil {
			return fmt.Errorf("sandbox environment: %w", err)
		}
	}
	env = maps.Clone(env)
	m.envMu.Lock()
	m.env = env
	m.envMu.Unlock()
	return nil
}

// Environment returns a copy of the sandbox environment (SetEnvironment).
func (m *Manager) Environment() map[string]string {
	m.envMu.RLock()
	defer m.envMu.RUnlock()
	return maps.Clone(m.env)
}
