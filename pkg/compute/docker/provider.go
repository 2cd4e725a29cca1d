package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Provider runs sandboxes as Docker containers. It is safe for concurrent
// use; it holds no per-sandbox state in memory (everything is in Docker and
// in the private directories).
type Provider struct {
	cfg    Config
	log    *zap.Logger
	docker *client.Client
	// egress are the egress proxies of the sandboxes this provider holds
	// (Config.Egress), by private directory.
	egress *egress.Servers
}

var (
	_ compute.Provider        = (*Provider)(nil)
	_ compute.AccountProvider = (*Provider)(nil)
)

// DefaultRunAs gives a session whose manifest names no run_as user an
// unprivileged account of its own: the daemon runs as root in the
// container, model-directed work does not.
func (p *Provider) DefaultRunAs() *manifest.User {
	return &manifest.User{Name: compute.DefaultRunAsName}
}

// New makes a provider. It does no I/O: the Docker daemon is first reached
// by Ping or Launch (the API version is negotiated then; API 1.40 and up).
func New(cfg Config, log *zap.Logger) (*Provider, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	opts := []client.Opt{client.FromEnv}
	if cfg.DockerHost != "" {
		opts = append(opts, client.WithHost(cfg.DockerHost))
	}
	dc, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker: client: %w", err)
	}
	log = log.With(zap.String("provider", ProviderName))
	var eg egress.Options
	if cfg.Egress != nil {
		eg = *cfg.Egress
	}
	return &Provider{cfg: cfg, log: log, docker: dc, egress: egress.NewServers(eg, log)}, nil
}

// checkRuntime refuses a Config.Runtime the engine does not list, naming
// the ones it has, before anything is created.
func (p *Provider) checkRuntime(ctx context.Context) error {
	if p.cfg.Runtime == "" {
		return nil
	}
	info, err := p.docker.Info(ctx, client.InfoOptions{})
	if err != nil {
		return p.apiErr("info", err)
	}
	if _, ok := info.Info.Runtimes[p.cfg.Runtime]; ok {
		return nil
	}
	have := make([]string, 0, len(info.Info.Runtimes))
	for name := range info.Info.Runtimes {
		have = append(have, name)
	}
	slices.Sort(have)
	return fmt.Errorf("docker: %w: the engine has no runtime %q (it has %s): register it in the engine's daemon.json \"runtimes\" and restart the engine",
		compute.ErrFailedPrecondition, p.cfg.Runtime, strings.Join(have, ", "))
}

// Name is "docker".
func (p *Provider) Name() string { return ProviderName }

// Config returns the provider's configuration with its defaults filled in.
func (p *Provider) Config() Config { return p.cfg }

// API returns the Docker client the provider uses (tests and diagnostics).
func (p *Provider) API() *client.Client { return p.docker }

// Ping checks that the Docker daemon answers.
func (p *Provider) Ping(ctx context.Context) error {
	if _, err := p.docker.Ping(ctx, client.PingOptions{}); err != nil {
		return fmt.Errorf("docker: %w: the Docker daemon does not answer: %v", compute.ErrUnavailable, err)
	}
	return nil
}

// Close stops the egress proxies and releases the Docker client. Sandboxes
// are left as they are.
func (p *Provider) Close() error { return errors.Join(p.egress.Close(), p.docker.Close()) }

// Launch creates and starts a sandbox container and returns it connected.
// With spec.Prior set, the earlier container (if it still exists) is
// removed and its workspace volume, if preserved, is mounted again
// (WorkspaceKept reports it).
func (p *Provider) Launch(ctx context.Context, spec compute.LaunchSpec) (compute.Sandbox, error) {
	if spec.SessionID == "" {
		return nil, fmt.Errorf("docker: launch: %w: empty session id", compute.ErrInvalidArgument)
	}
	set, err := p.cfg.settings(spec.Options)
	if err != nil {
		return nil, err
	}
	if _, err := p.docker.ImageInspect(ctx, set.image); err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("docker: %w: image %s is not there: build it with `make image`", compute.ErrFailedPrecondition, set.image)
		}
		return nil, p.apiErr("inspect image "+set.image, err)
	}
	if err := p.checkRuntime(ctx); err != nil {
		return nil, err
	}
	var disk diskPlan
	if set.disk > 0 {
		if disk, err = p.planDisk(ctx, set.disk); err != nil {
			return nil, err
		}
	}
	root := manifest.DefaultRoot
	if spec.Manifest != nil {
		root = spec.Manifest.WorkspaceRoot()
	}
	if !path.IsAbs(root) || path.Clean(root) != root || root == "/" || root == containerRunDir {
		return nil, fmt.Errorf("docker: launch: %w: workspace root %q", compute.ErrInvalidArgument, root)
	}
	if m := spec.Manifest; m != nil && m.RunAs != "" && m.RunAs != "root" {
		// Requests that name no user run as the manifest's run_as account.
		set.args = append([]string{"--default-user", m.RunAs}, set.args...)
	}
	log := p.log.With(zap.String("session", spec.SessionID))

	// What survived of an earlier sandbox of this session.
	var prior *State
	if len(spec.Prior) > 0 {
		st, err := DecodeState(spec.Prior)
		if err != nil {
			return nil, err
		}
		prior = &st
		if err := p.removeContainer(ctx, st); err != nil {
			return nil, err
		}
		p.egress.Stop(string(p.privateDir(st.Key)))
		if err := p.privateDir(st.Key).remove(); err != nil {
			return nil, err
		}
	}

	var cleanup []func()
	fail := func(err error) (compute.Sandbox, error) {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		return nil, err
	}
	bg := context.WithoutCancel(ctx)

	// Workspace volume.
	volName, kept := "", false
	if p.cfg.Workspace == WorkspaceOnVolume {
		volName = VolumeName(spec.SessionID)
		if prior != nil && prior.Volume != "" {
			volName = prior.Volume
		}
		vol, err := p.docker.VolumeInspect(ctx, volName, client.VolumeInspectOptions{})
		switch {
		case err == nil && prior == nil:
			return nil, fmt.Errorf("docker: %w: workspace volume %s already exists (left by an earlier sandbox of session %s): launch with that sandbox's state as Prior to reuse it, or destroy it",
				compute.ErrAlreadyExists, volName, spec.SessionID)
		case err == nil:
			kept = true
			log.Info("reusing the preserved workspace volume", zap.String("volume", volName))
			if err := p.reviveDiskVolume(ctx, volName, vol.Volume.Labels, vol.Volume.Options); err != nil {
				return nil, err
			}
		case cerrdefs.IsNotFound(err):
			labels := p.labels(map[string]string{LabelWorkspaceVolume: "1", LabelSession: spec.SessionID})
			if disk.size > 0 {
				if err := p.createDiskVolume(ctx, volName, disk.size, labels); err != nil {
					return nil, err
				}
				cleanup = append(cleanup, func() { _ = p.removeDiskVolume(bg, volName) })
				break
			}
			if _, err := p.docker.VolumeCreate(ctx, client.VolumeCreateOptions{Name: volName, Labels: labels}); err != nil {
				return nil, p.apiErr("create volume "+volName, err)
			}
			cleanup = append(cleanup, func() { _, _ = p.docker.VolumeRemove(bg, volName, client.VolumeRemoveOptions{Force: true}) })
		default:
			return nil, p.apiErr("inspect volume "+volName, err)
		}
	}

	key, err := randomHex(keyLen / 2)
	if err != nil {
		return fail(err)
	}
	dir := p.privateDir(key)
	if err := dir.create(); err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { _ = dir.remove() })
	if p.cfg.Egress != nil {
		relay, err := p.startEgress(dir)
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, func() { p.egress.Stop(string(dir)) })
		set.args = append(set.args, relay...)
	}
	token, err := dir.newToken()
	if err != nil {
		return fail(err)
	}

	lifetime := spec.Lifetime
	if lifetime.CreatedAt.IsZero() {
		lifetime.CreatedAt = time.Now()
	}
	labels := p.labels(spec.Labels)
	lifetimeLabels(lifetime, labels)
	labels[LabelSandbox] = "1"
	labels[LabelSession] = spec.SessionID
	labels[LabelStateVersion] = strconv.Itoa(StateVersion)
	labels[LabelKey] = key
	labels[LabelWorkspace] = root
	if volName != "" {
		labels[LabelVolume] = volName
	}

	name := containerName(spec.SessionID, key)
	ccfg, hcfg := p.containerConfig(set, root, dir, volName, labels)
	if disk.layerQuota {
		hcfg.StorageOpt = map[string]string{"size": strconv.FormatInt(disk.size, 10)}
	}
	created, err := p.docker.ContainerCreate(ctx, client.ContainerCreateOptions{Config: ccfg, HostConfig: hcfg, Name: name})
	if err != nil {
		return fail(p.apiErr("create container "+name, err))
	}
	for _, w := range created.Warnings {
		log.Warn("docker warning on create", zap.String("warning", w))
	}
	st := State{
		Version: StateVersion, ContainerID: created.ID, Name: name, Key: key, SessionID: spec.SessionID,
		Image: set.image, Volume: volName, Workspace: root,
	}
	cleanup = append(cleanup, func() {
		_, _ = p.docker.ContainerRemove(bg, created.ID, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := p.docker.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return fail(p.apiErr("start container "+name, err))
	}
	sb, err := p.connect(ctx, st, dir, token, kept)
	if err != nil {
		return fail(err)
	}
	_ = dir.touch()
	log.Info("sandbox started", zap.String("container", name), zap.String("image", set.image), zap.Bool("workspace_kept", kept))
	return sb, nil
}

// labels merges the configured labels with extra ones (reserved keys win).
func (p *Provider) labels(extra map[string]string) map[string]string {
	out := make(map[string]string, len(p.cfg.Labels)+len(extra)+10)
	for k, v := range extra {
		if !strings.HasPrefix(k, labelPrefix) {
			out[k] = v
		}
	}
	for k, v := range p.cfg.Labels {
		out[k] = v
	}
	return out
}

// containerConfig is the container a sandbox runs in: the daemon as root,
// its run directory bind-mounted, the workspace on the volume (or in the
// container), limits, no network and few capabilities.
func (p *Provider) containerConfig(set sandboxSettings, root string, dir privateDir, volName string, labels map[string]string) (*container.Config, *container.HostConfig) {
	args := append([]string{
		"--listen", "unix://" + containerRunDir + "/" + socketName,
		"--token-file", containerRunDir + "/" + tokenName,
		"--workspace", root,
		"--shutdown-timeout", (p.cfg.StopTimeout * 2 / 3).String(),
	}, set.args...)
	stopTimeout := int(p.cfg.StopTimeout / time.Second)
	ccfg := &container.Config{
		Image:       set.image,
		Cmd:         args,
		User:        "0:0",
		WorkingDir:  root,
		Hostname:    "sandbox",
		Labels:      labels,
		StopSignal:  "SIGTERM",
		StopTimeout: &stopTimeout,
	}
	if p.cfg.AgentdPath != "" {
		ccfg.Entrypoint = []string{p.cfg.AgentdPath}
	}
	pids := set.pidsLim
	hcfg := &container.HostConfig{
		NetworkMode: container.NetworkMode(set.network),
		Mounts: []mount.Mount{{
			Type: mount.TypeBind, Source: dir.runDir(), Target: containerRunDir,
		}},
		Resources: container.Resources{
			Memory:    set.memory,
			NanoCPUs:  set.nanoCPUs,
			PidsLimit: &pids,
		},
		CapDrop:       []string{"ALL"},
		CapAdd:        p.cfg.Capabilities,
		SecurityOpt:   []string{"no-new-privileges:true"},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Runtime:       p.cfg.Runtime,
	}
	if set.memory > 0 {
		hcfg.Resources.MemorySwap = set.memory // no swap on top
	}
	if volName != "" {
		hcfg.Mounts = append(hcfg.Mounts, mount.Mount{Type: mount.TypeVolume, Source: volName, Target: root})
	}
	if len(set.ports) > 0 {
		ccfg.ExposedPorts = network.PortSet{}
		hcfg.PortBindings = network.PortMap{}
		for _, pb := range set.ports {
			proto := pb.Protocol
			if proto == "" {
				proto = "tcp"
			}
			// checkPorts validated the address, port and protocol.
			hostIP := netip.AddrFrom4([4]byte{127, 0, 0, 1})
			if pb.HostIP != "" {
				hostIP, _ = netip.ParseAddr(pb.HostIP)
			}
			port, _ := network.PortFrom(uint16(pb.ContainerPort), network.IPProtocol(proto))
			ccfg.ExposedPorts[port] = struct{}{}
			hostPort := ""
			if pb.HostPort > 0 {
				hostPort = strconv.Itoa(pb.HostPort)
			}
			hcfg.PortBindings[port] = append(hcfg.PortBindings[port], network.PortBinding{HostIP: hostIP, HostPort: hostPort})
		}
	}
	return ccfg, hcfg
}

// connect dials the daemon through the run directory's socket and waits
// until it serves and accepts the token.
func (p *Provider) connect(ctx context.Context, st State, dir privateDir, token string, kept bool) (*sandbox, error) {
	ac, err := agentclient.Dial(agentclient.Options{Address: "unix://" + dir.socket(), Token: token, TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return nil, fmt.Errorf("docker: sandbox %s: %w", st.Name, err)
	}
	if err := p.waitReady(ctx, st, ac); err != nil {
		_ = ac.Close()
		return nil, err
	}
	return &sandbox{p: p, client: ac, state: st, dir: dir, kept: kept}, nil
}

// waitReady waits until the daemon serves and accepts the token
// (agentclient.WaitReady). It gives up when the container exits or
// disappears, when ReadyTimeout passes or when ctx ends; a daemon that
// exited or never served adds the container's last log lines.
func (p *Provider) waitReady(ctx context.Context, st State, ac *agentclient.Client) error {
	nextInspect, gone := time.Now(), false
	_, err := agentclient.WaitReady(ctx, ac, agentclient.ReadyOptions{Timeout: p.cfg.ReadyTimeout,
		Alive: func(ctx context.Context) error {
			if time.Now().Before(nextInspect) {
				return nil
			}
			nextInspect = time.Now().Add(250 * time.Millisecond)
			res, ierr := p.docker.ContainerInspect(ctx, st.ContainerID, client.ContainerInspectOptions{})
			info := res.Container
			switch {
			case cerrdefs.IsNotFound(ierr):
				gone = true
				return fmt.Errorf("%w: the container disappeared during start-up", compute.ErrUnavailable)
			case ierr == nil && info.State != nil && !info.State.Running:
				gone = true
				return fmt.Errorf("%w: sandbox-agentd exited during start-up (exit code %d)%s",
					compute.ErrUnavailable, info.State.ExitCode, p.logTail(context.WithoutCancel(ctx), st.ContainerID))
			}
			return nil
		}})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, compute.ErrUnavailable) && !gone:
		return fmt.Errorf("docker: sandbox %s: %w%s", st.Name, err, p.logTail(context.WithoutCancel(ctx), st.ContainerID))
	}
	return fmt.Errorf("docker: sandbox %s: %w", st.Name, err)
}

// logTail returns the container's last log lines for an error message (the
// daemon logs no tokens or file contents).
func (p *Provider) logTail(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rc, err := p.docker.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "10"})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, rc); err != nil && out.Len() == 0 {
		return ""
	}
	s := strings.TrimSpace(out.String())
	if s == "" {
		return ""
	}
	return "; its last log lines:\n" + s
}

// Reattach connects to the sandbox prior describes: a running container is
// reconnected with the stored token; a stopped one gets a fresh token and is
// started. A container that is gone gives an error wrapping ErrNotFound.
func (p *Provider) Reattach(ctx context.Context, spec compute.LaunchSpec, prior json.RawMessage) (compute.Sandbox, error) {
	st, err := DecodeState(prior)
	if err != nil {
		return nil, err
	}
	info, err := p.inspect(ctx, st)
	if err != nil {
		return nil, err
	}
	st.ContainerID = info.ID
	dir := p.dirOf(info, st)
	log := p.log.With(zap.String("session", st.SessionID), zap.String("container", st.Name))
	p.resumeEgress(dir, log)
	state := info.State
	switch {
	case state.Running && state.Paused:
		if _, err := p.docker.ContainerUnpause(ctx, info.ID, client.ContainerUnpauseOptions{}); err != nil {
			return nil, p.apiErr("unpause container "+st.Name, err)
		}
		fallthrough
	case state.Running:
		token, terr := dir.readToken()
		if terr == nil {
			sb, err := p.connect(ctx, st, dir, token, true)
			if err == nil {
				_ = dir.touch()
				log.Info("reattached to the running sandbox")
				return sb, nil
			}
			if !errors.Is(err, compute.ErrUnauthenticated) {
				return nil, err
			}
			terr = err
		}
		// The token copy is lost or no longer accepted: the daemon only
		// reads a token at start, so restart it with a fresh one.
		log.Warn("cannot authenticate to the running sandbox; restarting it with a fresh token", zap.Error(terr))
		if err := p.stop(ctx, info.ID); err != nil {
			return nil, err
		}
	case state.Status == container.StateRemoving || state.Dead:
		return nil, fmt.Errorf("docker: sandbox %s: %w: the container is %s", st.Name, compute.ErrNotFound, state.Status)
	}
	// Stopped (created, exited): a fresh token, then start.
	token, err := dir.newToken()
	if err != nil {
		return nil, err
	}
	if _, err := p.docker.ContainerStart(ctx, info.ID, client.ContainerStartOptions{}); err != nil {
		return nil, p.apiErr("start container "+st.Name, err)
	}
	sb, err := p.connect(ctx, st, dir, token, true)
	if err != nil {
		return nil, err
	}
	_ = dir.touch()
	log.Info("restarted the stopped sandbox")
	return sb, nil
}

// inspect finds the container of a state, by id then by name, and checks it
// is the same sandbox (its key label).
func (p *Provider) inspect(ctx context.Context, st State) (container.InspectResponse, error) {
	ref := st.ContainerID
	if ref == "" {
		ref = st.Name
	}
	res, err := p.docker.ContainerInspect(ctx, ref, client.ContainerInspectOptions{})
	info := res.Container
	if cerrdefs.IsNotFound(err) {
		return info, fmt.Errorf("docker: sandbox %s: %w: the container is gone", st.Name, compute.ErrNotFound)
	}
	if err != nil {
		return info, p.apiErr("inspect container "+st.Name, err)
	}
	if info.Config == nil || info.Config.Labels[LabelKey] != st.Key || info.State == nil {
		return info, fmt.Errorf("docker: sandbox %s: %w: container %s is not this sandbox", st.Name, compute.ErrNotFound, ref)
	}
	return info, nil
}

// dirOf is the private directory of a container: the parent of its run
// directory's bind mount (the StateDir it was created with), or the one
// under the current StateDir.
func (p *Provider) dirOf(info container.InspectResponse, st State) privateDir {
	for _, m := range info.Mounts {
		if m.Destination == containerRunDir && m.Type == mount.TypeBind && filepath.Base(m.Source) == runDirName {
			if d := filepath.Dir(m.Source); filepath.Base(d) == st.Key {
				return privateDir(d)
			}
		}
	}
	return p.privateDir(st.Key)
}

// stop stops a container gracefully (SIGTERM, then SIGKILL after StopTimeout).
func (p *Provider) stop(ctx context.Context, id string) error {
	secs := int(p.cfg.StopTimeout / time.Second)
	if _, err := p.docker.ContainerStop(ctx, id, client.ContainerStopOptions{Timeout: &secs}); err != nil && !cerrdefs.IsNotFound(err) {
		return p.apiErr("stop container "+id, err)
	}
	return nil
}

// removeContainer force-removes a state's container; gone is fine.
func (p *Provider) removeContainer(ctx context.Context, st State) error {
	info, err := p.inspect(ctx, st)
	if errors.Is(err, compute.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = p.docker.ContainerRemove(ctx, info.ID, client.ContainerRemoveOptions{Force: true})
	if err == nil || cerrdefs.IsNotFound(err) || (cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress")) {
		return nil
	}
	return p.apiErr("remove container "+st.Name, err)
}

// Destroy removes the container (forcibly), its private directory and, under
// DeleteAll, its workspace volume. What is already gone is not an error.
func (p *Provider) Destroy(ctx context.Context, prior json.RawMessage) error {
	st, err := DecodeState(prior)
	if err != nil {
		return err
	}
	if err := p.removeContainer(ctx, st); err != nil {
		return err
	}
	p.egress.Stop(string(p.privateDir(st.Key)))
	var errs []error
	errs = append(errs, p.privateDir(st.Key).remove())
	if p.cfg.DeletePolicy == DeleteAll && st.Volume != "" {
		errs = append(errs, p.removeDiskVolume(ctx, st.Volume))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p.log.Info("sandbox destroyed", zap.String("session", st.SessionID), zap.String("container", st.Name))
	return nil
}

// List returns the provider's sandbox containers, running or not, that
// carry all of Config.Labels.
func (p *Provider) List(ctx context.Context) ([]compute.SandboxInfo, error) {
	f := make(client.Filters).Add("label", LabelSandbox+"=1")
	for k, v := range p.cfg.Labels {
		f.Add("label", k+"="+v)
	}
	res, err := p.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, p.apiErr("list containers", err)
	}
	out := make([]compute.SandboxInfo, 0, len(res.Items))
	for _, c := range res.Items {
		name := ""
		if len(c.Names) > 0 {
			name = c.Names[0]
		}
		st := stateFromLabels(c.ID, name, c.Image, c.Labels)
		raw, err := st.encode()
		if err != nil {
			return nil, err
		}
		var last time.Time
		if keyRE.MatchString(st.Key) {
			last = p.privateDir(st.Key).lastActiveTime()
		}
		out = append(out, compute.SandboxInfo{
			Provider: ProviderName, SessionID: st.SessionID, ID: c.ID, Running: c.State == container.StateRunning,
			Lifetime: lifetimeFromLabels(c.Labels), LastActive: last, State: raw,
		})
	}
	return out, nil
}

// apiErr wraps a Docker API error with what was being done; an unreachable
// daemon is marked ErrUnavailable.
func (p *Provider) apiErr(what string, err error) error {
	if client.IsErrConnectionFailed(err) || cerrdefs.IsUnavailable(err) {
		return fmt.Errorf("docker: %s: %w: %w", what, compute.ErrUnavailable, err)
	}
	return fmt.Errorf("docker: %s: %w", what, err)
}
