package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// Egress control for isolated sandboxes: the sandbox keeps bubblewrap's
// empty network namespace (loopback only), and the harness serves an
// egress proxy on a unix socket in the sandbox's run directory, which the
// sandbox sees at the same path. The daemon relays EgressRelayAddr inside
// the sandbox to that socket and points its processes' HTTP(S)_PROXY at
// it. The policy is recorded in the private directory when the sandbox is
// created, so a later harness that reattaches enforces the same one (the
// proxy lives in the harness process: while no harness holds a sandbox,
// its connections out fail, closed).

// EgressRelayAddr is where, inside a sandbox with egress control, the
// daemon relays connections to the harness's proxy (egress.RelayAddr;
// the proxy's socket, egress.SocketName, is in runDir, and the recorded
// policy, egress.PolicyFile, in the private directory).
const EgressRelayAddr = egress.RelayAddr

// checkEgress refuses an egress configuration the isolation cannot
// enforce, and sets up the proxies otherwise.
func (p *Provider) checkEgress() error {
	if p.cfg.Egress == nil {
		return nil
	}
	if p.isolation == IsolationNone {
		return fmt.Errorf("%w: an egress allow list needs isolated sandboxes (bubblewrap): a plain local sandbox shares the host's network and cannot be confined to a proxy", compute.ErrFailedPrecondition)
	}
	if p.cfg.Network {
		return fmt.Errorf("%w: an egress allow list and Network (the host's network) contradict each other", compute.ErrInvalidArgument)
	}
	if _, err := p.cfg.Egress.Policy.Normalized(); err != nil {
		return fmt.Errorf("%w: %v", compute.ErrInvalidArgument, err)
	}
	return nil
}

// egressServers returns the provider's proxies (made on first use).
func (p *Provider) egressServers() *egress.Servers {
	p.egressOnce.Do(func() {
		var base egress.Options
		if p.cfg.Egress != nil {
			base = *p.cfg.Egress
		}
		p.egress = egress.NewServers(base, p.log)
	})
	return p.egress
}

// startEgress records the configured policy in dir, serves it on the
// sandbox's socket and returns the daemon's flags for the relay.
func (p *Provider) startEgress(dir string) ([]string, error) {
	if err := egress.WritePolicyFile(filepath.Join(dir, egress.PolicyFile), p.cfg.Egress.Policy); err != nil {
		return nil, err
	}
	socket := filepath.Join(dir, runDir, egress.SocketName)
	// The daemon (root, the sandbox's root in its user namespace, or the
	// harness's user) is the one that connects: see giveEgressSocket.
	if err := p.egressServers().Start(dir, socket, p.cfg.Egress.Policy, 0o600); err != nil {
		return nil, err
	}
	if err := p.giveEgressSocket(dir, socket); err != nil {
		return nil, err
	}
	return egress.RelayArgs(socket), nil
}

// resumeEgress serves the policy recorded in dir, if any, unless this
// provider serves it already. A sandbox created without egress control
// gets none.
func (p *Provider) resumeEgress(dir string) error {
	pol, ok, err := egress.ReadPolicyFile(filepath.Join(dir, egress.PolicyFile))
	if err != nil || !ok || p.egressServers().Serving(dir) {
		return err
	}
	socket := filepath.Join(dir, runDir, egress.SocketName)
	if err := p.egressServers().Start(dir, socket, pol, 0o600); err != nil {
		return err
	}
	return p.giveEgressSocket(dir, socket)
}

// giveEgressSocket gives the proxy's socket to the account whose daemon
// connects to it when that is not root: the sandbox's root in a sandbox
// with a user namespace of its own (the host id base recorded in dir, see
// userns.go), or the gVisor sandbox account recorded in dir. Only earlier
// versions ran a gVisor daemon as such an account; Launch drops the record
// (gvisorForgetAccount) before it starts the proxy.
func (p *Provider) giveEgressSocket(dir, socket string) error {
	uid, ok := gvisorOwner(dir)
	if base, has, err := readIDBase(dir); err != nil {
		return fmt.Errorf("egress proxy socket: %w", err)
	} else if has {
		uid, ok = int(base), true
	}
	if ok {
		if err := os.Lchown(socket, uid, uid); err != nil {
			return fmt.Errorf("egress proxy socket: %w", err)
		}
	}
	return nil
}

// forgetEgress drops the policy recorded in dir (a sandbox replaced by
// one without egress control).
func (p *Provider) forgetEgress(dir string) {
	if err := os.Remove(filepath.Join(dir, egress.PolicyFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		p.log.Warn("cannot remove a replaced sandbox's egress policy", zap.String("dir", dir), zap.Error(err))
	}
}

// stopEgress stops dir's proxy, if this provider serves one.
func (p *Provider) stopEgress(dir string) { p.egressServers().Stop(dir) }

// EgressStats returns the counters of the proxy serving the sandbox in
// dir, and whether this provider serves one.
func (p *Provider) EgressStats(dir string) (egress.Stats, bool) {
	return p.egressServers().Stats(filepath.Clean(dir))
}

// Close stops every egress proxy this provider serves. Sandboxes keep
// running (with no way out until a harness reattaches). Idempotent.
func (p *Provider) Close() error { return p.egressServers().Close() }
