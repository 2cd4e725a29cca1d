// Command benchreport measures sandbox-agentd against baselines taken in the
// same run on the same machine, and prints (and writes) a Markdown table of
// figures and ratios. It is what `make bench` runs. It never fails on a
// number: targets are shown for the reader, not enforced.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

type config struct {
	binDir     string
	out        string
	execN      int
	streamSize int64
	fileSize   int64
	patchN     int
	treeFiles  int
	treeBytes  int64
	// Sandbox lifecycle figures (sandboxes.go).
	startupRounds   int
	sandboxes       int
	dockerSandboxes int
	// Harness figures (harness.go).
	toolCalls int
	scaling   []int
	// S3 snapshot store figure (snapshots.go); zero files skip it.
	snapshotFiles int
	snapshotBytes int64
	onlySnapshots bool
	// Mount figure (mounts.go); zero objects skip it.
	mountObjects int
	mountBytes   int64
	onlyMounts   bool
	// Isolation figures (isolation.go).
	isolationExecs int
	onlyIsolation  bool
	// Pause figures (pause.go); zero rounds skip them.
	pauseRounds int
	pauseSizes  string
	pauseRootFS string
	onlyPause   bool
	// Kubernetes figures (kubernetes.go); zero rounds skip them.
	kubeRounds    int
	kubeSandboxes int
	onlyKube      bool
	// Service figures (serve.go); zero runs skip them.
	serveRuns int
	onlyServe bool
	// serveCalls is how many RunCommand round trips the service
	// figures time (and as many Session.Exec calls beside them).
	serveCalls int
	// Exec over a unix socket and TCP beside grpcfloor (execpath.go).
	onlyExec bool
	// exec_command's round trips beside the old ReadOutput loop
	// (execcommand.go); zero rounds skip it.
	execCommandRounds  int
	execCommandLatency time.Duration
	onlyExecCommand    bool
	// execCommandKube adds the figure over a real Kubernetes port-forward
	// to -only-exec-command (the full bench has it in its Kubernetes
	// section).
	execCommandKube bool
	// Archive and restore only (benchArchive).
	onlyArchive bool
	// Idle figures only: size, idle RSS and working set, package init cost
	// (idle.go).
	onlyIdle bool
	// Memory after a burst (memory.go).
	burstExecs int
	onlyMemory bool
	memoryEnv  string
	memoryArgs string
	// Soak (soak.go); a zero duration skips it.
	soak          time.Duration
	soakSandboxes int
	onlySoak      bool
	// ReadFile and WriteFile beside a socket copy (transfer.go).
	onlyTransfer  bool
	transferBytes int64
}

func main() {
	var cfg config
	flag.StringVar(&cfg.binDir, "bin", "bin", "directory holding the built sandbox-agentd")
	flag.StringVar(&cfg.out, "out", "bench-results.md", "where to write the Markdown table")
	flag.IntVar(&cfg.execN, "exec-n", 500, "exec round trips per side")
	flag.Int64Var(&cfg.streamSize, "stream-bytes", 1<<30, "bytes streamed through the daemon")
	flag.Int64Var(&cfg.fileSize, "file-bytes", 1<<30, "size of the file written and read")
	flag.IntVar(&cfg.patchN, "patch-n", 50, "apply_patch repetitions")
	flag.IntVar(&cfg.treeFiles, "tree-files", 10000, "files in the archived workspace")
	flag.Int64Var(&cfg.treeBytes, "tree-bytes", 200<<20, "bytes in the archived workspace")
	flag.IntVar(&cfg.startupRounds, "startup-rounds", 5, "create-to-first-exec rounds per provider (median)")
	flag.IntVar(&cfg.sandboxes, "sandboxes", 100, "local sandboxes kept alive at once (0: skip)")
	flag.IntVar(&cfg.dockerSandboxes, "docker-sandboxes", 100, "docker sandboxes kept alive at once (0: skip)")
	flag.IntVar(&cfg.toolCalls, "tool-calls", 200, "exec_command tool calls through the runner")
	flag.IntVar(&cfg.snapshotFiles, "snapshot-files", 5000, "files in the workspace snapshotted to the S3 store (0: skip)")
	flag.Int64Var(&cfg.snapshotBytes, "snapshot-bytes", 100<<20, "bytes in the workspace snapshotted to the S3 store")
	flag.BoolVar(&cfg.onlySnapshots, "only-snapshots", false, "measure only the S3 snapshot store figure")
	flag.IntVar(&cfg.mountObjects, "mount-objects", 1000, "objects in the bucket prefix mounted from the S3 and GCS servers (0: skip)")
	flag.Int64Var(&cfg.mountBytes, "mount-bytes", 100<<20, "bytes in the mounted bucket prefix")
	flag.BoolVar(&cfg.onlyMounts, "only-mounts", false, "measure only the mount figure")
	flag.IntVar(&cfg.isolationExecs, "isolation-execs", 200, "Execs of /bin/true per isolation (0: skip the isolation figures)")
	flag.BoolVar(&cfg.onlyIsolation, "only-isolation", false, "measure only the isolation figures (plain, bubblewrap, gVisor, Docker)")
	flag.IntVar(&cfg.pauseRounds, "pause-rounds", 3, "pause: gVisor pause/resume rounds per memory size with the image in the page cache, and as many with it evicted (0: skip the pause figures)")
	flag.StringVar(&cfg.pauseSizes, "pause-sizes", "64,512,2048", "pause: MiB of memory the sandbox's process touches, comma-separated")
	flag.StringVar(&cfg.pauseRootFS, "pause-rootfs", "", "pause: the sandbox root file system (default: BIN/rootfs from `make rootfs`, else one built by images/build.sh rootfs)")
	flag.BoolVar(&cfg.onlyPause, "only-pause", false, "measure only the pause figures (needs root, runsc, busybox-static)")
	flag.IntVar(&cfg.kubeRounds, "kube-rounds", 20, "kubernetes: creates to first exec per figure: warm claims, cold Pods (and as many with the token Secret after the Pod, the order before issue #32), docker (0: skip the kubernetes figures)")
	flag.IntVar(&cfg.kubeSandboxes, "kube-sandboxes", 200, "kubernetes: sandboxes created, used and deleted through the API server (0: skip)")
	flag.BoolVar(&cfg.onlyKube, "only-kubernetes", false, "measure only the kubernetes figures")
	flag.BoolVar(&cfg.onlyArchive, "only-archive", false, "measure only archive and restore of the -tree-files / -tree-bytes workspace beside tar --zstd")
	flag.BoolVar(&cfg.onlyExec, "only-exec", false, "measure only the exec path over a unix socket and TCP (with grpcfloor)")
	flag.IntVar(&cfg.execCommandRounds, "exec-command-rounds", 10, "exec_command of a command printing 50 lines 20 ms apart: rounds per side, beside the old ReadOutput loop, here and over port-forward in the kubernetes section (0: skip)")
	flag.DurationVar(&cfg.execCommandLatency, "exec-command-latency", 2*time.Millisecond, "exec_command figure: latency a proxy adds each way for its port-forward stand-in (0: skip that part)")
	flag.BoolVar(&cfg.onlyExecCommand, "only-exec-command", false, "measure only exec_command's round trips and wall time beside the old ReadOutput loop, over a unix socket and through a latency proxy")
	flag.BoolVar(&cfg.execCommandKube, "exec-command-kube", false, "with -only-exec-command: also over a real Kubernetes port-forward (starts the test cluster; needs root, containerd and Docker's bulkhead/sandbox:dev); the full bench measures it in its kubernetes section")
	flag.BoolVar(&cfg.onlyIdle, "only-idle", false, "measure only the idle figures beside grpcfloor: binary size, idle RSS, idle working set (clear_refs), package init cost (GODEBUG=inittrace=1)")
	flag.IntVar(&cfg.burstExecs, "burst-execs", 1000, "Execs in the burst before the after-burst RSS reading")
	flag.BoolVar(&cfg.onlyMemory, "only-memory", false, "measure only the daemon's RSS after a burst (and its peak during it)")
	flag.StringVar(&cfg.memoryArgs, "memory-daemon-args", "", "extra flags for the burst's daemon, space-separated (--reclaim-idle=0: without reclaiming)")
	flag.StringVar(&cfg.memoryEnv, "memory-env", "", "extra environment for the burst's daemon, space-separated, whose log then goes to stderr (diagnostics: GODEBUG=gctrace=1,scavtrace=1 GOMEMLIMIT=32MiB)")
	flag.IntVar(&cfg.serveRuns, "serve-runs", 100, "harness serve: concurrent runs followed over SSE (0: skip)")
	flag.BoolVar(&cfg.onlyServe, "only-serve", false, "measure only the harness serve figures")
	flag.IntVar(&cfg.serveCalls, "serve-calls", 200, "harness serve: RunCommand round trips timed beside as many Session.Exec calls through the library")
	flag.DurationVar(&cfg.soak, "soak", 5*time.Minute, "soak: how long the sandboxes run their load (0: skip)")
	flag.IntVar(&cfg.soakSandboxes, "soak-sandboxes", 100, "soak: local sandboxes, each running an Exec a second and a 1 MiB WriteFile every 10 s")
	flag.BoolVar(&cfg.onlySoak, "only-soak", false, "measure only the soak")
	flag.BoolVar(&cfg.onlyTransfer, "only-transfer", false, "measure only ReadFile and WriteFile over a unix socket and TCP beside a plain socket copy")
	flag.Int64Var(&cfg.transferBytes, "transfer-bytes", 256<<20, "size of the file downloaded and uploaded by -only-transfer")
	scaling := flag.String("scaling", "1,10,50,100", "concurrent sandbox counts of the scaling series (empty: skip)")
	flag.Parse()
	for _, f := range strings.Split(*scaling, ",") {
		if f = strings.TrimSpace(f); f != "" {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "benchreport: -scaling: bad count %q\n", f)
				os.Exit(2)
			}
			cfg.scaling = append(cfg.scaling, n)
		}
	}
	if err := run(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// row is one line of the report.
type row struct {
	figure, value, baseline, ratio, target string
}

func run(ctx context.Context, cfg config) error {
	if cfg.onlyPause {
		r, err := runPause(ctx, cfg)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyTransfer {
		r, err := benchTransfer(ctx, cfg.binDir, cfg.transferBytes)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	agentd := filepath.Join(cfg.binDir, local.AgentdBinary)
	sb, err := local.Start(ctx, local.Options{AgentdPath: agentd}, zap.NewNop())
	if err != nil {
		return err
	}
	defer sb.Close(context.Background())
	c := sb.Client
	var rows []row
	add := func(r ...row) { rows = append(rows, r...) }
	if cfg.onlySnapshots {
		r, err := benchSnapshotStore(ctx, c, sb.Workspace, cfg.snapshotFiles, cfg.snapshotBytes)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyArchive {
		r, err := benchArchive(ctx, c, sb.Workspace, cfg.treeFiles, cfg.treeBytes)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyExec {
		r, err := benchExecPath(ctx, cfg.binDir, cfg.execN)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyExecCommand {
		r, err := benchExecCommand(ctx, cfg.binDir, max(cfg.execCommandRounds, 1), cfg.execCommandLatency)
		if err != nil {
			return err
		}
		if cfg.execCommandKube {
			k, err := benchExecCommandKube(ctx, max(cfg.execCommandRounds, 1))
			if err != nil {
				return err
			}
			r = append(r, k...)
		}
		return report(cfg, r)
	}
	if cfg.onlyMounts {
		r, err := benchMounts(ctx, agentd, cfg.mountObjects, cfg.mountBytes)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyIsolation {
		r, err := benchIsolation(ctx, cfg)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyServe {
		var r []row
		if cfg.serveRuns > 0 {
			var err error
			if r, err = benchServe(ctx, cfg.binDir, cfg.serveRuns); err != nil {
				return err
			}
		}
		s, err := benchServeSandboxes(ctx, cfg.binDir, cfg.startupRounds, cfg.serveCalls)
		if err != nil {
			return err
		}
		return report(cfg, append(r, s...))
	}
	if cfg.onlySoak {
		r, err := benchSoak(ctx, soakConfig{agentd: agentd, sandboxes: cfg.soakSandboxes, duration: cfg.soak})
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	if cfg.onlyKube {
		r, err := benchKubernetes(ctx, cfg.kubeRounds, cfg.kubeSandboxes, cfg.execCommandRounds)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}
	burst := burstConfig{agentd: agentd, streamSize: cfg.streamSize, fileSize: cfg.fileSize, execN: cfg.burstExecs, env: strings.Fields(cfg.memoryEnv), args: strings.Fields(cfg.memoryArgs)}
	if cfg.onlyMemory {
		r, err := benchMemoryBurst(ctx, burst)
		if err != nil {
			return err
		}
		return report(cfg, r)
	}

	// The floor: grpc-go alone, serving health and reflection, built with
	// the daemon's flags and with a client connected, as the daemon is.
	fl, ferr := startFloor(ctx, cfg.binDir)
	if ferr == nil {
		defer fl.close()
	} else {
		fmt.Fprintln(os.Stderr, "benchreport: no grpc-go floor:", ferr)
		fl = nil
	}
	r, err := benchIdle(ctx, cfg.binDir, agentd, sb.PID(), fl)
	if err != nil {
		return err
	}
	add(r...)
	if cfg.onlyIdle {
		return report(cfg, rows)
	}

	fmt.Fprintln(os.Stderr, "exec round trips ...")
	r, err = benchExec(ctx, c, cfg.execN, fl)
	if err != nil {
		return err
	}
	add(r...)
	fmt.Fprintln(os.Stderr, "exec over a unix socket and TCP ...")
	if r, err = benchExecPath(ctx, cfg.binDir, cfg.execN); err != nil {
		return err
	}
	add(r...)
	if cfg.execCommandRounds > 0 {
		fmt.Fprintln(os.Stderr, "exec_command round trips ...")
		if r, err = benchExecCommand(ctx, cfg.binDir, cfg.execCommandRounds, cfg.execCommandLatency); err != nil {
			return err
		}
		add(r...)
	}
	fmt.Fprintln(os.Stderr, "ReadFile and WriteFile over a unix socket and TCP beside a socket copy ...")
	if r, err = benchTransfer(ctx, cfg.binDir, cfg.transferBytes); err != nil {
		return err
	}
	add(r...)
	fmt.Fprintln(os.Stderr, "streaming ...")
	r, err = benchStream(ctx, c, cfg.streamSize)
	if err != nil {
		return err
	}
	add(r...)
	fmt.Fprintln(os.Stderr, "file transfer ...")
	r, err = benchFiles(ctx, c, sb.Workspace, cfg.fileSize)
	if err != nil {
		return err
	}
	add(r...)
	fmt.Fprintln(os.Stderr, "archive and restore ...")
	r, err = benchArchive(ctx, c, sb.Workspace, cfg.treeFiles, cfg.treeBytes)
	if err != nil {
		return err
	}
	add(r...)
	fmt.Fprintln(os.Stderr, "apply_patch ...")
	r, err = benchPatch(ctx, c, sb.Workspace, cfg.patchN)
	if err != nil {
		return err
	}
	add(r...)
	busy, err := readRSS(sb.PID())
	if err != nil {
		return err
	}
	add(row{"sandbox-agentd RSS after the runs above", busy.String(), "", "", "bounded"})
	fmt.Fprintln(os.Stderr, "memory after a burst ...")
	r, err = benchMemoryBurst(ctx, burst)
	if err != nil {
		return err
	}
	add(r...)
	if cfg.snapshotFiles > 0 {
		fmt.Fprintln(os.Stderr, "S3 snapshot store ...")
		r, err = benchSnapshotStore(ctx, c, sb.Workspace, cfg.snapshotFiles, cfg.snapshotBytes)
		if err != nil {
			return err
		}
		add(r...)
	}
	if cfg.mountObjects > 0 {
		fmt.Fprintln(os.Stderr, "mounts ...")
		r, err = benchMounts(ctx, agentd, cfg.mountObjects, cfg.mountBytes)
		if err != nil {
			return err
		}
		add(r...)
	}
	r, err = benchSandboxes(ctx, cfg)
	if err != nil {
		return err
	}
	add(r...)
	if cfg.soak > 0 && cfg.soakSandboxes > 0 {
		fmt.Fprintln(os.Stderr, "soak ...")
		r, err = benchSoak(ctx, soakConfig{agentd: agentd, sandboxes: cfg.soakSandboxes, duration: cfg.soak})
		if err != nil {
			return err
		}
		add(r...)
	}
	if cfg.isolationExecs > 0 {
		fmt.Fprintln(os.Stderr, "isolation ...")
		r, err = benchIsolation(ctx, cfg)
		if err != nil {
			return err
		}
		add(r...)
	}
	if cfg.pauseRounds > 0 {
		fmt.Fprintln(os.Stderr, "pause ...")
		r, err = runPause(ctx, cfg)
		if err != nil {
			return err
		}
		add(r...)
	}
	if cfg.kubeRounds > 0 {
		fmt.Fprintln(os.Stderr, "kubernetes ...")
		r, err = benchKubernetes(ctx, cfg.kubeRounds, cfg.kubeSandboxes, cfg.execCommandRounds)
		if err != nil {
			return err
		}
		add(r...)
	}
	r, err = benchHarness(ctx, cfg, agentd)
	if err != nil {
		return err
	}
	add(r...)
	if cfg.serveRuns > 0 {
		fmt.Fprintln(os.Stderr, "harness serve ...")
		r, err = benchServe(ctx, cfg.binDir, cfg.serveRuns)
		if err != nil {
			return err
		}
		add(r...)
		r, err = benchServeSandboxes(ctx, cfg.binDir, cfg.startupRounds, cfg.serveCalls)
		if err != nil {
			return err
		}
		add(r...)
	}
	return report(cfg, rows)
}

// report prints the table of rows and writes it to cfg.out.
func report(cfg config, rows []row) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Measured %s on %s (%d CPUs, %s/%s, %s). Ratios are bulkhead / baseline, same run.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	b.WriteString("| figure | bulkhead | baseline (same run) | ratio | target |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.figure, r.value, r.baseline, r.ratio, r.target)
	}
	fmt.Print(b.String())
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// benchExec times Exec of /bin/true through the daemon (as the daemon's
// user, and as a run_as user when the host has "nobody") beside os/exec of
// the same, interleaved, and the transport's share: a unary call to the
// daemon, and one to grpcfloor (fl, when running), each right after an
// os/exec.
func benchExec(ctx context.Context, c *agentclient.Client, n int, fl *floor) ([]row, error) {
	const runAs = "nobody"
	withUser := hasUser(runAs)
	daemon := make([]time.Duration, 0, n)
	direct := make([]time.Duration, 0, n)
	unary := make([]time.Duration, 0, n)
	var asUser, floorRT []time.Duration
	for i := 0; i < n+20; i++ { // interleave, first 20 are warm-up
		start := time.Now()
		res, err := c.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"/bin/true"}}, agentclient.ExecOptions{}, nil)
		d := time.Since(start)
		if err != nil {
			return nil, err
		}
		if res.Exit.ExitCode != 0 {
			return nil, fmt.Errorf("/bin/true exited %d", res.Exit.ExitCode)
		}
		start = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return nil, err
		}
		e := time.Since(start)
		// The transport's share: a unary call that does next to nothing
		// in the daemon, right after a process ran (as cold as the Exec
		// found the daemon).
		start = time.Now()
		if _, err := c.Stat(ctx, ".", agentclient.StatOptions{}); err != nil {
			return nil, err
		}
		u := time.Since(start)
		if i >= 20 {
			daemon, direct, unary = append(daemon, d), append(direct, e), append(unary, u)
		}
		if !withUser && fl == nil {
			continue
		}
		var du time.Duration
		if withUser {
			start = time.Now()
			res, err := c.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"/bin/true"}, User: runAs}, agentclient.ExecOptions{}, nil)
			du = time.Since(start)
			if err != nil {
				return nil, fmt.Errorf("exec as %s: %w", runAs, err)
			}
			if res.Exit.ExitCode != 0 {
				return nil, fmt.Errorf("/bin/true as %s exited %d", runAs, res.Exit.ExitCode)
			}
		}
		start = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return nil, err
		}
		e = time.Since(start)
		var f time.Duration
		if fl != nil {
			var err error
			if f, err = fl.roundTrip(ctx); err != nil {
				return nil, fmt.Errorf("grpcfloor: %w", err)
			}
		}
		if i >= 20 {
			direct = append(direct, e)
			if withUser {
				asUser = append(asUser, du)
			}
			if fl != nil {
				floorRT = append(floorRT, f)
			}
		}
	}
	dp50, dp99 := percentiles(daemon)
	ep50, ep99 := percentiles(direct)
	up50, _ := percentiles(unary)
	rows := []row{
		{"Exec /bin/true round trip, p50", us(dp50), us(ep50) + " (os/exec)", ratio(dp50, ep50), "<= 1.3x"},
		{"Exec /bin/true round trip, p99", us(dp99), us(ep99) + " (os/exec)", ratio(dp99, ep99), ""},
	}
	if withUser {
		a50, _ := percentiles(asUser)
		rows = append(rows, row{"Exec /bin/true as a run_as user (" + runAs + "), p50", us(a50), us(ep50) + " (os/exec)", ratio(a50, ep50), ""})
	}
	transport := row{"of which the gRPC round trip itself: a unary Stat between the same processes right after an os/exec, p50", us(up50), "", "", ""}
	if fl != nil {
		f50, _ := percentiles(floorRT)
		transport.baseline, transport.ratio = us(f50)+" (grpcfloor health check, right after an os/exec)", ratio(up50, f50)
	}
	return append(rows, transport), nil
}

func benchStream(ctx context.Context, c *agentclient.Client, size int64) ([]row, error) {
	cmd := "head -c " + strconv.FormatInt(size, 10) + " /dev/zero"
	start := time.Now()
	st, err := c.Start(ctx, agentclient.ProcessSpec{Command: cmd}, agentclient.StartOptions{})
	if err != nil {
		return nil, err
	}
	var got, dropped int64
	if _, err := c.Follow(ctx, st.Process.ProcessID, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
		for _, ch := range m.Chunks {
			got += int64(len(ch.Data))
		}
		dropped += m.DroppedBytes
		return nil
	}); err != nil {
		return nil, err
	}
	dd := time.Since(start)

	start = time.Now()
	p := exec.Command("sh", "-c", cmd)
	out, err := p.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.Start(); err != nil {
		return nil, err
	}
	n, err := io.CopyBuffer(io.Discard, out, make([]byte, 1<<20))
	if err != nil {
		return nil, err
	}
	if err := p.Wait(); err != nil {
		return nil, err
	}
	pd := time.Since(start)
	dRate, pRate := rate(got, dd), rate(n, pd)
	note := ""
	if dropped > 0 {
		note = fmt.Sprintf(" (%s dropped by the ring: reader slower than writer)", mib(dropped))
	}
	return []row{{
		"stream `head -c " + mib(size) + " /dev/zero` output to the client", gibps(dRate) + note, gibps(pRate) + " (plain pipe)",
		fmt.Sprintf("%.2fx", dRate/pRate), ">= 1 GiB/s",
	}}, nil
}

func benchFiles(ctx context.Context, c *agentclient.Client, workspace string, size int64) ([]row, error) {
	dir, err := os.MkdirTemp(filepath.Dir(workspace), "bench-files-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src.bin")
	if err := makeFile(src, size); err != nil {
		return nil, err
	}
	// Each transfer is timed next to a cp of the same source file to the
	// same disk, both starting after a sync so neither pays for the
	// other's writeback, the first of the two alternating between rounds
	// (the first reader of a file may find it evicted from the page cache).
	// WriteFile fsyncs before it answers, so its baseline is cp followed by
	// an fsync of the copy; ReadFile's destination is not synced, and
	// neither is its baseline's. Note that cp copies inside the kernel
	// (copy_file_range): with everything cached it runs at memory speed,
	// which no transfer through a socket reaches.
	cp := func(from string, durable bool) (time.Duration, error) {
		syscall.Sync()
		dst := filepath.Join(dir, "cp.bin")
		defer os.Remove(dst)
		start := time.Now()
		if out, err := exec.Command("cp", from, dst).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("cp: %v: %s", err, out)
		}
		if durable {
			f, err := os.Open(dst)
			if err != nil {
				return 0, err
			}
			err = f.Sync()
			f.Close()
			if err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	write := func() (time.Duration, error) {
		f, err := os.Open(src)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		syscall.Sync()
		start := time.Now()
		if _, err := c.WriteFile(ctx, "big.bin", agentclient.WriteFileOptions{}, f); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	read := func() (time.Duration, error) {
		dst, err := os.Create(filepath.Join(dir, "read.bin"))
		if err != nil {
			return 0, err
		}
		defer os.Remove(dst.Name())
		syscall.Sync()
		start := time.Now()
		_, err = c.ReadFile(ctx, "big.bin", agentclient.ReadFileOptions{}, dst)
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		return time.Since(start), err
	}
	// Four rounds; the table shows the median of each figure (the VM's
	// disk throughput swings from one gigabyte to the next).
	var cpWrites, writes, cpReads, reads []time.Duration
	for round := 0; round < 4; round++ {
		ours, base, err := timedPair(round, write, func() (time.Duration, error) { return cp(src, true) })
		if err != nil {
			return nil, err
		}
		writes, cpWrites = append(writes, ours), append(cpWrites, base)
		ours, base, err = timedPair(round, read, func() (time.Duration, error) { return cp(filepath.Join(workspace, "big.bin"), false) })
		if err != nil {
			return nil, err
		}
		reads, cpReads = append(reads, ours), append(cpReads, base)
		if err := c.Remove(ctx, "big.bin", agentclient.RemoveOptions{}); err != nil {
			return nil, err
		}
	}
	cpWrite, _ := percentiles(cpWrites)
	writeTime, _ := percentiles(writes)
	cpRead, _ := percentiles(cpReads)
	readTime, _ := percentiles(reads)
	wRate, rRate := rate(size, writeTime), rate(size, readTime)
	wBase, rBase := rate(size, cpWrite), rate(size, cpRead)
	return []row{
		{"WriteFile " + mib(size) + " into the workspace (fsynced), median of 4", gibps(wRate), gibps(wBase) + " (cp + fsync, same disk)", fmt.Sprintf("%.2fx", wRate/wBase), ">= 0.8x cp"},
		{"ReadFile " + mib(size) + " out of the workspace, median of 4", gibps(rRate), gibps(rBase) + " (cp of the same file, same disk)", fmt.Sprintf("%.2fx", rRate/rBase), ">= 0.8x cp"},
	}, nil
}

// timedPair times ours and the baseline doing the same job, the first of
// the two alternating with round.
func timedPair(round int, ours, baseline func() (time.Duration, error)) (o, b time.Duration, err error) {
	if round%2 == 0 {
		if b, err = baseline(); err == nil {
			o, err = ours()
		}
	} else if o, err = ours(); err == nil {
		b, err = baseline()
	}
	return o, b, err
}

func benchPatch(ctx context.Context, c *agentclient.Client, workspace string, n int) ([]row, error) {
	var file strings.Builder
	for i := 0; i < 10000; i++ {
		fmt.Fprintf(&file, "line %d: the quick brown fox jumps over the lazy dog\n", i)
	}
	if _, err := c.WriteFile(ctx, "big.txt", agentclient.WriteFileOptions{}, strings.NewReader(file.String())); err != nil {
		return nil, err
	}
	forward, backward := v4aPatches()
	uniForward, uniBackward := unifiedPatches()
	dir, err := os.MkdirTemp(filepath.Dir(workspace), "bench-patch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	local := filepath.Join(dir, "big.txt")
	if err := os.WriteFile(local, []byte(file.String()), 0o644); err != nil {
		return nil, err
	}
	var ours, gnu []time.Duration
	for i := 0; i < n; i++ {
		p, u := forward, uniForward
		if i%2 == 1 {
			p, u = backward, uniBackward
		}
		start := time.Now()
		if _, err := c.ApplyPatch(ctx, p, agentclient.ApplyPatchOptions{}); err != nil {
			return nil, fmt.Errorf("apply_patch round %d: %w", i, err)
		}
		ours = append(ours, time.Since(start))
		start = time.Now()
		cmd := exec.Command("patch", "-s", local)
		cmd.Stdin = strings.NewReader(u)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("patch: %v: %s", err, out)
		}
		gnu = append(gnu, time.Since(start))
	}
	o50, _ := percentiles(ours)
	g50, _ := percentiles(gnu)
	return []row{{"ApplyPatch, 3 hunks on a 10,000-line file, p50", us(o50), us(g50) + " (GNU patch)", ratio(o50, g50), ""}}, nil
}

// benchArchive archives a workspace of files files / total bytes through the
// daemon and restores it, beside `tar --zstd` creating and extracting the
// same tree.
func benchArchive(ctx context.Context, c *agentclient.Client, workspace string, files int, total int64) ([]row, error) {
	if _, err := exec.LookPath("zstd"); err != nil {
		return []row{{"Archive / Restore", "skipped: zstd (for the tar baseline) is not installed", "", "", ""}}, nil
	}
	tree := filepath.Join(workspace, "tree")
	per := total / int64(files)
	// Text that compresses about as well as source code (2-4x), different
	// in every file: repeated content would compress a thousand-fold and
	// trip Restore's expansion-ratio limit as a zstd bomb would.
	rng := rand.New(rand.NewPCG(1, 2))
	if err := writeBenchFiles(tree, files, int(per), rng, func(int) bool { return true }); err != nil {
		return nil, err
	}
	out, err := os.MkdirTemp(filepath.Dir(workspace), "bench-archive-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(out)
	snap := filepath.Join(out, "snap.tar.zst")
	f, err := os.Create(snap)
	if err != nil {
		return nil, err
	}
	syscall.Sync()
	start := time.Now()
	_, err = c.Archive(ctx, agentclient.ArchiveOptions{}, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	archiveTime := time.Since(start)

	tarball := filepath.Join(out, "tar.tar.zst")
	syscall.Sync()
	start = time.Now()
	if b, err := exec.Command("tar", "--zstd", "-cf", tarball, "-C", workspace, ".").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("tar create: %v: %s", err, b)
	}
	tarCreate := time.Since(start)

	// Restore is timed twice beside tar doing the same job: into an empty
	// workspace (a snapshot brought back in a fresh sandbox) against
	// `tar -x` into an empty directory, and over a workspace that already
	// holds the tree (every file replaced) against `tar -x` over an
	// extracted copy of it. Four rounds each, the first of each pair
	// alternating (deleting a tree leaves the disk busy with discards and
	// journal work for whichever runs next); the table shows medians.
	restore := func() (time.Duration, error) {
		f, err := os.Open(snap)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		syscall.Sync()
		start := time.Now()
		if _, err := c.Restore(ctx, agentclient.RestoreOptions{}, f); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	untar := func(dir string) (time.Duration, error) {
		syscall.Sync()
		start := time.Now()
		if b, err := exec.Command("tar", "--zstd", "-xf", tarball, "-C", dir).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("tar extract: %v: %s", err, b)
		}
		return time.Since(start), nil
	}
	var freshOurs, freshTar, overOurs, overTar []time.Duration
	for round := 0; round < 4; round++ {
		if err := c.Remove(ctx, "tree", agentclient.RemoveOptions{Recursive: true}); err != nil {
			return nil, err
		}
		extract := filepath.Join(out, fmt.Sprintf("extract%d", round))
		if err := os.Mkdir(extract, 0o755); err != nil {
			return nil, err
		}
		o, t, err := timedPair(round, restore, func() (time.Duration, error) { return untar(extract) })
		if err != nil {
			return nil, err
		}
		freshOurs, freshTar = append(freshOurs, o), append(freshTar, t)
		if o, t, err = timedPair(round, restore, func() (time.Duration, error) { return untar(extract) }); err != nil {
			return nil, err
		}
		overOurs, overTar = append(overOurs, o), append(overTar, t)
		if err := os.RemoveAll(extract); err != nil {
			return nil, err
		}
	}
	_ = c.Remove(ctx, "tree", agentclient.RemoveOptions{Recursive: true})
	fo, _ := percentiles(freshOurs)
	ft, _ := percentiles(freshTar)
	oo, _ := percentiles(overOurs)
	ot, _ := percentiles(overTar)
	what := fmt.Sprintf("%d files / %s", files, mib(total))
	return []row{
		{"Archive (tar+zstd) of " + what, ms(archiveTime), ms(tarCreate) + " (tar --zstd -c)", ratio(archiveTime, tarCreate), "<= 1.2x"},
		{"Restore (safe, atomic swap) of " + what + " into an empty workspace, median of 4", ms(fo), ms(ft) + " (tar --zstd -x into an empty directory)", ratio(fo, ft), "<= 1.2x"},
		{"Restore of the same over a workspace holding the tree (every file replaced), median of 4", ms(oo), ms(ot) + " (tar --zstd -x over an extracted copy)", ratio(oo, ot), "<= 1.2x"},
	}, nil
}

// v4aPatches change three lines across the file and back.
func v4aPatches() (string, string) {
	var f, b strings.Builder
	f.WriteString("*** Begin Patch\n*** Update File: big.txt\n")
	b.WriteString("*** Begin Patch\n*** Update File: big.txt\n")
	for _, n := range []int{100, 5000, 9900} {
		fmt.Fprintf(&f, "@@\n line %d: the quick brown fox jumps over the lazy dog\n-line %d: the quick brown fox jumps over the lazy dog\n+line %d: THE QUICK BROWN FOX\n line %d: the quick brown fox jumps over the lazy dog\n", n-1, n, n, n+1)
		fmt.Fprintf(&b, "@@\n line %d: the quick brown fox jumps over the lazy dog\n-line %d: THE QUICK BROWN FOX\n+line %d: the quick brown fox jumps over the lazy dog\n line %d: the quick brown fox jumps over the lazy dog\n", n-1, n, n, n+1)
	}
	f.WriteString("*** End Patch\n")
	b.WriteString("*** End Patch\n")
	return f.String(), b.String()
}

// unifiedPatches are the same changes as unified diffs for GNU patch.
func unifiedPatches() (string, string) {
	var f, b strings.Builder
	f.WriteString("--- a/big.txt\n+++ b/big.txt\n")
	b.WriteString("--- a/big.txt\n+++ b/big.txt\n")
	for _, n := range []int{100, 5000, 9900} {
		fmt.Fprintf(&f, "@@ -%d,3 +%d,3 @@\n line %d: the quick brown fox jumps over the lazy dog\n-line %d: the quick brown fox jumps over the lazy dog\n+line %d: THE QUICK BROWN FOX\n line %d: the quick brown fox jumps over the lazy dog\n", n, n, n-1, n, n, n+1)
		fmt.Fprintf(&b, "@@ -%d,3 +%d,3 @@\n line %d: the quick brown fox jumps over the lazy dog\n-line %d: THE QUICK BROWN FOX\n+line %d: the quick brown fox jumps over the lazy dog\n line %d: the quick brown fox jumps over the lazy dog\n", n, n, n-1, n, n, n+1)
	}
	return f.String(), b.String()
}

func makeFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	block := bytes.Repeat([]byte("bulkhead benchmark data 0123456789abcdef\n"), (1<<20)/41+1)[:1<<20]
	for written := int64(0); written < size; {
		n := min(int64(len(block)), size-written)
		if _, err := f.Write(block[:n]); err != nil {
			f.Close()
			return err
		}
		written += n
	}
	return f.Close()
}

// rss is a process's resident memory in KiB, split as the kernel reports it.
type rss struct{ total, anon, file int64 }

func (r rss) String() string {
	return fmt.Sprintf("%.1f MiB (%.1f + %.1f)", float64(r.total)/1024, float64(r.anon)/1024, float64(r.file)/1024)
}

func readRSS(pid int) (rss, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return rss{}, err
	}
	var r rss
	for _, line := range strings.Split(string(b), "\n") {
		key, v, ok := strings.Cut(line, ":")
		if !ok || len(strings.Fields(v)) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		switch key {
		case "VmRSS":
			r.total = n
		case "RssAnon":
			r.anon = n
		case "RssFile":
			r.file = n
		}
	}
	if r.total == 0 {
		return r, fmt.Errorf("no VmRSS for pid %d", pid)
	}
	return r, nil
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}

func rate(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() }
func gibps(r float64) string                { return fmt.Sprintf("%.2f GiB/s", r/(1<<30)) }
func mib(n int64) string                    { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
func us(d time.Duration) string             { return fmt.Sprintf("%d µs", d.Microseconds()) }
func ms(d time.Duration) string             { return fmt.Sprintf("%d ms", d.Milliseconds()) }
func ratio(a, b time.Duration) string       { return fmt.Sprintf("%.2fx", float64(a)/float64(b)) }
