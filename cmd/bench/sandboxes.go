package main

// Sandbox lifecycle figures: how long a new sandbox takes to run its first
// command, per provider, beside starting the same command bare (os/exec) or
// in a plain `docker run --rm` of the same image; and what many sandboxes
// alive at once cost in memory.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	dockerclient "github.com/moby/moby/client"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

// firstCommand is the command every sandbox runs first, and every baseline.
var firstCommand = []string{"/bin/true"}

// sandboxKind is one way of getting a sandbox.
type sandboxKind struct {
	name string
	// client makes a compute client over a fresh provider; done removes
	// what it left.
	client func() (c *compute.Client, done func(), err error)
}

// localKind is the local provider, isolated with bubblewrap or not.
func localKind(agentd string, iso local.Isolation) sandboxKind {
	name := "local"
	if iso != local.IsolationNone {
		name = "local isolated (bubblewrap)"
	}
	return sandboxKind{name: name, client: func() (*compute.Client, func(), error) {
		dir, err := os.MkdirTemp("", "bench-local-")
		if err != nil {
			return nil, nil, err
		}
		// A root harness's sandboxes run as accounts of their own, which
		// pass through the state directory to their workspaces.
		if err := os.Chmod(dir, 0o711); err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		c, err := local.NewClient(local.Config{StateDir: dir, AgentdPath: agentd, Isolation: iso}, compute.ClientOptions{Log: zap.NewNop()})
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		return c, func() { os.RemoveAll(dir) }, nil
	}}
}

// dockerKind is the docker provider with the small image.
func dockerKind() sandboxKind {
	return sandboxKind{name: "docker", client: func() (*compute.Client, func(), error) {
		dir, err := os.MkdirTemp("", "bench-docker-")
		if err != nil {
			return nil, nil, err
		}
		p, err := docker.New(docker.Config{StateDir: dir}, zap.NewNop())
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		return compute.NewClient(p, compute.ClientOptions{Log: zap.NewNop()}), func() { _ = p.Close(); os.RemoveAll(dir) }, nil
	}}
}

// dockerStatus says whether the docker figures can be taken ("" = yes).
func dockerStatus(ctx context.Context) string {
	api, err := dockerclient.New(dockerclient.FromEnv)
	if err != nil {
		return "skipped: " + err.Error()
	}
	defer api.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := api.Ping(pctx, dockerclient.PingOptions{}); err != nil {
		return "skipped: Docker does not answer"
	}
	if _, err := api.ImageInspect(pctx, docker.DefaultImage); err != nil {
		return "skipped: no " + docker.DefaultImage + " (run `make image`)"
	}
	return ""
}

// createToFirstExec times Create (empty manifest, with the provider's
// options opts, or none when nil) + Start + Exec of the first command on
// a fresh sandbox; the sandbox is deleted untimed.
func createToFirstExec(ctx context.Context, c *compute.Client, opts any) (time.Duration, error) {
	start := time.Now()
	s, err := c.Create(ctx, compute.CreateOptions{ProviderOptions: opts})
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Delete(context.Background(), s) }()
	if err := s.Start(ctx); err != nil {
		return 0, err
	}
	res, err := s.Exec(ctx, compute.ProcessSpec{Argv: firstCommand}, compute.ExecOptions{}, nil)
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	if code := res.Exit.ExitCode; code != 0 {
		return 0, fmt.Errorf("%v exited %d", firstCommand, code)
	}
	return d, nil
}

// medianOf runs f rounds+1 times (the first is a warm-up) and returns the
// median of the timed rounds.
func medianOf(rounds int, f func() (time.Duration, error)) (time.Duration, error) {
	var ds []time.Duration
	for i := 0; i <= rounds; i++ {
		d, err := f()
		if err != nil {
			return 0, err
		}
		if i > 0 {
			ds = append(ds, d)
		}
	}
	p50, _ := percentiles(ds)
	return p50, nil
}

// benchStartup measures create-to-first-exec for each provider beside its
// baseline: a bare os/exec of the same command for the local providers, a
// `docker run --rm` of the same image (Engine API: create, start, wait for
// removal) for docker.
func benchStartup(ctx context.Context, agentd string, rounds int, dockerSkip string) ([]row, error) {
	bare, err := medianOf(rounds, func() (time.Duration, error) {
		start := time.Now()
		err := exec.Command(firstCommand[0], firstCommand[1:]...).Run()
		return time.Since(start), err
	})
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("create-to-first-exec (Create, Start, Exec `%s`), median of %d", strings.Join(firstCommand, " "), rounds)
	var rows []row
	kinds := []sandboxKind{localKind(agentd, local.IsolationNone)}
	if _, err := exec.LookPath("bwrap"); err == nil {
		kinds = append(kinds, localKind(agentd, local.IsolationBubblewrap))
	} else {
		rows = append(rows, row{"local isolated (bubblewrap) " + what, "skipped: bwrap is not installed", "", "", ""})
	}
	for _, k := range kinds {
		d, err := startupOf(ctx, k, rounds)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.name, err)
		}
		rows = append(rows, row{k.name + " " + what, ms1(d), us(bare) + " (bare os/exec)", ratio(d, bare), ""})
	}
	if dockerSkip != "" {
		return append(rows, row{"docker " + what, dockerSkip, "", "", ""}), nil
	}
	d, err := startupOf(ctx, dockerKind(), rounds)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	run, err := medianOf(rounds, func() (time.Duration, error) { return dockerRun(ctx) })
	if err != nil {
		return nil, fmt.Errorf("docker run baseline: %w", err)
	}
	return append(rows, row{"docker " + what, ms1(d), ms1(run) + " (`docker run --rm` of the same image, Engine API)", ratio(d, run), ""}), nil
}

func startupOf(ctx context.Context, k sandboxKind, rounds int) (time.Duration, error) {
	c, done, err := k.client()
	if err != nil {
		return 0, err
	}
	defer done()
	return medianOf(rounds, func() (time.Duration, error) { return createToFirstExec(ctx, c, nil) })
}

// dockerRun is `docker run --rm --network none --entrypoint /bin/true
// <image>` through the Engine API, as the CLI does it: create (auto-remove),
// wait for removal, start, and the wait's result.
func dockerRun(ctx context.Context) (time.Duration, error) {
	api, err := dockerclient.New(dockerclient.FromEnv)
	if err != nil {
		return 0, err
	}
	defer api.Close()
	start := time.Now()
	created, err := api.ContainerCreate(ctx, dockerclient.ContainerCreateOptions{
		Config:     &container.Config{Image: docker.DefaultImage, Entrypoint: firstCommand, Labels: map[string]string{"bench.bulkhead": "docker-run"}},
		HostConfig: &container.HostConfig{AutoRemove: true, NetworkMode: "none"},
	})
	if err != nil {
		return 0, err
	}
	wait := api.ContainerWait(ctx, created.ID, dockerclient.ContainerWaitOptions{Condition: container.WaitConditionRemoved})
	if _, err := api.ContainerStart(ctx, created.ID, dockerclient.ContainerStartOptions{}); err != nil {
		_, _ = api.ContainerRemove(context.Background(), created.ID, dockerclient.ContainerRemoveOptions{Force: true})
		return 0, err
	}
	select {
	case w := <-wait.Result:
		if w.StatusCode != 0 {
			return 0, fmt.Errorf("docker run %v: exit %d", firstCommand, w.StatusCode)
		}
	case err := <-wait.Error:
		return 0, err
	}
	return time.Since(start), nil
}

// benchMany keeps n sandboxes of a kind alive at once: how long creating
// them took (createParallel at a time), one Exec round trip with all
// alive, the memory of their daemons, and the harness's (this process's)
// own memory growth.
func benchMany(ctx context.Context, k sandboxKind, n int, memory func(ctx context.Context, sessions []*compute.Session) (string, error)) ([]row, error) {
	c, done, err := k.client()
	if err != nil {
		return nil, err
	}
	defer done()
	runtime.GC()
	debug.FreeOSMemory()
	before, err := readRSS(os.Getpid())
	if err != nil {
		return nil, err
	}
	sessions := make([]*compute.Session, n)
	defer func() {
		if err := deleteSessions(context.Background(), c, sessions); err != nil {
			fmt.Fprintf(os.Stderr, "%s: cleanup: %v\n", k.name, err)
		}
	}()
	start := time.Now()
	err = createSandboxes(ctx, c, sessions)
	createAll := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("%s: create %d sandboxes: %w", k.name, n, err)
	}
	// Every one answers; the round trip with all of them alive.
	var rtts []time.Duration
	for _, s := range sessions {
		t0 := time.Now()
		if _, err := s.Exec(ctx, compute.ProcessSpec{Argv: firstCommand}, compute.ExecOptions{}, nil); err != nil {
			return nil, fmt.Errorf("%s: exec with %d alive: %w", k.name, n, err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	rtt, _ := percentiles(rtts)
	mem, err := memory(ctx, sessions)
	if err != nil {
		return nil, err
	}
	runtime.GC()
	after, err := readRSS(os.Getpid())
	if err != nil {
		return nil, err
	}
	label := fmt.Sprintf("%d %s sandboxes alive at once", n, k.name)
	return []row{
		{label + fmt.Sprintf(": time to create and start all (%d at a time)", createParallel), ms(createAll), fmt.Sprintf("%s per sandbox", ms1(createAll/time.Duration(n))), "", ""},
		{label + ": their total memory", mem, "", "", ""},
		{label + ": Exec `" + strings.Join(firstCommand, " ") + "` round trip, p50 over all", us(rtt), "", "", ""},
		{label + ": harness process RSS (holding the sessions)", fmt.Sprintf("%.1f MiB", float64(after.total)/1024),
			fmt.Sprintf("%.1f MiB before creating them", float64(before.total)/1024), fmt.Sprintf("+%.0f KiB per session", float64(after.total-before.total)/float64(n)), ""},
	}, nil
}

// createParallel is how many sandboxes createSandboxes creates at once.
const createParallel = 4

// createSandboxes creates and starts len(sessions) sandboxes, createParallel
// at a time, filling sessions (a failed one stays nil, a created one that
// failed to start stays, to be deleted). It waits for all and returns every
// failure, joined.
func createSandboxes(ctx context.Context, c *compute.Client, sessions []*compute.Session) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(sessions))
	sem := make(chan struct{}, createParallel)
	for i := range sessions {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, err := c.Create(ctx, compute.CreateOptions{})
			if err == nil {
				sessions[i] = s
				err = s.Start(ctx)
			}
			if err != nil {
				errs <- fmt.Errorf("create sandbox %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// deleteParallel is how many sandboxes deleteSessions deletes at once.
const deleteParallel = 8

// deleteSessions deletes the non-nil sessions, deleteParallel at a time,
// waits for all and returns every failure, joined.
func deleteSessions(ctx context.Context, c *compute.Client, sessions []*compute.Session) error {
	var idx []int
	for i, s := range sessions {
		if s != nil {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	return parallel(len(idx), min(deleteParallel, len(idx)), func(j int) error {
		i := idx[j]
		if err := c.Delete(ctx, sessions[i]); err != nil {
			return fmt.Errorf("delete sandbox %d: %w", i, err)
		}
		return nil
	})
}

// localDaemonsMemory sums RSS and PSS (from smaps_rollup) of the sessions'
// sandbox-agentd processes: those of this binary whose socket is in a
// session's private directory.
func localDaemonsMemory(agentd string) func(context.Context, []*compute.Session) (string, error) {
	return func(_ context.Context, sessions []*compute.Session) (string, error) {
		m, err := daemonsMemory(agentd, sessions)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%.1f MiB PSS, %.1f MiB RSS (%.2f MiB PSS, %.2f MiB RSS each)",
			float64(m.pssKiB)/1024, float64(m.rssKiB)/1024, float64(m.pssKiB)/1024/float64(m.count), float64(m.rssKiB)/1024/float64(m.count)), nil
	}
}

// daemonMem is the summed memory of a set of daemons, in KiB.
type daemonMem struct {
	count          int
	rssKiB, pssKiB int64
}

// daemonsMemory reads the memory of the sessions' local daemons (see
// localDaemonsMemory); it fails unless it finds one daemon per session.
func daemonsMemory(agentd string, sessions []*compute.Session) (daemonMem, error) {
	var dirs [][]byte
	for _, s := range sessions {
		st, err := s.State()
		if err != nil {
			return daemonMem{}, err
		}
		var ps struct {
			Dir string `json:"dir"`
		}
		if err := json.Unmarshal(st.ProviderState, &ps); err != nil || ps.Dir == "" {
			return daemonMem{}, fmt.Errorf("local provider state %s: %v", st.ProviderState, err)
		}
		dirs = append(dirs, []byte(ps.Dir+"/"))
	}
	var m daemonMem
	err := eachDaemon(agentd, func(cmdline []byte) bool {
		return slices.ContainsFunc(dirs, func(d []byte) bool { return bytes.Contains(cmdline, d) })
	}, func(pid string) {
		rollup, err := os.ReadFile(filepath.Join("/proc", pid, "smaps_rollup"))
		if err != nil {
			return
		}
		m.count++
		m.rssKiB += smapsField(rollup, "Rss")
		m.pssKiB += smapsField(rollup, "Pss")
	})
	if err != nil {
		return m, err
	}
	if m.count != len(sessions) {
		return m, fmt.Errorf("found %d daemons for %d sandboxes", m.count, len(sessions))
	}
	return m, nil
}

// eachDaemon calls f with the pid of every running process of the agentd
// binary whose command line match accepts, leaving out a daemon's child
// caught between fork and exec (which still shows the daemon's command
// line).
func eachDaemon(agentd string, match func(cmdline []byte) bool, f func(pid string)) error {
	if abs, err := filepath.Abs(agentd); err == nil {
		agentd = abs // the provider starts the daemon by its absolute path
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	parents := map[string]string{} // matching pid -> its parent's pid
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if string(argv0) != agentd || !match(cmdline) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so after the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
			if fs := strings.Fields(string(stat[i+1:])); len(fs) > 1 {
				parents[e.Name()] = fs[1]
			}
		}
	}
	for pid, ppid := range parents {
		if _, forked := parents[ppid]; !forked {
			f(pid)
		}
	}
	return nil
}

func smapsField(rollup []byte, key string) int64 {
	for _, line := range strings.Split(string(rollup), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && k == key {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// dockerMemory sums the containers' memory usage from their cgroup stats,
// as `docker stats` computes it (usage minus inactive file cache).
func dockerMemory(ctx context.Context, sessions []*compute.Session) (string, error) {
	api, err := dockerclient.New(dockerclient.FromEnv)
	if err != nil {
		return "", err
	}
	defer api.Close()
	var total uint64
	for _, s := range sessions {
		st, err := s.State()
		if err != nil {
			return "", err
		}
		ds, err := docker.DecodeState(st.ProviderState)
		if err != nil {
			return "", err
		}
		resp, err := api.ContainerStats(ctx, ds.ContainerID, dockerclient.ContainerStatsOptions{})
		if err != nil {
			return "", fmt.Errorf("stats of %s: %w", ds.Name, err)
		}
		var stats container.StatsResponse
		err = json.NewDecoder(resp.Body).Decode(&stats)
		resp.Body.Close()
		if err != nil {
			return "", fmt.Errorf("stats of %s: %w", ds.Name, err)
		}
		used := stats.MemoryStats.Usage
		for _, k := range []string{"inactive_file", "total_inactive_file"} {
			if v, ok := stats.MemoryStats.Stats[k]; ok && v < used {
				used -= v
				break
			}
		}
		total += used
	}
	return fmt.Sprintf("%.1f MiB (cgroup usage minus inactive file cache; %.2f MiB each)",
		float64(total)/(1<<20), float64(total)/(1<<20)/float64(len(sessions))), nil
}

// benchSandboxes is every lifecycle figure.
func benchSandboxes(ctx context.Context, cfg config) ([]row, error) {
	agentd := filepath.Join(cfg.binDir, local.AgentdBinary)
	dockerSkip := dockerStatus(ctx)
	fmt.Fprintln(os.Stderr, "create-to-first-exec ...")
	rows, err := benchStartup(ctx, agentd, cfg.startupRounds, dockerSkip)
	if err != nil {
		return nil, err
	}
	if cfg.sandboxes > 0 {
		fmt.Fprintf(os.Stderr, "%d local sandboxes at once ...\n", cfg.sandboxes)
		r, err := benchMany(ctx, localKind(agentd, local.IsolationNone), cfg.sandboxes, localDaemonsMemory(agentd))
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	if cfg.dockerSandboxes > 0 {
		if dockerSkip != "" {
			return append(rows, row{fmt.Sprintf("%d docker sandboxes alive at once", cfg.dockerSandboxes), dockerSkip, "", "", ""}), nil
		}
		fmt.Fprintf(os.Stderr, "%d docker sandboxes at once ...\n", cfg.dockerSandboxes)
		r, err := benchMany(ctx, dockerKind(), cfg.dockerSandboxes, dockerMemory)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

func ms1(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
