package docker

import (
	"fmt"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// Egress control: the container keeps network "none" (no interface but
// loopback: stronger than an internal Docker network, which would still
// put the sandbox on a bridge with other containers and need a proxy
// container joined to it). The harness serves an egress proxy on a unix
// socket in the sandbox's run directory, which the container sees at
// /run/bulkhead/egress.sock; sandbox-agentd relays EgressRelayAddr inside
// the container to it and points its processes' HTTP(S)_PROXY there. The
// policy is recorded in the private directory at creation, so a harness
// that reattaches later enforces the same one; while no harness holds the
// sandbox, its connections out fail, closed.

// EgressRelayAddr is where, inside a container with egress control, the
// daemon relays connections to the harness's proxy (egress.RelayAddr;
// the proxy's socket, egress.SocketName, is in the run directory, and the
// recorded policy, egress.PolicyFile, in the private directory, which is
// not mounted).
const EgressRelayAddr = egress.RelayAddr

// checkEgress refuses an egress configuration the network mode defeats.
func checkEgress(eg *egress.Options, network string) error {
	if eg == nil {
		return nil
	}
	if network != "none" {
		return fmt.Errorf("docker: %w: an egress allow list needs network \"none\" (the proxy is the only way out), not %q", compute.ErrInvalidArgument, network)
	}
	if _, err := eg.Policy.Normalized(); err != nil {
		return fmt.Errorf("docker: %w: %v", compute.ErrInvalidArgument, err)
	}
	return nil
}

// egressSocketMode lets the daemon connect whatever its capabilities (the
// 0700 run directory keeps everyone else out, inside and outside).
const egressSocketMode = 0o666

// startEgress records the configured policy in dir, serves it on the run
// directory's socket and returns the daemon's flags for the relay.
func (p *Provider) startEgress(dir privateDir) ([]string, error) {
	if err := egress.WritePolicyFile(filepath.Join(string(dir), egress.PolicyFile), p.cfg.Egress.Policy); err != nil {
		return nil, err
	}
	if err := p.egress.Start(string(dir), filepath.Join(dir.runDir(), egress.SocketName), p.cfg.Egress.Policy, egressSocketMode); err != nil {
		return nil, err
	}
	return egress.RelayArgs(containerRunDir + "/" + egress.SocketName), nil
}

// resumeEgress serves the policy recorded in dir, if any and not served
// already. It fails closed: on error the sandbox has no way out.
func (p *Provider) resumeEgress(dir privateDir, log *zap.Logger) {
	pol, ok, err := egress.ReadPolicyFile(filepath.Join(string(dir), egress.PolicyFile))
	if err == nil && ok && !p.egress.Serving(string(dir)) {
		err = p.egress.Start(string(dir), filepath.Join(dir.runDir(), egress.SocketName), pol, egressSocketMode)
	}
	if err != nil {
		log.Warn("the sandbox's egress proxy could not be served; its network requests will fail", zap.Error(err))
	}
}

// EgressStats returns the counters of the proxy serving the sandbox of
// state st, and whether this provider serves one.
func (p *Provider) EgressStats(st State) (egress.Stats, bool) {
	return p.egress.Stats(string(p.privateDir(st.Key)))
}
