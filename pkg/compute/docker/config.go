// Package docker runs Bulkhead sandboxes as Docker containers, through the
// Docker Engine API (the official Go client, github.com/moby/moby/client;
// never the CLI).
//
// Each sandbox is a container from an image whose entrypoint is
// sandbox-agentd (bulkhead/sandbox:dev by default; `make image` builds it),
// running as root inside so that processes can run as the manifest's run_as
// users. The daemon listens on a unix socket in a host directory
// bind-mounted at /run/bulkhead; its token, 32 random bytes, reaches it as a
// file in that directory (mode 0600), which the daemon reads and removes.
// The token never appears in the container's environment, labels or argv.
// A copy stays in the sandbox's private directory on the host (not mounted
// into the container), so a restarted harness can reattach.
//
// Layout of Config.StateDir, one private directory (0700) per sandbox:
//
//	<StateDir>/<key>/token        the harness-side copy of the token (0600)
//	<StateDir>/<key>/last-active  its mtime is the sandbox's last activity
//	<StateDir>/<key>/run/         bind-mounted at /run/bulkhead: agentd.sock,
//	                              and the token file until the daemon reads it
//
// The workspace lives on a named volume (bulkhead-ws-<session>) by default,
// so a container can be deleted and replaced while the workspace survives,
// or in the container's own layer (WorkspaceInContainer).
package docker

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
)

// ProviderName is the provider's name in compute state.
const ProviderName = "docker"

// DefaultImage is the image sandboxes run when Config.Image is empty.
const DefaultImage = "bulkhead/sandbox:dev"

// Defaults for the resource limits (a Config field of zero means these; a
// negative one means no limit).
const (
	DefaultMemory    int64 = 1 << 30       // 1 GiB
	DefaultNanoCPUs  int64 = 1_000_000_000 // one CPU
	DefaultPidsLimit int64 = 1024
)

// DefaultCapabilities are the capabilities the container keeps (all others
// are dropped). The daemon runs processes as other users (SETUID, SETGID),
// creates and chowns their files (CHOWN, DAC_OVERRIDE, FOWNER, FSETID) and
// signals their process groups (KILL).
var DefaultCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"}

// WorkspaceStorage says where a sandbox's workspace lives.
type WorkspaceStorage int

const (
	// WorkspaceOnVolume keeps the workspace on a named Docker volume,
	// bulkhead-ws-<session>, that can outlive the container.
	WorkspaceOnVolume WorkspaceStorage = iota
	// WorkspaceInContainer keeps the workspace in the container's writable
	// layer: it goes with the container.
	WorkspaceInContainer
)

// DeletePolicy says what Destroy removes. The sandbox's private directory
// (socket, token copy) is always removed with the container. A policy that
// removes the volume but keeps the container is not offered: Docker does not
// remove a volume a container still uses.
type DeletePolicy int

const (
	// DeleteAll removes the container and the workspace volume.
	DeleteAll DeletePolicy = iota
	// DeleteContainer removes the container and keeps the workspace volume,
	// so a later Launch with the sandbox's state as Prior remounts it.
	DeleteContainer
)

// PortBinding publishes a container port on the host (needs a Network other
// than "none").
type PortBinding struct {
	// ContainerPort is the port inside the sandbox.
	ContainerPort int
	// Protocol is "tcp" (default) or "udp".
	Protocol string
	// HostIP is the host address to bind (default 127.0.0.1).
	HostIP string
	// HostPort is the host port; 0 lets Docker choose.
	HostPort int
}

// Config configures a Provider.
type Config struct {
	// Image is the sandbox image (default DefaultImage). Its entrypoint
	// must be sandbox-agentd, unless AgentdPath is set.
	Image string
	// AgentdPath, when set, overrides the image's entrypoint with this
	// path to sandbox-agentd inside the image.
	AgentdPath string
	// StateDir holds each sandbox's private directory (default
	// $XDG_STATE_HOME/bulkhead/docker or ~/.local/state/bulkhead/docker).
	// It must be on the Docker daemon's host, and short enough for a unix
	// socket path.
	StateDir string
	// Memory is the memory limit in bytes (0: DefaultMemory; <0: none).
	Memory int64
	// NanoCPUs is the CPU quota in 1e-9 CPUs (0: DefaultNanoCPUs; <0: none).
	NanoCPUs int64
	// PidsLimit bounds the processes in the container (0: DefaultPidsLimit; <0: none).
	PidsLimit int64
	// Disk caps what a sandbox writes, in bytes (0 or <0: no cap; at least
	// MinDisk): its workspace volume is an ext4 file system of that size
	// of its own, and on a storage driver with quotas its writable layer
	// is capped too (see disk.go). Past it a write fails with ENOSPC.
	// Needs a root harness on the engine's host, mkfs.ext4 and loop
	// devices; Launch refuses a cap it cannot apply
	// (ErrFailedPrecondition), never drops it.
	Disk int64
	// Network is the container's network mode (default "none").
	Network string
	// PublishedPorts are container ports published on the host.
	PublishedPorts []PortBinding
	// Workspace says where the workspace lives (default WorkspaceOnVolume).
	Workspace WorkspaceStorage
	// DeletePolicy says what Destroy removes (default DeleteAll).
	DeletePolicy DeletePolicy
	// Labels are added to every container and volume the provider creates;
	// List only returns containers that carry all of them.
	Labels map[string]string
	// Capabilities the container keeps (nil: DefaultCapabilities).
	Capabilities []string
	// AgentdArgs are extra sandbox-agentd flags (--grant, --default-user,
	// limits ...).
	AgentdArgs []string
	// ReadyTimeout bounds the wait for the daemon to serve (default 30s).
	ReadyTimeout time.Duration
	// StopTimeout is how long the daemon gets to drain after SIGTERM
	// before Docker kills it (default 15s).
	StopTimeout time.Duration
	// DockerHost overrides DOCKER_HOST (the client otherwise reads the
	// usual DOCKER_* environment).
	DockerHost string
	// Runtime is the OCI runtime the engine runs sandboxes with, by the
	// name the engine registered it under (its daemon.json "runtimes"),
	// e.g. "runsc" for gVisor; empty: the engine's default. Launch refuses
	// a runtime the engine does not list, with ErrFailedPrecondition.
	Runtime string
	// Egress, when set, lets sandboxes reach the network only through a
	// harness-side proxy enforcing Egress.Policy (see egress.go and
	// package egress). It needs Network "none" (the default).
	Egress *egress.Options
}

// CreateOptions are per-sandbox overrides, given as LaunchSpec.Options
// (*CreateOptions or CreateOptions). Zero fields keep the Config's value.
type CreateOptions struct {
	Image     string
	Memory    int64
	NanoCPUs  int64
	PidsLimit int64
	// Disk is the disk cap in bytes (see Config.Disk; 0: the Config's).
	Disk           int64
	Network        string
	PublishedPorts []PortBinding
	// AgentdArgs are appended to Config.AgentdArgs.
	AgentdArgs []string
}

// The socket and token file names inside a sandbox's run directory, and
// where that directory is mounted in the container.
const (
	containerRunDir = "/run/bulkhead"
	socketName      = "agentd.sock"
	tokenName       = "token"
	lastActiveName  = "last-active"
	runDirName      = "run"
	keyLen          = 16 // hex characters
	maxUnixPath     = 107
)

// withDefaults fills in the defaults and checks the configuration.
func (c Config) withDefaults() (Config, error) {
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.StateDir == "" {
		base := os.Getenv("XDG_STATE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return c, fmt.Errorf("docker: no StateDir and no home directory: %w", err)
			}
			base = filepath.Join(home, ".local", "state")
		}
		c.StateDir = filepath.Join(base, "bulkhead", "docker")
	}
	abs, err := filepath.Abs(c.StateDir)
	if err != nil {
		return c, fmt.Errorf("docker: StateDir %q: %w", c.StateDir, err)
	}
	c.StateDir = abs
	if n := len(socketPath(filepath.Join(c.StateDir, strings.Repeat("k", keyLen)))); n > maxUnixPath {
		return c, fmt.Errorf("docker: %w: StateDir %q is too long: the socket path would be %d bytes (at most %d)",
			compute.ErrInvalidArgument, c.StateDir, n, maxUnixPath)
	}
	if c.Network == "" {
		c.Network = "none"
	}
	if c.Capabilities == nil {
		c.Capabilities = DefaultCapabilities
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 30 * time.Second
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 15 * time.Second
	}
	if c.Workspace != WorkspaceOnVolume && c.Workspace != WorkspaceInContainer {
		return c, fmt.Errorf("docker: %w: unknown workspace storage %d", compute.ErrInvalidArgument, c.Workspace)
	}
	if c.DeletePolicy != DeleteAll && c.DeletePolicy != DeleteContainer {
		return c, fmt.Errorf("docker: %w: unknown delete policy %d", compute.ErrInvalidArgument, c.DeletePolicy)
	}
	for k := range c.Labels {
		if strings.HasPrefix(k, labelPrefix) {
			return c, fmt.Errorf("docker: %w: label %q: the %s prefix is reserved", compute.ErrInvalidArgument, k, labelPrefix)
		}
	}
	if err := checkEgress(c.Egress, c.Network); err != nil {
		return c, err
	}
	return c, checkPorts(c.Network, c.PublishedPorts)
}

// limit turns a configured limit into Docker's value: 0 means the default,
// negative means none.
func limit(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func checkPorts(network string, ports []PortBinding) error {
	if len(ports) > 0 && network == "none" {
		return fmt.Errorf("docker: %w: published ports need a network (Network is \"none\")", compute.ErrInvalidArgument)
	}
	for _, p := range ports {
		if p.ContainerPort <= 0 || p.ContainerPort > 65535 || p.HostPort < 0 || p.HostPort > 65535 {
			return fmt.Errorf("docker: %w: bad published port %+v", compute.ErrInvalidArgument, p)
		}
		if p.Protocol != "" && p.Protocol != "tcp" && p.Protocol != "udp" {
			return fmt.Errorf("docker: %w: published port %d: protocol %q (want tcp or udp)", compute.ErrInvalidArgument, p.ContainerPort, p.Protocol)
		}
		if _, err := netip.ParseAddr(p.HostIP); p.HostIP != "" && err != nil {
			return fmt.Errorf("docker: %w: published port %d: host address %q: %v", compute.ErrInvalidArgument, p.ContainerPort, p.HostIP, err)
		}
	}
	return nil
}

// sandboxSettings is the Config with one sandbox's CreateOptions applied.
type sandboxSettings struct {
	image                     string
	memory, nanoCPUs, pidsLim int64
	disk                      int64 // bytes; 0: no cap
	network                   string
	ports                     []PortBinding
	args                      []string
}

func (c Config) settings(opts any) (sandboxSettings, error) {
	s := sandboxSettings{
		image: c.Image, memory: c.Memory, nanoCPUs: c.NanoCPUs, pidsLim: c.PidsLimit, disk: c.Disk,
		network: c.Network, ports: c.PublishedPorts, args: append([]string(nil), c.AgentdArgs...),
	}
	o, err := compute.OptionsAs[CreateOptions]("docker", "*docker.CreateOptions", opts)
	if err != nil {
		return s, err
	}
	if o != nil {
		if o.Image != "" {
			s.image = o.Image
		}
		if o.Memory != 0 {
			s.memory = o.Memory
		}
		if o.NanoCPUs != 0 {
			s.nanoCPUs = o.NanoCPUs
		}
		if o.PidsLimit != 0 {
			s.pidsLim = o.PidsLimit
		}
		if o.Disk != 0 {
			s.disk = o.Disk
		}
		if o.Network != "" {
			s.network = o.Network
		}
		if o.PublishedPorts != nil {
			s.ports = o.PublishedPorts
		}
		s.args = append(s.args, o.AgentdArgs...)
	}
	s.memory = limit(s.memory, DefaultMemory)
	s.nanoCPUs = limit(s.nanoCPUs, DefaultNanoCPUs)
	s.pidsLim = limit(s.pidsLim, DefaultPidsLimit)
	s.disk = max(s.disk, 0)
	if s.disk > 0 && s.disk < MinDisk {
		return s, fmt.Errorf("docker: %w: disk cap of %d bytes: at least %d (16 MiB)", compute.ErrInvalidArgument, s.disk, int64(MinDisk))
	}
	if err := checkPorts(s.network, s.ports); err != nil {
		return s, err
	}
	if err := checkEgress(c.Egress, s.network); err != nil {
		return s, err
	}
	for _, a := range s.args {
		if strings.Contains(a, "token") {
			return s, fmt.Errorf("docker: %w: AgentdArgs %q: the provider delivers the token itself", compute.ErrInvalidArgument, a)
		}
	}
	return s, nil
}

func socketPath(dir string) string { return filepath.Join(dir, runDirName, socketName) }
