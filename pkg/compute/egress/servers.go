package egress

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"

	"go.uber.org/zap"
)

// Servers runs one proxy per sandbox, each on a unix socket the sandbox
// can reach, for a provider. Safe for concurrent use.
type Servers struct {
	base Options
	log  *zap.Logger

	mu sync.Mutex
	m  map[string]*serving
}

// serving is one sandbox's proxy at work.
type serving struct {
	proxy  *Proxy
	socket string
	done   chan struct{}
}

// NewServers returns a set of proxies configured like base (its Policy
// and Name are replaced per sandbox).
func NewServers(base Options, log *zap.Logger) *Servers {
	if log == nil {
		log = zap.NewNop()
	}
	return &Servers{base: base, log: log, m: map[string]*serving{}}
}

// Start serves pol for the sandbox key on a unix socket at path (a stale
// socket there is replaced; anything else is refused), with the socket's
// permission bits set to mode. A proxy already serving key is stopped
// first.
func (s *Servers) Start(key, path string, pol Policy, mode fs.FileMode) error {
	s.Stop(key)
	opts := s.base
	opts.Policy, opts.Name = pol, key
	proxy, err := New(opts, s.log)
	if err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return fmt.Errorf("egress socket %s exists and is not a socket", path)
		}
		_ = os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("egress proxy: listen: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		_ = l.Close()
		return fmt.Errorf("egress proxy: socket mode: %w", err)
	}
	sv := &serving{proxy: proxy, socket: path, done: make(chan struct{})}
	go func() {
		defer close(sv.done)
		if err := proxy.Serve(context.Background(), l); err != nil {
			s.log.Warn("egress proxy stopped", zap.String("sandbox", key), zap.Error(err))
		}
	}()
	s.mu.Lock()
	s.m[key] = sv
	s.mu.Unlock()
	s.log.Debug("egress proxy serving", zap.String("sandbox", key), zap.String("allow", pol.String()))
	return nil
}

// Serving reports whether a proxy serves key.
func (s *Servers) Serving(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key] != nil
}

// Stats returns the counters of key's proxy, if one serves it.
func (s *Servers) Stats(key string) (Stats, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv := s.m[key]; sv != nil {
		return sv.proxy.Stats(), true
	}
	return Stats{}, false
}

// Stop stops key's proxy, if one serves it, closing its connections, and
// removes its socket.
func (s *Servers) Stop(key string) {
	s.mu.Lock()
	sv := s.m[key]
	delete(s.m, key)
	s.mu.Unlock()
	if sv == nil {
		return
	}
	_ = sv.proxy.Close()
	<-sv.done
	_ = os.Remove(sv.socket)
}

// Close stops every proxy. Idempotent.
func (s *Servers) Close() error {
	s.mu.Lock()
	keys := make([]string, 0, len(s.m))
	for k := range s.m {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		s.Stop(k)
	}
	return nil
}

// WritePolicyFile records pol at path (0600, by rename), so that a later
// harness enforces the same policy for the same sandbox.
func WritePolicyFile(path string, pol Policy) error {
	data, err := pol.Marshal()
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("record the egress policy: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("record the egress policy: %w", err)
	}
	return nil
}

// ReadPolicyFile reads a policy WritePolicyFile recorded; ok is false
// when there is none (a sandbox without egress control).
func ReadPolicyFile(path string) (pol Policy, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Policy{}, false, nil
	}
	if err != nil {
		return Policy{}, false, fmt.Errorf("read the egress policy: %w", err)
	}
	pol, err = UnmarshalPolicy(data)
	if err != nil {
		return Policy{}, false, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return pol, true, nil
}
