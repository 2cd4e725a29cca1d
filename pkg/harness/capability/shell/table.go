package shell

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// errClosed reports a call made after the run's Close.
var errClosed = errors.New("shell: the run's process table is closed")

// proc is one process of the table.
type proc struct {
	id  int // the session ID the model sees
	tty bool

	// mu is held by the call using the process; it guards the fields below.
	mu      chan struct{}
	cursor  int64 // next output byte to return to the model
	emitted int64 // output already sent to progress callbacks
	stdin   int64 // stdin offset of the next byte to write
	// stdinUnknown is set when a write failed midway: the daemon's stdin
	// offset must be read back before the next write.
	stdinUnknown bool

	// Guarded by Shell.mu (written only by the call holding mu):
	agent    *agentclient.Client
	pid      string // the daemon's process ID; "" until started
	lastUsed uint64
	gone     bool // dropped from the table (pruned, exited or closed)
}

// lock acquires p for one call, or fails when ctx ends first.
func (p *proc) lock(ctx context.Context) error {
	select {
	case p.mu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlock releases p.
func (p *proc) unlock() { <-p.mu }

// reserve adds a process that is about to start to the table, under a new
// session ID, dropping (and killing) another one first when the table is
// full. The new entry is returned locked.
func (s *Shell) reserve(ctx context.Context, call tool.Context, tty bool) (*proc, error) {
	log := logger(call)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		if len(s.procs) < s.opts.MaxProcesses {
			p := &proc{agent: call.Agent, tty: tty, mu: make(chan struct{}, 1)}
			p.mu <- struct{}{}
			for {
				p.id = s.sessionID()
				if _, taken := s.procs[p.id]; !taken {
					break
				}
			}
			s.seq++
			p.lastUsed = s.seq
			s.procs[p.id] = p
			n := len(s.procs)
			s.mu.Unlock()
			if n >= warnProcesses {
				log.Warn("shell process table is nearly full", zap.Int("processes", n), zap.Int("limit", s.opts.MaxProcesses))
			}
			return p, nil
		}
		s.mu.Unlock()
		// Full: learn which processes exited, then drop one.
		exited := s.exitedSet(ctx, call.Agent, log)
		s.mu.Lock()
		victim := s.pruneCandidate(exited)
		var pid string
		if victim != nil {
			victim.gone = true
			pid = victim.pid
			delete(s.procs, victim.id)
		}
		s.mu.Unlock()
		if victim == nil {
			return nil, errors.New("shell: the process table is full and no process can be dropped")
		}
		log.Info("shell process table full; dropping a session", zap.Int("session_id", victim.id))
		if err := killProcess(ctx, victim.agent, pid); err != nil {
			log.Warn("kill dropped shell session", zap.Int("session_id", victim.id), zap.Error(err))
		}
	}
}

// exitedSet returns the daemon IDs of processes that have exited.
func (s *Shell) exitedSet(ctx context.Context, agent *agentclient.Client, log *zap.Logger) map[string]bool {
	list, err := agent.List(ctx)
	if err != nil {
		log.Warn("list sandbox processes", zap.Error(err))
		return nil
	}
	out := make(map[string]bool)
	for _, in := range list {
		if in.State == agentclient.ProcessExited {
			out[in.ProcessID] = true
		}
	}
	return out
}

// pruneCandidate picks the process to drop from a full table: never one of
// the protectedRecent most recently used; the least recently used exited
// one if any, else the least recently used. s.mu must be held.
func (s *Shell) pruneCandidate(exited map[string]bool) *proc {
	all := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		all = append(all, p)
	}
	slices.SortFunc(all, func(a, b *proc) int { return cmp.Compare(a.lastUsed, b.lastUsed) })
	// A table smaller than the reference's keeps at least one prunable.
	protect := min(protectedRecent, s.opts.MaxProcesses-1)
	candidates := all[:max(0, len(all)-protect)]
	for _, p := range candidates {
		if exited[p.pid] {
			return p
		}
	}
	if len(candidates) > 0 {
		return candidates[0]
	}
	return nil
}

// lookup returns the process with session ID id, or nil.
func (s *Shell) lookup(id int) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[id]
}

// touch marks p as just used.
func (s *Shell) touch(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	p.lastUsed = s.seq
}

// remove drops p from the table (it exited, or never started). p must be
// locked by the caller.
func (s *Shell) remove(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.gone = true
	if s.procs[p.id] == p {
		delete(s.procs, p.id)
	}
}

// isGone reports whether p was dropped from the table. p must be locked.
func (s *Shell) isGone(p *proc) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p.gone
}

// started records p's daemon process ID. It reports false when p was
// dropped from the table meanwhile (the run closed, or pruning chose it):
// the caller must then kill the process.
func (s *Shell) started(p *proc, pid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.pid = pid
	return !p.gone
}

// useAgent makes p use the run's current daemon client (the run may have
// reconnected since the process started). p must be locked.
func (s *Shell) useAgent(p *proc, agent *agentclient.Client) {
	if agent == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p.agent = agent
}
