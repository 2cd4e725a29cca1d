package egress

// How a provider wires a sandbox to its proxy. The local and Docker
// providers lay a sandbox out the same way (a private directory the
// sandbox never sees, holding a run directory it does see), so the names
// below are theirs in common: a sandbox created by one harness is served
// again by the next from the same files.

// RelayAddr is where, inside a sandbox with egress control,
// sandbox-agentd relays connections to the harness's proxy; it points
// its processes' HTTP(S)_PROXY there.
const RelayAddr = "127.0.0.1:3128"

// RelayPort is RelayAddr's port: a port of the sandbox's that is never
// exposed to the outside (a preview URL of it would be an open door to
// the tenant's egress proxy).
const RelayPort = 3128

const (
	// SocketName is the proxy's unix socket, in the sandbox's run
	// directory.
	SocketName = "egress.sock"
	// PolicyFile is the policy recorded when the sandbox is created, in
	// its private directory (out of the sandbox's sight), so that a harness
	// that reattaches enforces the same one.
	PolicyFile = "egress.json"
)

// RelayArgs are sandbox-agentd's flags that relay RelayAddr to the proxy
// socket at socketPath (the path as the daemon sees it).
func RelayArgs(socketPath string) []string {
	return []string{"--egress-relay", RelayAddr + "=unix://" + socketPath}
}
